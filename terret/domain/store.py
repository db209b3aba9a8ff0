"""The event store port. Adapters: memory, sqlite, eventstoredb (``terret.adapters.stores``).

The port *is* the ``eventsourcing`` library's ``ApplicationRecorder`` (with ``subscribe``),
extended with what Terret needs and the library lacks: appends to a stream at an expected
version, idempotent event ids, reads of one stream in either direction, a catch-up subscription
that also says where it checked (``Checkpoint``) and when it is live (``CaughtUp``), snapshots,
deletion, max age, the store's identity and its worker registry. An adapter implements the
extension (the abstract methods below); the library's interface is implemented here once, on
top of it — so every adapter, and any third-party one, is a recorder an ``eventsourcing``
``Application`` can persist on (``terret.adapters.stores.factory``).

Streams are named ``session-<uuid>``. ``seq`` numbers a stream's events from 1; a stream's
*version* is the seq of its last event (0 when it has none). ``position`` is the global commit
order: it strictly increases in commit order across all streams.

How the library's records map onto the extension: an originator's events are the stream named
``str(originator_id)``; a notification's id is the position; a topic is the wire name and the
state is the data. An ``originator_version`` is the seq — the library's ``Aggregate`` numbers
from 1 as Terret's streams do. A stream whose first event has version 0 (the convention of the
library's KurrentDB package) holds version ``v`` at seq ``v + 1``, and its records say so in
their metadata (``{"originator_version":v}``).
"""

from __future__ import annotations

import enum
import threading
from abc import ABC, abstractmethod
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Self, overload
from uuid import UUID, uuid4

from eventsourcing import persistence as es

from terret.domain.errors import SessionNotFound, WrongExpectedVersion, shown
from terret.domain.workers import MemoryWorkers, WorkerRegistry

MAX_RECORD_BYTES = 1024 * 1024
"""EventStoreDB's limit on one append (its ``--max-append-size`` default), and every store's on
one record, counted by :func:`record_size`: each adapter refuses a larger one before writing."""

SESSION_PREFIX = "session-"
RETENTION_STREAM = "terret-retention"


def session_stream(session_id: UUID) -> str:
    return f"{SESSION_PREFIX}{session_id}"


def as_session_id(session: object) -> UUID:
    """A session id given as a ``UUID``, its string form or its stream name
    (``session-<uuid>``); anything else is refused with ``SessionNotFound``."""
    if isinstance(session, UUID):
        return session
    if isinstance(session, str):
        try:
            return UUID(session.strip().removeprefix(SESSION_PREFIX))
        except ValueError:
            pass
    raise SessionNotFound(f"{shown(session)} is not a session id (a UUID, its string form or "
                          f"{SESSION_PREFIX}<uuid>)")


def session_id_of(stream: str) -> UUID | None:
    if not stream.startswith(SESSION_PREFIX):
        return None
    try:
        return UUID(stream[len(SESSION_PREFIX) :])
    except ValueError:
        return None


class StreamState(enum.Enum):
    """Expected-version sentinels besides an exact version (``NO_STREAM`` equals version 0)."""

    ANY = "any"
    NO_STREAM = "no_stream"


ExpectedVersion = int | StreamState


@dataclass(frozen=True, slots=True)
class NewRecord:
    """An event ready to append. ``event_id`` is fixed before the first attempt (R7)."""

    event_id: UUID
    wire_name: str
    data: bytes
    metadata: bytes = b"{}"


def record_size(record: NewRecord) -> int:
    """A record's size as EventStoreDB counts it against its limit: data + metadata + the wire
    name in UTF-16 (two bytes a character). Every store counts it so, so that a record one
    store takes, every store takes."""
    return len(record.data) + len(record.metadata) + len(record.wire_name.encode("utf-16-le"))


class StoredRecord(NamedTuple):
    """An event as a store holds it. Immutable; a named tuple because every read, every
    subscription and every rebuild makes one per event, and its constructor costs a third of
    a frozen dataclass's."""

    stream: str
    seq: int
    position: int
    event_id: UUID
    wire_name: str
    data: bytes
    metadata: bytes
    recorded_at: float


