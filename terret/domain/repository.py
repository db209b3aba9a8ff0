"""Loading and saving ``Session`` aggregates through the store port.

Loading reads the latest snapshot and replays only the events after it, so a session with
100,000 events loads from one snapshot plus at most ``snapshot_every`` events.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from uuid import UUID

from terret.domain.catalogue import catalogue
from terret.domain.codec import RecordDecoder, decode, encode
from terret.domain.errors import CorruptRecord, SessionExpiring, SessionNotFound
from terret.domain.events import SessionPurged
from terret.domain.session import Session, SessionState
from terret.domain.store import (
    RETENTION_STREAM,
    AppendResult,
    EventStore,
    NewRecord,
    StreamState,
    as_session_id,
    session_stream,
)


class SessionRepository:
    def __init__(self, store: EventStore, *, snapshot_every: int = 200) -> None:
        self.store = store
        self.snapshot_every = snapshot_every

    def exists(self, session_id: UUID | str) -> bool:
        return self.store.stream_version(session_stream(as_session_id(session_id))) > 0

    def get(self, session_id: UUID | str) -> Session:
        """The session (every id form the runtime takes: a UUID, its text, the stream name);
        a text id once loaded a session whose next command failed deep in eventsourcing."""
        session_id = as_session_id(session_id)
        stream = session_stream(session_id)
        snapshot = self.store.read_snapshot(stream)
        if snapshot is not None:
            version, state = snapshot
            try:
                session = Session.restore(session_id, version, SessionState.from_json(state))
            except (ValueError, TypeError):
                session = Session.restore(session_id, 0, SessionState())
        else:
            session = Session.restore(session_id, 0, SessionState())
        try:
            replayed = self.catch_up(session)
        except SessionNotFound:
            if session.version == 0:
                raise
            # A snapshot ahead of the log (the log deleted after it was read): replay the log.
            session = Session.restore(session_id, 0, SessionState())
            replayed = self.catch_up(session)
        if session.version == 0:
            raise SessionNotFound(f"no session {session_id}")
        if session.state.created_on is None:  # a snapshot from before it was kept
            first = self.store.read_stream(stream, from_seq=1, limit=1)
            if first:
                session.note_created(first[0].recorded_at)
        if replayed >= self.snapshot_every:
            self.store.write_snapshot(stream, session.version, session.state.to_json())
        return session

    def catch_up(self, session: Session) -> int:
        """Apply the events the store holds after the session's version (reads only that
        tail); returns how many."""
        stream = session_stream(session.id)
        if session.version == 0:
            tail = self.store.read_stream(stream, from_seq=1)
            if tail and tail[0].seq > 1:
                self._refuse_expiring(session.id, tail[0].seq)
        else:
            # Read from the last event this copy holds: finding it there says the log is still
            # the one the copy was read from. A purge by another process deleted it — the
            # copy answered for a session that no longer exists, as an empty one.
            tail = self.store.read_stream(stream, from_seq=session.version)
            if not tail or tail[0].seq != session.version:
                raise SessionNotFound(f"no session {session.id}: its log no longer holds event "
                                      f"{session.version} (purged by another process?)")
            del tail[0]
        for record in tail:
            try:
                event = decode(record)
            except CorruptRecord:
                if catalogue.is_builtin(record.wire_name):
                    raise  # one of the session's own facts: no state past it can be trusted
                # An extension's event its upcaster or validator refuses: the aggregate has
                # no rule about extension events, so it loads past it, as an opaque one.
                event = RecordDecoder.unreadable(record)
            session.replay(event)
        return len(tail)

    def refuse_if_expiring(self, session_id: UUID | str) -> None:
        """``SessionExpiring`` when the store has dropped the start of the session's stream
        after a purge with a max age: what is left is part of a log, not the session's (a
        reader showing it would show a partial log as whole)."""
        session_id = as_session_id(session_id)
        stream = session_stream(session_id)
        first = self.store.read_stream(stream, limit=1)
        if first and first[0].seq > 1:
            self._refuse_expiring(session_id, first[0].seq)
        elif first and self.store.max_age(stream) is not None:
            # Purged to expire, none dropped yet: the views forgot it at the purge, so a
            # reader of them would show it as empty — it is as gone from the purge on.
            self._refuse_expiring(session_id, None)

    def _refuse_expiring(self, session_id: UUID, first_seq: int | None) -> None:
        """``SessionExpiring`` for a stream purged with a max age, whose start the store
        dropped already (``first_seq``: the first left) or not yet; a stream that lost its
        start otherwise is a damaged log, and the replay says so (``CorruptRecord``)."""
        for record in reversed(self.store.read_stream(RETENTION_STREAM)):
            payload = decode(record).payload
            if isinstance(payload, SessionPurged) and payload.session_id == str(session_id) \
                    and payload.max_age_seconds is not None:
                dropped = ("its events expire as they reach that age" if first_seq is None
                           else f"the store has dropped its events before seq {first_seq} "
                                "already, and the rest follow")
                raise SessionExpiring(
                    f"session {session_id} was purged to expire after "
                    f"{payload.max_age_seconds}s: {dropped} (purge it without a max age to "
                    "delete it now)")

    def records_of(self, session: Session, *, correlation_id: str | None = None,
                   causation_id: str | None = None) -> list[NewRecord]:
        """The pending events as records with their ids fixed (R7: a retry reuses them)."""
        events: Sequence[Any] = session.pending_events
        return [
            encode(e.payload, event_id=e.event_id, correlation_id=correlation_id,
                   causation_id=causation_id)
            for e in events
        ]

    def save(self, session: Session, *, correlation_id: str | None = None,
             causation_id: str | None = None) -> AppendResult | None:
        """Append the pending events with the version the session was loaded at as the
        expected version. On a conflict the pending events stay, so the caller may retry."""
        pending = session.pending_events
        if not pending:
            return None
        records = self.records_of(session, correlation_id=correlation_id,
                                  causation_id=causation_id)
        base = session.version - len(pending)
        expected = StreamState.NO_STREAM if base == 0 else base
        result = self.store.append(session_stream(session.id), records, expected)
        session.collect_events()
        if session.version // self.snapshot_every > base // self.snapshot_every:
            self.store.write_snapshot(
                session_stream(session.id), session.version, session.state.to_json()
            )
        return result
