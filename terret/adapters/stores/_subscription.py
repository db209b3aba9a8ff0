"""A catch-up subscription for stores that can be read by position (memory, sqlite).

It runs in the consumer's thread: it reads pages of history, signals ``CaughtUp`` once, then
waits on the store's change signal (set at once by an append in this process; other processes
are noticed by the store's poll) and reads again. Every read is bounded by a head position read
*before* it, so a filtered read that finds nothing may safely advance to that head (a
``Checkpoint``) without skipping an event committed meanwhile.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection
from typing import Protocol

from terret.domain.store import CaughtUp, Checkpoint, StoredRecord, Subscription, SubscriptionItem


class PositionReadable(Protocol):
    def head_position(self) -> int: ...

    def _read_range(
        self, after: int, upto: int, limit: int, wire_names: Collection[str] | None
    ) -> list[StoredRecord]: ...

    def _wait_for_change(self, seen_head: int, timeout: float, sub: Subscription) -> None: ...


class PositionalSubscription(Subscription):
    page = 1000

    def __init__(
        self,
        store: PositionReadable,
        after: int,
        wire_names: Collection[str] | None,
        poll_interval: float,
    ) -> None:
        super().__init__()
        self._store = store
        self._after = after
        self._names = frozenset(wire_names) if wire_names is not None else None
        self._poll = poll_interval
        self._buffer: deque[SubscriptionItem] = deque()
        self._caught_up = False
        self._wake: list[object] = []

    @property
    def position(self) -> int:
        """The position up to which this subscription has delivered or skipped events."""
        return self._after

    @property
    def buffered(self) -> int:
        """Items ready to deliver without waiting (the runner commits when this reaches 0)."""
        return len(self._buffer)

    def stop(self) -> None:
        super().stop()
        wake = getattr(self._store, "_wake_all", None)
        if wake is not None:
            wake()

    def __next__(self) -> SubscriptionItem:
        while not self._buffer:
            if self.stopped:
                raise StopIteration
            self._fill()
        return self._buffer.popleft()

    def _fill(self) -> None:
        head = self._store.head_position()
        if head > self._after:
            records = self._store._read_range(self._after, head, self.page, self._names)
            if records:
                self._buffer.extend(records)
                last = records[-1].position
                if len(records) < self.page and last < head:
                    # The page ended before head: the rest up to head was filtered out.
                    self._buffer.append(Checkpoint(head))
                    last = head
                self._after = last
                return
            # Nothing matched up to head: skip the filtered-out stretch.
            self._after = head
            self._buffer.append(Checkpoint(head))
            return
        if not self._caught_up:
            self._caught_up = True
            self._buffer.append(CaughtUp(self._after))
            return
        self._store._wait_for_change(head, self._poll, self)