@dataclass(frozen=True, slots=True)
class AppendResult:
    """``position`` is the last appended event's position, ``version`` the stream's version."""

    position: int
    version: int


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A subscription passed ``position`` without a matching event (idle streams still advance)."""

    position: int


@dataclass(frozen=True, slots=True)
class CaughtUp:
    """The subscription delivered all history and is now live."""

    position: int


SubscriptionItem = StoredRecord | Checkpoint | CaughtUp


class Subscription(ABC, Iterator[SubscriptionItem]):
    """A catch-up subscription: history after the start position, then live events, with no gap
    and no duplicate across the switch. Iterate it; ``stop()`` ends the iteration from any thread.
    """

    def __init__(self) -> None:
        self._stopped = threading.Event()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __iter__(self) -> Self:
        return self

    @property
    def stopped(self) -> bool:
        return self._stopped.is_set()

    @property
    def buffered(self) -> int:
        """Items ready to deliver without waiting. A consumer that batches (the projection
        runner) commits when this reaches 0; a subscription that cannot tell says 0."""
        return 0

    def stop(self) -> None:
        self._stopped.set()

    @abstractmethod
    def __next__(self) -> SubscriptionItem: ...


# --- consumer groups (the port's types; terret.domain.groups says what they are for) ------------


class GroupMessage(ABC):
    """One event delivered to this member of the group. Settle it once: ``ack`` when handled
    (the group forgets it), ``retry`` to have it delivered again (to this member or, if it
    left, another)."""

    record: StoredRecord

    @abstractmethod
    def ack(self) -> None: ...

    @abstractmethod
    def retry(self, reason: str) -> None: ...


class GroupReader(ABC, Iterator[GroupMessage]):
    """This process's membership of a consumer group: iterate it for the events the group gives
    this member; ``stop()`` (from any thread) leaves the group and ends the iteration. A lost
    connection is re-established inside: the group redelivers what was not settled."""

    def __iter__(self) -> GroupReader:
        return self

    @abstractmethod
    def __next__(self) -> GroupMessage: ...

    @abstractmethod
    def stop(self) -> None: ...


class EventStore(es.ApplicationRecorder):
    """The port every store adapter implements (the abstract methods: Terret's extension);
    ``terret.testing.store_contract`` holds its contract suite, and the library's
    ``ApplicationRecorderTestCase`` runs against each adapter as well."""

    max_record_bytes: int = MAX_RECORD_BYTES
    """The most one record may take (:func:`record_size`): larger ones are refused with
    ``PayloadTooLarge`` before anything is written."""
    max_append_bytes: int | None = None
    """The most one append may take, all its records counted: None where only each record is
    bounded (SQLite, memory); EventStoreDB's server bounds a whole append (1 MiB by default)."""

    @abstractmethod
    def append(
        self, stream: str, records: Sequence[NewRecord], expected_version: ExpectedVersion
    ) -> AppendResult:
        """Append atomically. Raises ``WrongExpectedVersion`` (with the actual version) on a
        conflict; re-appending the same event ids at the same expected version is idempotent and
        returns the original result (R7); ``PayloadTooLarge`` before anything is written."""

    @abstractmethod
    def read_stream(
        self,
        stream: str,
        *,
        from_seq: int | None = None,
        backwards: bool = False,
        limit: int | None = None,
    ) -> list[StoredRecord]:
        """Events of one stream from ``from_seq`` (inclusive) in either direction. An unknown
        stream reads as empty."""

    @abstractmethod
    def stream_version(self, stream: str) -> int:
        """The seq of the stream's last event, 0 if it has none."""

    @abstractmethod
    def read_all(
        self, *, after: int = 0, limit: int = 1000, wire_names: Collection[str] | None = None
    ) -> list[StoredRecord]:
        """Events of every stream with position > ``after``, in position order."""

    @abstractmethod
    def head_position(self) -> int:
        """The position of the last committed event (0 when empty)."""

    @abstractmethod
    def open_subscription(
        self, *, after: int = 0, wire_names: Collection[str] | None = None,
        streams: Collection[str] | None = None,
    ) -> Subscription:
        """A catch-up subscription from position ``after`` (exclusive), filtered on wire names
        and, when ``streams`` is given, to the events of those streams (exact names; an empty
        collection delivers no event, only ``Checkpoint``s): records, ``Checkpoint``s and one
        ``CaughtUp``. ``subscribe(after=…)`` returns it. A store that can filter server-side
        (EventStoreDB) does so: a reader of a few streams does not receive the others'
        events."""

    consumer_groups: bool = False
    """Whether ``consumer_group`` joins a group (EventStoreDB) rather than answering None."""

    def consumer_group(self, name: str, *, wire_names: Collection[str]) -> GroupReader | None:
        """Join the consumer group ``name`` over this store's events of ``wire_names``
        (``terret.domain.groups``), creating the group if it is missing; None when the store
        has no such primitive (the default)."""
        return None

    @overload
    def subscribe(self, gt: int | None = None, topics: Sequence[str] = ()
                  ) -> RecorderSubscription: ...

    @overload
    def subscribe(self, gt: None = None, topics: Sequence[str] = (), *, after: int,
                  wire_names: Collection[str] | None = None) -> Subscription: ...

    def subscribe(self, gt: int | None = None, topics: Sequence[str] = (), *,
                  after: int | None = None, wire_names: Collection[str] | None = None
                  ) -> RecorderSubscription | Subscription:
        """Two spellings of one subscription. Terret's, ``subscribe(after=P, wire_names=…)``:
        ``open_subscription``'s records and markers. The library's, ``subscribe(gt=P,
        topics=…)``: the same subscription's records as ``Notification``s."""
        if after is not None or wire_names is not None:
            if gt is not None or topics:
                raise TypeError("subscribe() takes gt/topics or after/wire_names, not both")
            return self.open_subscription(after=after or 0, wire_names=wire_names)
        return RecorderSubscription(self, gt, topics)

    @abstractmethod
    def delete_stream(self, stream: str) -> None:
        """Remove a stream's events for good (retention, R27)."""

    native_expiry: bool = False
    """Whether the store expires a stream's events itself (``set_max_age``): EventStoreDB's
    ``$maxAge``. A store without it refuses a purge with an expiry (``ExpiryUnsupported``)."""

    def set_max_age(self, stream: str, seconds: int) -> None:  # noqa: B027 - optional
        """Ask the store to expire a stream's events after ``seconds`` (R27), on a store with
        ``native_expiry``; the others do nothing here."""

    def max_age(self, stream: str) -> int | None:
        """The expiry ``set_max_age`` gave the stream, or None (always, on a store without
        ``native_expiry``)."""
        return None

    @abstractmethod
    def write_snapshot(self, stream: str, version: int, state: bytes) -> None:
        """Store a snapshot of an aggregate at ``version`` (replaces any older one)."""

    @abstractmethod
    def read_snapshot(self, stream: str) -> tuple[int, bytes] | None:
        """The latest snapshot of a stream, or None."""

    def store_id(self) -> str | None:
        """The identity of this store's log: written once when the store is created (SQLite:
        in the file; EventStoreDB: in the metadata of the ``terret-store`` stream), the same
        for every process that opens it and for a copy of it (a backup), different for another
        store. Views record it and are rebuilt when opened on another store. None: this store
        cannot tell (a wrapper that does not delegate); the views then check only positions."""
        return None

    def workers(self) -> WorkerRegistry:
        """Where the workers serving this store's sessions beat (R28): shared by every process
        that opens the store. The default keeps beats in this object's memory, which is right
        only when one process uses the store; the shipped adapters keep them in the store."""
        registry: WorkerRegistry | None = getattr(self, "_terret_workers", None)
        if registry is None:
            registry = MemoryWorkers()
            self._terret_workers = registry
        return registry

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections and stop background work."""

    def describe(self) -> str:
        """A one-line description for operators, with credentials masked."""
        return type(self).__name__

    def appended_positions(self, stream: str, result: AppendResult, count: int) -> list[int]:
        """The positions of the ``count`` events an append just wrote (``result``). Read back
        here; a store whose appends take consecutive positions computes them instead."""
        if count == 1:
            return [result.position]
        written = self.read_stream(stream, from_seq=result.version - count + 1, limit=count)
        return [r.position for r in written]

    # --- the library's ApplicationRecorder, on top of the extension -----------------------

    def insert_events(self, stored_events: Sequence[es.StoredEvent], **kwargs: Any
                      ) -> Sequence[int] | None:
        """Append one originator's events, at versions that follow each other; raises the
        library's ``IntegrityError`` when one of them is recorded already or they would not
        follow the stream's last version (KurrentDB's rule; the one gap let through is a single
        missing version in a stream numbered from 0, read back as written), and
        ``ProgrammingError`` for events of several originators (one append is one stream) or a
        ``tracking`` object (this is no process recorder)."""
        if kwargs.get("tracking") is not None:
            raise es.ProgrammingError(f"{self.describe()} records no tracking with events")
        if not stored_events:
            return []
        stream, first = _recording(stored_events)
        try:
            if first == 0:
                result = self.append(stream, _records(stored_events, explicit=True),
                                     StreamState.NO_STREAM)
            else:
                result = self.append(stream, _records(stored_events, explicit=False),
                                     first - 1 or StreamState.NO_STREAM)
        except WrongExpectedVersion as conflict:
            result = self._insert_numbered_from_zero(stream, stored_events, conflict)
        return self.appended_positions(stream, result, len(stored_events))

    def _insert_numbered_from_zero(self, stream: str, events: Sequence[es.StoredEvent],
                                   conflict: WrongExpectedVersion) -> AppendResult:
        """The append after ``conflict``: right if the stream numbers from 0 and its last
        version is the one before the first event's."""
        first = events[0].originator_version
        last = self.read_stream(stream, backwards=True, limit=1) if conflict.actual else []
        if not last or conflict.actual != first or _version_of(last[0]) != first - 1:
            raise es.IntegrityError(f"{stream}: version {first} is recorded already, or would "
                                    f"follow version {conflict.actual} with a gap")
        try:
            return self.append(stream, _records(events, explicit=True), conflict.actual)
        except WrongExpectedVersion as again:
            raise es.IntegrityError(str(again)) from None

    def select_events(self, originator_id: UUID | str, *, gt: int | None = None,
                      lte: int | None = None, desc: bool = False, limit: int | None = None
                      ) -> list[es.StoredEvent]:
        # One read for either numbering: versions low..lte sit at seqs low..lte (from 1) or
        # low+1..lte+1 (from 0), so the read spans one more seq and the versions filter it.
        stream = str(originator_id)
        low = 0 if gt is None else gt + 1  # versions low..lte; version v is at seq v or v + 1
        if limit == 0 or (lte is not None and lte < low):
            return []
        span = None if lte is None else lte - low + 2
        want = None if limit is None else limit + 1
        count = span if want is None else want if span is None else min(span, want)
        if desc:
            start = None if lte is None else lte + 1
            records = self.read_stream(stream, from_seq=start, backwards=True, limit=count)
        else:
            records = self.read_stream(stream, from_seq=max(low, 1), limit=count)
        out = []
        for record in records:
            version = _version_of(record)
            if version >= low and (lte is None or version <= lte):
                out.append(es.StoredEvent(originator_id, version, record.wire_name, record.data))
        return out[:limit] if limit is not None else out

    def select_notifications(self, start: int | None, limit: int, stop: int | None = None,
                             topics: Sequence[str] = (), *, inclusive_of_start: bool = True
                             ) -> list[es.Notification]:
        after = 0 if start is None else start - 1 if inclusive_of_start else start
        records = self.read_all(after=max(after, 0), limit=limit,
                                wire_names=list(topics) or None)
        return [notification_of(r) for r in records if stop is None or r.position <= stop]

    def max_notification_id(self) -> int | None:
        return self.head_position() or None


