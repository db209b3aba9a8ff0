"""A process-wide pause of Python's cyclic garbage collector, for the projection runner's
batches."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class CollectorPause:
    """Pauses Python's cyclic garbage collector while any thread holds a pause, and restores
    it when the last one ends. A batch allocates several objects per event and keeps the events
    until its listeners have run, so the collector scanned the young generations over and over
    (a sixth of a rebuild's time) and found nothing, as events hold no cycles. Each pause lasts
    one batch (``batch_size`` events at most); afterwards the collector is as the application
    left it — off stays off. The collector's switch is one per process, hence the count: two
    runners' overlapping pauses must not leave it off. Mercurial's ``util.nogc`` does the same
    for its bulk loads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holders = 0
        self._resume = False

    @contextmanager
    def __call__(self) -> Iterator[None]:
        with self._lock:
            if self._holders == 0:
                self._resume = gc.isenabled()
                gc.disable()
            self._holders += 1
        try:
            yield
        finally:
            with self._lock:
                self._holders -= 1
                if self._holders == 0 and self._resume:
                    gc.enable()


collector_paused = CollectorPause()
