"""Threads that run tool handlers, reused from call to call.

A handler runs on a thread of its own so that the turn can stop waiting for it — a timeout, a
cancel, a Ctrl-C — while it goes on. Starting a thread per call costs milliseconds here (the OS
thread, then the hand-over of the interpreter lock); handing a call to a thread that is already
waiting costs tens of microseconds. The standard library's ``ThreadPoolExecutor`` would do, but
its workers are joined at interpreter exit, so one handler that hangs would keep a stopping
``terret serve`` from exiting; and a bounded pool fills up with abandoned calls. These workers
are daemon threads, and the pool grows instead of queueing: a worker busy with an abandoned call
is simply not handed another one.
"""

from __future__ import annotations

import contextvars
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

IDLE_KEPT = 8
"""Idle workers kept waiting for the next call; more than that exit when their call is done."""


class HandlerThreads:
    def __init__(self, name: str = "terret-tool") -> None:
        self._name = name
        self._idle: list[queue.SimpleQueue[Callable[[], None] | None]] = []
        self._lock = threading.Lock()
        self._count = 0

    def run(self, work: Callable[[], None]) -> None:
        """Run ``work`` on a worker thread, in a copy of the caller's context; returns at once."""
        task = contextvars.copy_context().run
        with self._lock:
            inbox = self._idle.pop() if self._idle else None
            if inbox is None:
                self._count += 1
                inbox = queue.SimpleQueue()
                threading.Thread(target=self._serve, args=(inbox,), daemon=True,
                                 name=f"{self._name}-{self._count}").start()
        inbox.put(lambda: task(work))

    def _serve(self, inbox: queue.SimpleQueue[Callable[[], None] | None]) -> None:
        while True:
            job = inbox.get()
            if job is None:
                return
            job()  # work() records its own outcome; it never raises
            with self._lock:
                if len(self._idle) >= IDLE_KEPT:
                    return
                self._idle.append(inbox)


HANDLERS = HandlerThreads()
"""The process's handler threads, shared by every pipeline."""


def handed_over(call: Callable[[], Any]) -> tuple[threading.Event, list[tuple[bool, Any]]]:
    """Run ``call`` on a handler thread (``HANDLERS``: with a copy of the caller's context
    variables); its outcome — ``(True, value)`` or ``(False, exception)`` — lands in the box,
    and the event is set after."""
    done = threading.Event()
    box: list[tuple[bool, Any]] = []

    def work() -> None:
        try:
            box.append((True, call()))
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            box.append((False, exc))
        finally:
            done.set()

    HANDLERS.run(work)
    return done, box


T = TypeVar("T")


def answered_within(seconds: float | None, what: str, work: Callable[[], T]) -> T:
    """``work()``, on a handler thread when ``seconds`` bounds it: ``TimeoutError`` (naming
    ``what``) when it has not answered by then. Python cannot stop the thread: it is left to
    finish and its answer dropped, but the caller — an upkeep thread, which a summarizer that
    never answers held for good — goes on."""
    if seconds is None:
        return work()
    done, box = handed_over(work)
    if not done.wait(seconds):
        raise TimeoutError(f"{what} did not answer within {seconds:g} s (upkeep_timeout)")
    answered, value = box[0]
    if not answered:
        raise value
    return value  # type: ignore[no-any-return]
