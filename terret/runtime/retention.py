"""Retention of closed sessions (R27): delete now, or let the store expire the stream
(EventStoreDB ``$maxAge``; a store that cannot expire streams refuses that). Either way the
deletion is recorded in the retention stream."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from uuid import UUID

from terret.domain.codec import encode
from terret.domain.errors import (
    ExpiryUnsupported,
    InvalidPayload,
    RuleViolation,
    SessionExpiring,
)
from terret.domain.events import Actor, SessionPurged, reason_problem
from terret.domain.repository import SessionRepository
from terret.domain.session import Session
from terret.domain.store import RETENTION_STREAM, EventStore, StreamState, session_stream


def refuse_purge(load: Callable[[], Session], store: EventStore, max_age: int | None) -> None:
    """What a purge refuses, checked before anything is written (and before the CLI asks):
    a session not closed, an expiry on a store that does not expire streams itself. A session
    expiring already (purged with a max age, its oldest events gone) may be deleted now."""
    try:
        session = load()
    except SessionExpiring:
        if max_age is None:
            return
        raise
    if not session.closed:
        raise RuleViolation(f"session {session.id} is not closed; close it first")
    if max_age is not None and not store.native_expiry:
        # Recorded, the purge would make the views forget a session whose events stay for good.
        raise ExpiryUnsupported(f"{store.describe()} does not expire streams itself: purge "
                                "without --max-age (max_age=None in code) when the session is "
                                "to go")


def purge_session(repository: SessionRepository, session_id: UUID, *, by: Actor,
                  reason: str | None = None, max_age: int | None = None) -> None:
    store = repository.store
    problem = reason_problem(reason)
    if problem is not None:
        raise InvalidPayload(SessionPurged.wire_name, "reason", problem)
    refuse_purge(partial(repository.get, session_id), store, max_age)
    record = encode(SessionPurged(session_id=str(session_id), reason=reason, by=by,
                                  max_age_seconds=max_age))
    store.append(RETENTION_STREAM, [record], StreamState.ANY)
    if max_age is not None:
        store.set_max_age(session_stream(session_id), max_age)
    else:
        store.delete_stream(session_stream(session_id))
