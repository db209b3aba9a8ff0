"""Writing to a session (R5, R7).

Seq assignment and the durable write are one critical section per session in this process.
Across processes, the store's expected-version check detects interleaving: on a conflict the
writer re-reads; if only commutative events landed (an approval, an inbox entry, a policy or
model change, a title, a cancel request) it folds them in and retries the command; otherwise a
turn's owner has lost the session and stops without writing. The same holds for what a read
folded in (every read catches up, R30): the owner checks what landed since its own last append
before it appends again. Event ids are fixed before the
first attempt inside the store call, so a retry after an unknown outcome never duplicates.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar
from uuid import UUID

from terret.domain.catalogue import catalogue
from terret.domain.errors import LostOwnership, WrongExpectedVersion
from terret.domain.events import TurnEnded
from terret.domain.repository import SessionRepository
from terret.domain.session import Session
from terret.domain.store import AppendResult, session_stream

T = TypeVar("T")
V = TypeVar("V")

MAX_ATTEMPTS = 20


class SessionWriter:
    def __init__(self, repository: SessionRepository, *, cache_size: int = 512) -> None:
        self.repository = repository
        # Weak: a session's lock lives while someone holds or waits on it, so a process that
        # writes to every session over weeks does not keep a lock for each.
        self._locks: weakref.WeakValueDictionary[UUID, threading.RLock] = (
            weakref.WeakValueDictionary())
        self._locks_lock = threading.Lock()
        self._cache: _Recent[UUID, Session] = _Recent(cache_size)
        self._appended: _Recent[UUID, int] = _Recent(cache_size)
        """Each session's version after this writer's last append to it. What a read
        (``load``) folded in past it was written elsewhere: a turn's owner checks it before
        its next append, as it checks what a conflict shows it (R5)."""
        self._ended: _Recent[UUID, None] = _Recent(cache_size)
        """The ids of the last ``turn/end`` events this writer appended: the turns this
        process ran to their end, whose upkeep is its own."""

    def ended_here(self, event_id: UUID) -> bool:
        """Whether this writer appended the ``turn/end`` with that id."""
        return event_id in self._ended

    def lock(self, session_id: UUID) -> threading.RLock:
        with self._locks_lock:
            lock = self._locks.get(session_id)
            if lock is None:
                lock = self._locks[session_id] = threading.RLock()
            return lock

    def load(self, session_id: UUID) -> Session:
        """The session with every event the store holds applied (R30): this process's copy,
        caught up with what other processes appended since it last read or wrote (one read of
        the stream's tail, empty when nothing landed)."""
        with self.lock(session_id):
            cached = self._cache.get(session_id)
            if cached is None or cached.pending_events:
                return self._reload(session_id)
            try:
                self.repository.catch_up(cached)
            except Exception:
                self._cache.pop(session_id)  # purged, say: nothing to keep a copy of
                return self._reload(session_id)
            return cached

    refresh = load  # the older name; every read catches up now

    def _own_copy(self, session_id: UUID) -> Session:
        """The turn owner's starting point: its own appends keep this copy current, and a
        conflict tells it something else landed (then only commutative events may be folded)."""
        cached = self._cache.get(session_id)
        if cached is not None and not cached.pending_events:
            return cached
        return self._reload(session_id)

    def _reload(self, session_id: UUID) -> Session:
        session = self.repository.get(session_id)
        self._remember(session)
        return session

    def _remember(self, session: Session) -> None:
        self._cache.put(session.id, session)

    def _note_append(self, session_id: UUID, version: int) -> None:
        self._appended.put(session_id, version)

    def forget(self, session_id: UUID) -> None:
        with self.lock(session_id):
            self._cache.pop(session_id)

    def create(self, session: Session) -> AppendResult:
        with self.lock(session.id):
            result = self.repository.save(session)
            assert result is not None
            self._remember(session)
            self._note_append(session.id, session.version)
            return result

    def execute(self, session_id: UUID, command: Callable[[Session], T], *, owner: bool = False,
                correlation_id: str | None = None) -> tuple[T, AppendResult | None]:
        """Run ``command`` on the session and append what it recorded.

        ``owner=True`` marks the writer that runs the session's turn: it starts from this
        process's copy (its own appends keep it current) and may fold in only commutative
        events on a conflict (R5). Any other writer starts from the store's latest state, so a
        command that would refuse on a stale copy (a cancel while another process's turn runs,
        a verdict on its request) sees what it acts on; on a conflict it re-runs the command on
        the fresh state, which re-validates it.
        """
        with self.lock(session_id):
            session = self._owners_copy(session_id) if owner else self.load(session_id)
            for _attempt in range(MAX_ATTEMPTS):
                base = session.version
                try:
                    value = command(session)
                except BaseException:
                    self._cache.pop(session_id)  # drop half-applied pending events
                    raise
                ended = [e.event_id for e in session.pending_events
                         if isinstance(e, Session.Recorded) and isinstance(e.payload, TurnEnded)]
                try:
                    result = self.repository.save(session, correlation_id=correlation_id)
                except WrongExpectedVersion:
                    self._cache.pop(session_id)
                    if owner:
                        self._check_commutative(session_id, base)
                    session = self._reload(session_id)
                    continue
                except BaseException:
                    self._cache.pop(session_id)
                    raise
                self._remember(session)
                self._note_append(session_id, session.version)
                for event_id in ended:
                    self._ended.put(event_id, None)
                return value, result
        raise LostOwnership(f"session {session_id}: gave up after {MAX_ATTEMPTS} conflicts")

    def _owners_copy(self, session_id: UUID) -> Session:
        """The owner's copy, once what a read folded in since its last append is known to be
        commutative (``LostOwnership`` otherwise)."""
        session = self._own_copy(session_id)
        appended = self._appended.get(session_id)
        if appended is not None and session.version > appended:
            self._check_commutative(session_id, appended)
        return session

    def _check_commutative(self, session_id: UUID, base: int) -> None:
        landed = self.repository.store.read_stream(session_stream(session_id), from_seq=base + 1)
        foreign = [r.wire_name for r in landed if not _commutes(r.wire_name)]
        if foreign:
            raise LostOwnership(
                f"session {session_id} moved on under this writer ({', '.join(foreign)}, not "
                "commutative): another writer took its turn over — another process, or a tool "
                "of the turn appending to its own session an event not marked commutative"
            )


def _commutes(wire_name: str) -> bool:
    """A commutative event's class says so. A wire name this process does not know is an
    extension's it does not load: nothing here reads it (the aggregate and the views pass
    opaque events over), so nothing the running turn relies on changed — stopping the turn
    for it would only drop the result of a call that already ran."""
    cls = catalogue.payload_class(wire_name)
    return cls is None or bool(cls.commutative)


K = TypeVar("K")


class _Recent(Generic[K, V]):
    """The ``size`` most recently used entries, safe to share between threads: the turn and
    wake threads of a serving process each hold only their own session's lock, and an entry
    evicted by one between another's lookup and its reordering raised a ``KeyError`` (a
    traceback per wake once more sessions than ``size`` were loaded at once)."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._entries: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        """The entry, now the most recent; None when there is none."""
        with self._lock:
            value = self._entries.get(key)
            if value is not None:
                self._entries.move_to_end(key)
            return value

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def put(self, key: K, value: V) -> None:
        """Keep ``value`` as the most recent entry, dropping the least recent past the size."""
        with self._lock:
            self._entries[key] = value
            self._entries.move_to_end(key)
            while len(self._entries) > self._size:
                self._entries.popitem(last=False)

    def pop(self, key: K) -> None:
        with self._lock:
            self._entries.pop(key, None)
