"""A catch-up subscription for stores that can be read by position (memory, sqlite).

It runs in the consumer's thread: it reads pages of history, signals ``CaughtUp`` once, then
waits on the store's change signal (set at once by an append in this process; other processes
are noticed by the store's poll) and reads again. Every read is bounded by a head position read
*before* it, so a filtered read that finds nothing may safely advance to that head (a
``Checkpoint``) without skipping an event committed meanwhile. The filters (wire names, and
streams when given) are the store's to apply in ``_read_range``.
"""

from __future__ import annotations

import threading
from abc import abstractmethod
from collections import deque
from collections.abc import Collection

from terret.domain.store import (
    AppendResult,
    CaughtUp,
    Checkpoint,
    EventStore,
    StoredRecord,
    Subscription,
    SubscriptionItem,
)


class PositionalStore(EventStore):
    """Shared by the stores that can be read by position (memory, sqlite): ``read_all`` and
    ``open_subscription`` over ``_read_range``, woken through ``_signal`` (a
    ``threading.Condition``). An append takes consecutive positions (it holds the write lock)."""

    poll_interval: float
    _signal: threading.Condition

    def read_all(
        self, *, after: int = 0, limit: int = 1000, wire_names: Collection[str] | None = None
    ) -> list[StoredRecord]:
        return self._read_range(after, 2**62, limit, wire_names)

    @abstractmethod
    def _read_range(
        self, after: int, upto: int, limit: int, wire_names: Collection[str] | None,
        streams: Collection[str] | None = None,
    ) -> list[StoredRecord]:
        """Records with ``after < position <= upto``, at most ``limit``, filtered on wire
        names and, when ``streams`` is given, to those streams' (an empty one: none)."""

    @abstractmethod
    def _wait_for_change(self, seen_head: int, timeout: float, sub: Subscription) -> None:
        """Return once the head may have moved past ``seen_head``, or the sub stopped."""

    def open_subscription(
        self, *, after: int = 0, wire_names: Collection[str] | None = None,
        streams: Collection[str] | None = None,
    ) -> Subscription:
        return PositionalSubscription(self, after, wire_names, self.poll_interval, streams)

    def appended_positions(self, stream: str, result: AppendResult, count: int) -> list[int]:
        return list(range(result.position - count + 1, result.position + 1))

    def _wake_all(self) -> None:
        with self._signal:
            self._signal.notify_all()


class PositionalSubscription(Subscription):
    page = 1000

    def __init__(
        self,
        store: PositionalStore,
        after: int,
        wire_names: Collection[str] | None,
        poll_interval: float,
        streams: Collection[str] | None = None,
    ) -> None:
        super().__init__()
        self._store = store
        self._after = after
        self._names = frozenset(wire_names) if wire_names is not None else None
        self._streams = frozenset(streams) if streams is not None else None
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
        self._store._wake_all()

    def __next__(self) -> SubscriptionItem:
        while not self._buffer:
            if self.stopped:
                raise StopIteration
            self._fill()
        return self._buffer.popleft()

    def _fill(self) -> None:
        head = self._store.head_position()
        if head > self._after:
            records = self._store._read_range(self._after, head, self.page, self._names,
                                              self._streams)
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
