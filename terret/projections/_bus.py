"""The listener bus: after a batch is committed, the runner hands its events to the listeners
(so a listener always reads views that include its event). A listener's failure is logged and
stops neither the bus nor the other listeners."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # importing the codec loads every payload class
    from terret.domain.codec import RecordedEvent

log = logging.getLogger("terret.projections")

Listener = Callable[["RecordedEvent"], None]


@dataclass
class ListenerHandle:
    bus: ListenerBus
    fn: Listener
    wire_names: frozenset[str] | None

    def remove(self) -> None:
        self.bus.remove(self)


class ListenerBus:
    def __init__(self) -> None:
        self._handles: list[ListenerHandle] = []
        self._lock = threading.Lock()
        self.listen_from = 0
        """Events at or before this position are history: no listener receives them."""

    def add(self, fn: Listener, wire_names: Collection[str] | None = None) -> ListenerHandle:
        handle = ListenerHandle(self, fn, frozenset(wire_names) if wire_names else None)
        with self._lock:
            self._handles.append(handle)
        return handle

    def remove(self, handle: ListenerHandle) -> None:
        with self._lock:
            if handle in self._handles:
                self._handles.remove(handle)

    def __len__(self) -> int:
        with self._lock:
            return len(self._handles)

    def publish(self, events: Sequence[RecordedEvent]) -> None:
        with self._lock:
            handles = list(self._handles)
        if not handles:
            return
        for event in events:
            if event.position <= self.listen_from:
                continue
            for handle in handles:
                if handle.wire_names is not None and event.wire_name not in handle.wire_names:
                    continue
                try:
                    handle.fn(event)
                except Exception:  # a listener's failure must not stop the bus
                    log.exception("listener %r failed on %s at %d", handle.fn,
                                  event.wire_name, event.position)
