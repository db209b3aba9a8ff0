"""Stores that stand in between a test and the store under test: each passes every call on,
and a test overrides what it tampers with."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from terret.domain.store import (
    AppendResult,
    EventStore,
    ExpectedVersion,
    NewRecord,
    StoredRecord,
    Subscription,
)


class DelegatingStore(EventStore):
    """Passes every call to ``inner``: a test overrides what it tampers with (a transport that
    retries, a read that is held up)."""

    def __init__(self, inner: EventStore) -> None:
        self.inner = inner

    def append(self, stream: str, records: Sequence[NewRecord],
               expected_version: ExpectedVersion) -> AppendResult:
        return self.inner.append(stream, records, expected_version)

    def read_stream(self, stream: str, **kw: Any) -> list[StoredRecord]:
        return self.inner.read_stream(stream, **kw)

    def stream_version(self, stream: str) -> int:
        return self.inner.stream_version(stream)

    def read_all(self, **kw: Any) -> list[StoredRecord]:
        return self.inner.read_all(**kw)

    def head_position(self) -> int:
        return self.inner.head_position()

    def open_subscription(self, *, after: int = 0, wire_names: Collection[str] | None = None,
                          streams: Collection[str] | None = None) -> Subscription:
        return self.inner.open_subscription(after=after, wire_names=wire_names,
                                            streams=streams)

    def delete_stream(self, stream: str) -> None:
        self.inner.delete_stream(stream)

    def write_snapshot(self, stream: str, version: int, state: bytes) -> None:
        self.inner.write_snapshot(stream, version, state)

    def read_snapshot(self, stream: str) -> tuple[int, bytes] | None:
        return self.inner.read_snapshot(stream)
