"""Per-call plumbing for long-running Read calls: cancellation, deadlines and cuts."""

from __future__ import annotations

from collections.abc import Callable

import grpc

from .faults import CUT_DETAILS, OpenCall, OpenCalls, abort_call
from .store import EventStore

# How long a waiting subscription sleeps before re-checking its call without being woken.
# Wake-ups normally come from appends, cuts and the call's termination callback.
WAIT_SLICE_SECONDS = 1.0


class CallScope:
    """Ties one Read call's generator to its gRPC context and to `cut_subscriptions()`.

    A grpc sync server keeps iterating a response generator only while the generator
    yields; a subscription blocked waiting for events would otherwise hold its worker
    thread forever after the client went away. The termination callback wakes it.
    """

    def __init__(self, context: grpc.ServicerContext, store: EventStore, calls: OpenCalls):
        self._context = context
        self._store = store
        self._calls = calls
        self._call: OpenCall = calls.open()
        self._done = False
        context.add_callback(self._on_terminated)

    def _on_terminated(self) -> None:
        self._done = True
        self._store.wake_waiters()

    def close(self) -> None:
        self._calls.close(self._call)

    def check_cut(self) -> None:
        """Abort the call with UNAVAILABLE if `cut_subscriptions()` was called."""
        if self._call.cut:
            abort_call(self._context, grpc.StatusCode.UNAVAILABLE, CUT_DETAILS)

    def wait_until(self, ready: Callable[[], bool]) -> bool:
        """Block until `ready()` holds. False if the call ended (cancelled, deadline).

        `ready` runs under the store lock, so it must only read the store.
        """
        call = self._call
        while True:
            self._store.wait_for(
                lambda: call.cut or self._done or ready(), timeout=WAIT_SLICE_SECONDS
            )
            self.check_cut()
            if self._done or not self._context.is_active():
                return False
            if ready():
                return True
