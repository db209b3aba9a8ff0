"""Tasks to run later, all on one timer thread that hands each, when due, to the upkeep pool:
the re-checks of between-turn upkeep left to a session's live owner (if the owner dies before
it did it, a process that serves the session does it then)."""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Callable
from itertools import count


class Deferred:
    def __init__(self, run: Callable[[Callable[[], object]], None]) -> None:
        self._run = run
        self._due: list[tuple[float, int, Callable[[], object]]] = []
        self._order = count()
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    def after(self, delay: float, task: Callable[[], object]) -> None:
        """Hand ``task`` to the pool in ``delay`` seconds (never, once closed)."""
        with self._wake:
            if self._closed:
                return
            heapq.heappush(self._due, (time.monotonic() + delay, next(self._order), task))
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="terret-deferred",
                                                daemon=True)
                self._thread.start()
            self._wake.notify()

    def close(self) -> None:
        """Drop what is not due yet: a process stopping does no upkeep it left to others."""
        with self._wake:
            self._closed = True
            self._due.clear()
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(5.0)

    def _loop(self) -> None:
        with self._wake:
            while not self._closed:
                if not self._due:
                    self._wake.wait()
                    continue
                wait = self._due[0][0] - time.monotonic()
                if wait > 0:
                    self._wake.wait(wait)
                    continue
                _, _, task = heapq.heappop(self._due)
                self._run(task)  # only queues it: the pool runs it
