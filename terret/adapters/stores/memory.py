"""An in-memory store for unit tests: the same contract as the others, nothing durable. An
append and a read cost what they touch, not the stream's length (a long session in memory does
not slow down turn by turn)."""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Collection, Sequence
from uuid import UUID, uuid4

from terret.adapters.stores._rules import AlreadyWritten, check_size, decide
from terret.adapters.stores._subscription import PositionalStore
from terret.domain.errors import StreamDeleted
from terret.domain.store import (
    AppendResult,
    ExpectedVersion,
    NewRecord,
    StoredRecord,
    Subscription,
)


class MemoryStore(PositionalStore):
    def __init__(self, *, poll_interval: float = 1.0) -> None:
        self._log: list[StoredRecord] = []
        self._positions: list[int] = []
        self._streams: dict[str, list[StoredRecord]] = {}
        self._ids: dict[str, dict[UUID, int]] = {}
        """Each stream's event ids and their seqs (R7's idempotent re-append looks them up)."""
        self._snapshots: dict[str, tuple[int, bytes]] = {}
        self._deleted: set[str] = set()
        self._signal = threading.Condition()
        self._next_position = 1
        self.poll_interval = poll_interval
        self._store_id = uuid4().hex  # a new log: every instance is a store of its own

    def describe(self) -> str:
        return "memory"

    def store_id(self) -> str:
        return self._store_id

    def append(
        self, stream: str, records: Sequence[NewRecord], expected_version: ExpectedVersion
    ) -> AppendResult:
        check_size(records, self.max_record_bytes)
        with self._signal:
            events = self._streams.get(stream, [])
            by_id = self._ids.get(stream, {})
            self._refuse_deleted(stream, events, records)

            def id_at(seq: int) -> UUID | None:
                return events[seq - 1].event_id if 0 < seq <= len(events) else None

            decision = decide(stream, records, expected_version, len(events), id_at, by_id.get)
            if isinstance(decision, AlreadyWritten):
                # R7: the original write's result, even if the stream moved on since
                return AppendResult(events[decision.last_seq - 1].position, decision.last_seq)
            if not records:
                return AppendResult(events[-1].position if events else 0, len(events))
            now = time.time()
            events = self._streams.setdefault(stream, [])
            ids = self._ids.setdefault(stream, {})
            for record in records:
                stored = StoredRecord(
                    stream=stream,
                    seq=len(events) + 1,
                    position=self._next_position,
                    event_id=record.event_id,
                    wire_name=record.wire_name,
                    data=record.data,
                    metadata=record.metadata,
                    recorded_at=now,
                )
                self._next_position += 1
                events.append(stored)
                ids[stored.event_id] = stored.seq
                self._log.append(stored)
                self._positions.append(stored.position)
            self._signal.notify_all()
            return AppendResult(events[-1].position, len(events))

    def read_stream(
        self,
        stream: str,
        *,
        from_seq: int | None = None,
        backwards: bool = False,
        limit: int | None = None,
    ) -> list[StoredRecord]:
        # A stream's events sit at index seq - 1: a read slices what it returns.
        with self._signal:
            events = self._streams.get(stream, [])
            if backwards:
                stop = len(events) if from_seq is None else max(0, min(from_seq, len(events)))
                start = 0 if limit is None else max(0, stop - limit)
                return events[start:stop][::-1]
            start = 0 if from_seq is None else max(0, from_seq - 1)
            return events[start:] if limit is None else events[start:start + max(0, limit)]

    def stream_version(self, stream: str) -> int:
        with self._signal:
            return len(self._streams.get(stream, ()))

    def head_position(self) -> int:
        with self._signal:
            return self._positions[-1] if self._positions else 0

    def _read_range(
        self, after: int, upto: int, limit: int, wire_names: Collection[str] | None,
        streams: Collection[str] | None = None,
    ) -> list[StoredRecord]:
        out: list[StoredRecord] = []
        with self._signal:
            index = bisect.bisect_right(self._positions, after)
            for record in self._log[index:]:
                if record.position > upto or len(out) >= limit:
                    break
                if (wire_names is None or record.wire_name in wire_names) and (
                        streams is None or record.stream in streams):
                    out.append(record)
        return out

    def _wait_for_change(self, seen_head: int, timeout: float, sub: Subscription) -> None:
        with self._signal:
            while not sub.stopped and (self._positions[-1] if self._positions else 0) <= seen_head:
                self._signal.wait(timeout)

    def _refuse_deleted(self, stream: str, events: Sequence[StoredRecord],
                        records: Sequence[NewRecord]) -> None:
        if not events and records and stream in self._deleted:
            raise StreamDeleted(f"stream {stream!r} was deleted")  # as EventStoreDB's tombstone

    def delete_stream(self, stream: str) -> None:
        with self._signal:
            self._streams.pop(stream, None)
            self._ids.pop(stream, None)
            self._snapshots.pop(stream, None)
            self._deleted.add(stream)
            kept = [r for r in self._log if r.stream != stream]
            self._log = kept
            self._positions = [r.position for r in kept]

    def write_snapshot(self, stream: str, version: int, state: bytes) -> None:
        with self._signal:
            current = self._snapshots.get(stream)
            if current is None or current[0] < version:
                self._snapshots[stream] = (version, state)

    def read_snapshot(self, stream: str) -> tuple[int, bytes] | None:
        with self._signal:
            return self._snapshots.get(stream)
