"""The event store port. Adapters: memory, sqlite, eventstoredb (``terret.adapters.stores``).

Streams are named ``session-<uuid>``. ``seq`` numbers a stream's events from 1; a stream's
*version* is the seq of its last event (0 when it has none). ``position`` is the global commit
order: it strictly increases in commit order across all streams.
"""

from __future__ import annotations

import enum
import threading
from abc import ABC, abstractmethod
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Self
from uuid import UUID

from terret.domain.workers import MemoryWorkers, WorkerRegistry

MAX_RECORD_BYTES = 1024 * 1024
"""EventStoreDB's limit on one record; every adapter refuses larger payloads before writing."""

SESSION_PREFIX = "session-"
RETENTION_STREAM = "terret-retention"


def session_stream(session_id: UUID) -> str:
    return f"{SESSION_PREFIX}{session_id}"


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


class EventStore(ABC):
    """The port every store adapter implements; ``tests/contract`` holds its contract suite."""

    max_record_bytes: int = MAX_RECORD_BYTES

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
    def subscribe(
        self, *, after: int = 0, wire_names: Collection[str] | None = None
    ) -> Subscription:
        """A catch-up subscription from position ``after`` (exclusive), filtered on wire names."""

    @abstractmethod
    def delete_stream(self, stream: str) -> None:
        """Remove a stream's events for good (retention, R27)."""

    def set_max_age(self, stream: str, seconds: int) -> None:  # noqa: B027 - optional
        """Ask the store to expire a stream's events after ``seconds`` (R27). Stores without
        native expiry keep the events until an explicit purge."""

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
