"""The emulator's in-memory database: one global log plus per-stream indexes.

All writes happen under one lock, which makes every append atomic and keeps positions in
append order. Readers take a short snapshot under the lock and then read the append-only
lists without it. A Condition wakes subscribers when the log grows.
"""

from __future__ import annotations

import bisect
import threading
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from .commit_check import CommitCheck, Decision, check_commit
from .records import (
    DELETED_STREAM,
    METADATA_EVENT_TYPE,
    NO_EVENTS,
    TICKS_PER_SECOND,
    TOMBSTONE_EVENT_TYPE,
    ProposedEvent,
    Record,
    StreamMetadata,
    is_metastream,
    json_object,
    metastream_of,
    now_ticks,
    original_stream,
)

# The first record does not sit at 0: position 0 means "from the start" to the server, and
# esdbclient's tests require the first user event to have a position > 0.
FIRST_POSITION = 128

# The seeded housekeeping event. $all must start with a `$`-typed event (wire notes §3.3);
# a `$metadata` event is hidden by the client's default filter and by nothing else.
SEED_STREAM = "$$$scavenges"
SEED_DATA = b'{"$maxAge":2592000}'


class StreamIndex:
    """Events of one stream; event number n is `records[n]` (numbers are contiguous)."""

    __slots__ = ("name", "records", "tombstone")

    def __init__(self, name: str) -> None:
        self.name = name
        self.records: list[Record] = []
        self.tombstone: Record | None = None

    @property
    def current(self) -> int:
        if self.tombstone is not None:
            return DELETED_STREAM
        return len(self.records) - 1

    def event(self, number: int) -> Record | None:
        if 0 <= number < len(self.records):
            return self.records[number]
        return None


@dataclass(frozen=True, slots=True)
class Written:
    position: int | None  # None: nothing was written and there is nothing to point at
    current: int  # the stream's current revision afterwards (NO_EVENTS if none)


@dataclass(frozen=True, slots=True)
class WrongVersion:
    current: int  # NO_EVENTS is reported to clients as "no stream"


@dataclass(frozen=True, slots=True)
class StreamDeleted:
    pass


WriteOutcome = Written | WrongVersion | StreamDeleted


class StreamDeletedError(Exception):
    """A read hit a tombstoned stream (or the metastream of one)."""


@dataclass(frozen=True, slots=True)
class StreamSnapshot:
    """What a stream read may see, fixed at the moment the read starts."""

    records: Sequence[Record]  # the live list: only read numbers in [floor, last]
    last: int
    floor: int  # first visible event number ($tb, $maxCount)
    min_created: int | None  # $maxAge cut-off in ticks
    found: bool  # False: reply stream_not_found

    def visible(self, record: Record) -> bool:
        return self.min_created is None or record.created >= self.min_created


NOT_FOUND = StreamSnapshot(records=(), last=NO_EVENTS, floor=0, min_created=None, found=False)


