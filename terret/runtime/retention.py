"""Retention of closed sessions (R27): delete now, or let the store expire the stream
(EventStoreDB ``$maxAge``; a store that cannot expire streams refuses that). Either way the
deletion is recorded in the retention stream."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from functools import partial
from typing import TYPE_CHECKING
from uuid import UUID

from terret.domain.codec import RecordedEvent, decode, encode
from terret.domain.errors import (
    CorruptRecord,
    ExpiryUnsupported,
    InvalidPayload,
    RuleViolation,
    SessionExpiring,
)
from terret.domain.events import Actor, SessionPurged, reason_problem
from terret.domain.repository import SessionRepository
from terret.domain.session import Session
from terret.domain.store import RETENTION_STREAM, EventStore, StreamState, session_stream

if TYPE_CHECKING:
    from terret.projections.sessions import PurgeRecord
    from terret.projections.views import Views


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
    if not _recorded_lately(store, session_id, max_age):
        record = encode(SessionPurged(session_id=str(session_id), reason=reason, by=by,
                                      max_age_seconds=max_age))
        store.append(RETENTION_STREAM, [record], StreamState.ANY)
    # A kill here leaves the purge recorded and the log in the store (the views forgot it,
    # readers say PurgeUnfinished): a serving process that hears of the purge finishes it,
    # and so does running this again.
    finish_purge(store, session_id, max_age)


def finish_purge(store: EventStore, session_id: UUID, max_age: int | None) -> bool:
    """Carry out a recorded purge (idempotent): delete the session's stream, or give it its max
    age. Whether there was anything left to do."""
    stream = session_stream(session_id)
    if store.stream_version(stream) == 0:
        return False
    if max_age is not None:
        if store.max_age(stream) == max_age:
            return False
        store.set_max_age(stream, max_age)
    else:
        store.delete_stream(stream)
    return True


RECENT = 200
"""How many of the retention stream's last records a purge looks through for its own, recorded
by a run of it that stopped before the deletion (run again, it does not record it twice)."""


def _recorded_lately(store: EventStore, session_id: UUID, max_age: int | None) -> bool:
    return any(p.max_age_seconds == max_age for _, p in _latest_purges(store, session_id))


def purge_on_record(store: EventStore, session_id: UUID, views: Views | None
                    ) -> PurgeRecord | None:
    """The session's purge, read without catching the views up: in ``views`` as far as they
    have read (every purge, however old), else among the retention stream's ``RECENT`` latest
    records (one the views have not read yet) — for a reader of the log (``log``, ``budget
    show``) or an error path (``create_session``), which must not wait on the views."""
    from terret.projections.sessions import PurgeRecord

    if views is not None:
        try:
            found = views.purge_of(session_id)
        except sqlite3.Error:  # views that hold no purges yet (or cannot be read): the log
            found = None
        if found is not None:
            return found
    for event, p in _latest_purges(store, session_id):
        return PurgeRecord.of(event, p)
    return None


def _latest_purges(store: EventStore, session_id: UUID
                   ) -> Iterator[tuple[RecordedEvent, SessionPurged]]:
    """The session's purges among the retention stream's latest records, latest first."""
    sid = str(session_id)
    for record in store.read_stream(RETENTION_STREAM, backwards=True, limit=RECENT):
        if record.wire_name != SessionPurged.wire_name or sid.encode() not in record.data:
            continue  # (the id is in its data: most records are not decoded)
        try:
            event = decode(record)
        except CorruptRecord:
            continue
        if isinstance(event.payload, SessionPurged) and event.payload.session_id == sid:
            yield event, event.payload


def purges_left_undone(store: EventStore, views: Views, limit: int, *, since: float = 0.0
                       ) -> tuple[int, list[PurgeRecord]]:
    """How many purges the views recorded, and those among the ``limit`` latest (recorded at
    ``since`` or later) whose session's log is still in the store — not expiring as it was
    purged to: its process stopped between recording the purge and carrying it out."""
    recorded = views.purges()
    undone = []
    for purge in [p for p in recorded[-limit:] if p.at >= since]:
        stream = session_stream(UUID(purge.id))
        if store.stream_version(stream) > 0 and (
                purge.max_age is None or store.max_age(stream) != purge.max_age):
            undone.append(purge)
    return len(recorded), undone