class RecorderSubscription(es.Subscription[EventStore]):
    """The library's view of a store's subscription (``EventStore.subscribe(gt=…)``): the
    records of ``open_subscription`` as ``Notification``s; checkpoints and the caught-up
    marker are passed over."""

    def __init__(self, recorder: EventStore, gt: int | None = None,
                 topics: Sequence[str] = ()) -> None:
        super().__init__(recorder, gt, topics)
        self._inner = recorder.open_subscription(after=gt or 0, wire_names=list(topics) or None)

    def stop(self) -> None:
        super().stop()
        self._inner.stop()

    def __next__(self) -> es.Notification:
        while not self._has_been_stopped:
            item = next(self._inner)
            if isinstance(item, StoredRecord):
                self._last_notification_id = item.position
                return notification_of(item)
        raise StopIteration


# --- records of the library's events -------------------------------------------------------

_VERSION_METADATA = b'{"originator_version":'


def _version_of(record: StoredRecord) -> int:
    """The ``originator_version`` of a record: said in its metadata, or its seq."""
    metadata = record.metadata
    if metadata.startswith(_VERSION_METADATA):
        try:
            return int(metadata[len(_VERSION_METADATA):-1])
        except ValueError:
            pass
    return record.seq


def _originator(stream: str) -> UUID | str:
    """The originator a stream records: a UUID when its name is one (as written), else the
    name."""
    if len(stream) == 36:
        try:
            found = UUID(stream)
        except ValueError:
            return stream
        if str(found) == stream:
            return found
    return stream


def notification_of(record: StoredRecord) -> es.Notification:
    return es.Notification(originator_id=_originator(record.stream),
                           originator_version=_version_of(record), topic=record.wire_name,
                           state=record.data, id=record.position)


def _recording(events: Sequence[es.StoredEvent]) -> tuple[str, int]:
    """The stream the events go to and the first one's version; refuses events of several
    originators and versions that do not follow each other."""
    first = events[0]
    if any(e.originator_id != first.originator_id for e in events):
        raise es.ProgrammingError("one insert is one append: events of one originator only")
    for offset, event in enumerate(events):
        if event.originator_version != first.originator_version + offset:
            raise es.IntegrityError(f"{first.originator_id}: versions must follow each other")
    if first.originator_version < 0:
        raise es.IntegrityError(f"{first.originator_id}: a version cannot be negative")
    return str(first.originator_id), first.originator_version


def _records(events: Sequence[es.StoredEvent], *, explicit: bool) -> list[NewRecord]:
    """The events as records; ``explicit``: their versions differ from their seqs and are
    written into their metadata."""
    return [NewRecord(uuid4(), e.topic, e.state,
                      b'{"originator_version":%d}' % e.originator_version if explicit else b"{}")
            for e in events]