class EventStore:
    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._log: list[Record] = []
        self._positions: list[int] = []  # parallel to _log, for bisect
        self._streams: dict[str, StreamIndex] = {}
        self._committed: dict[str, Record] = {}  # event id -> latest record with that id
        self._metadata: dict[str, StreamMetadata] = {}  # stream -> parsed last `$$` event
        self._next_position = FIRST_POSITION
        self.traces: list[set[str]] = []
        """Per `$all` subscription, the streams of the events sent to it (tests read it)."""

    # -- the log ---------------------------------------------------------------------------

    @property
    def log(self) -> Sequence[Record]:
        """The global log. Append-only: indexes below a length read earlier stay valid."""
        return self._log

    @property
    def event_count(self) -> int:
        return len(self._log)

    def index_at_or_after(self, position: int) -> int:
        return bisect.bisect_left(self._positions, position, 0, len(self._log))

    def index_after(self, position: int) -> int:
        return bisect.bisect_right(self._positions, position, 0, len(self._log))

    def wait_for(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Block until `predicate()` (evaluated under the lock) holds, or timeout."""
        with self._changed:
            return self._changed.wait_for(predicate, timeout)

    def trace_subscription(self) -> set[str]:
        """A new `$all` subscription's trace: the streams of the events it was sent."""
        trace: set[str] = set()
        with self._lock:
            self.traces.append(trace)
        return trace

    def traced(self, trace: set[str], stream: str) -> None:
        with self._lock:
            trace.add(stream)

    def copy_traces(self) -> list[set[str]]:
        with self._lock:
            return [set(t) for t in self.traces]

    def wake_waiters(self) -> None:
        with self._changed:
            self._changed.notify_all()

    # -- writes ----------------------------------------------------------------------------

    def seed_system_event(self) -> None:
        with self._lock:
            self._write(SEED_STREAM, [_system_event(METADATA_EVENT_TYPE, SEED_DATA)])

    def append(self, stream: str, expected: int, events: Sequence[ProposedEvent]) -> WriteOutcome:
        with self._lock:
            index = self._streams.get(stream) or StreamIndex(stream)
            check = self._check(index, expected, [e.event_id for e in events])
            failure = _failure(check, index)
            if failure is not None:
                return failure
            if check.decision is Decision.IDEMPOTENT:
                assert check.last_record is not None
                return Written(check.last_record.position, index.current)
            if not events:
                last = index.event(index.current)
                return Written(last.position if last else None, index.current)
            return self._write_checked(stream, index, events)

    def append_unchecked(self, stream: str, events: Iterable[ProposedEvent]) -> int | None:
        """Append at the end of `stream` with no version checks (bulk seeding)."""
        with self._lock:
            records = self._write(stream, list(events))
            return records[-1].position if records else None

    def delete(self, stream: str, expected: int) -> WriteOutcome:
        """Soft delete: set `$tb` to DELETED_STREAM in the metastream (notes §3.5)."""
        with self._lock:
            index = self._streams.get(stream) or StreamIndex(stream)
            check = self._check(index, expected, [str(uuid.uuid4())])
            failure = _failure(check, index)
            if failure is not None:
                return failure
            if index.current == NO_EVENTS and not self._has_metadata(stream):
                return WrongVersion(NO_EVENTS)  # the client turns "-1" into NotFound
            meta = self._metadata.get(stream, StreamMetadata())
            data = meta.with_truncate_before(DELETED_STREAM)
            [record] = self._write(
                metastream_of(stream), [_system_event(METADATA_EVENT_TYPE, data)]
            )
            return Written(record.position, index.current)

    def tombstone(self, stream: str, expected: int) -> WriteOutcome:
        with self._lock:
            index = self._streams.get(stream) or StreamIndex(stream)
            check = self._check(index, expected, [str(uuid.uuid4())])
            failure = _failure(check, index)
            if failure is not None:
                return failure
            index = self._streams.setdefault(stream, index)
            event = _system_event(TOMBSTONE_EVENT_TYPE, b"", is_json=False)
            record = self._new_record(stream, DELETED_STREAM, event)
            index.tombstone = record
            self._changed.notify_all()
            return Written(record.position, DELETED_STREAM)

    def _check(self, index: StreamIndex, expected: int, event_ids: Sequence[str]) -> CommitCheck:
        return check_commit(
            index,
            expected,
            event_ids,
            self._committed,
            soft_deleted=self._metadata.get(index.name, StreamMetadata()).soft_deleted,
            has_metadata=self._has_metadata(index.name),
        )

    def _has_metadata(self, stream: str) -> bool:
        meta_index = self._streams.get(metastream_of(stream))
        return meta_index is not None and bool(meta_index.records)

    def _write_checked(
        self, stream: str, index: StreamIndex, events: Sequence[ProposedEvent]
    ) -> Written:
        # Writing to a soft-deleted stream recreates it: new events continue the numbering
        # and the metadata's `$tb` moves to the first new event ("soft undelete").
        meta = self._metadata.get(stream, StreamMetadata())
        if meta.soft_deleted:
            undelete = meta.with_truncate_before(index.current + 1)
            self._write(metastream_of(stream), [_system_event(METADATA_EVENT_TYPE, undelete)])
        # Writing `$$s` while `s` is soft-deleted also undeletes `s`: the server appends a
        # second metadata event, the user's JSON with `$tb` = last event number of s + 1.
        undelete_original = None
        if is_metastream(stream):
            original = original_stream(stream)
            original_index = self._streams.get(original)
            original_current = original_index.current if original_index else NO_EVENTS
            if (
                self._metadata.get(original, StreamMetadata()).soft_deleted
                and original_current != DELETED_STREAM
            ):
                undelete_original = original_current + 1
        records = self._write(stream, events)
        user_metadata = json_object(records[-1].data)
        if undelete_original is not None and user_metadata is not None:
            # (The server skips this when the user's metadata is not a JSON object.)
            data = StreamMetadata(user_metadata).with_truncate_before(undelete_original)
            self._write(stream, [_system_event(METADATA_EVENT_TYPE, data)])
        return Written(records[-1].position, self._streams[stream].current)

    def _write(self, stream: str, events: Sequence[ProposedEvent]) -> list[Record]:
        index = self._streams.get(stream)
        if index is None:
            index = self._streams[stream] = StreamIndex(stream)
        records = []
        for event in events:
            record = self._new_record(stream, len(index.records), event)
            index.records.append(record)
            self._committed[event.event_id] = record
            records.append(record)
        if records and is_metastream(stream):
            self._metadata[original_stream(stream)] = StreamMetadata.parse(records[-1].data)
        self._changed.notify_all()
        return records

    def _new_record(self, stream: str, number: int, event: ProposedEvent) -> Record:
        record = Record(
            position=self._next_position,
            stream=stream,
            number=number,
            event_id=event.event_id,
            type=event.type,
            is_json=event.content_type == "application/json",
            data=event.data,
            custom_metadata=event.custom_metadata,
            created=now_ticks(),
        )
        self._next_position += record.size
        self._log.append(record)
        self._positions.append(record.position)
        return record

    # -- stream reads ----------------------------------------------------------------------

    def stream_snapshot(self, stream: str) -> StreamSnapshot:
        """Visible events of `stream` per §3.5-3.6. Raises StreamDeletedError."""
        with self._lock:
            if is_metastream(stream):
                original = self._streams.get(original_stream(stream))
                if original is not None and original.tombstone is not None:
                    raise StreamDeletedError(stream)
            index = self._streams.get(stream)
            if index is None:
                return NOT_FOUND
            if index.tombstone is not None:
                raise StreamDeletedError(stream)
            last = len(index.records) - 1
            if last == NO_EVENTS:
                return NOT_FOUND
            meta = self._metadata.get(stream, StreamMetadata())
            if meta.soft_deleted:
                return NOT_FOUND
            floor = max(0, meta.truncate_before or 0)
            # Metastreams are always read with $maxCount = 1 (ESConsts.MetaStreamMaxCount).
            max_count = 1 if is_metastream(stream) else meta.max_count
            if max_count is not None:
                floor = max(floor, last - max_count + 1)
            min_created = None
            if meta.max_age_seconds is not None:
                min_created = now_ticks() - meta.max_age_seconds * TICKS_PER_SECOND
            return StreamSnapshot(index.records, last, floor, min_created, found=True)

    def stream_progress(self, stream: str) -> tuple[Sequence[Record], bool]:
        """(events so far, tombstoned?) for stream subscriptions; the list is live."""
        index = self._streams.get(stream)
        if index is None:
            return (), False
        return index.records, index.tombstone is not None

    def stream_start_floor(self, stream: str) -> int:
        """First event number a new stream subscription's catch-up may deliver."""
        with self._lock:
            index = self._streams.get(stream)
            if index is None:
                return 0
            meta = self._metadata.get(stream, StreamMetadata())
            floor = max(0, meta.truncate_before or 0)
            if meta.max_count is not None:
                floor = max(floor, len(index.records) - meta.max_count)
            return min(floor, len(index.records))


def _failure(check: CommitCheck, index: StreamIndex) -> WriteOutcome | None:
    if check.decision is Decision.STREAM_DELETED:
        return StreamDeleted()
    if check.is_wrong_version:
        return WrongVersion(index.current)
    return None


def _system_event(event_type: str, data: bytes, *, is_json: bool = True) -> ProposedEvent:
    content_type = "application/json" if is_json else "application/octet-stream"
    return ProposedEvent(str(uuid.uuid4()), event_type, content_type, data)
