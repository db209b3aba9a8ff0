"""Fault injection: failing calls, "not leader" redirects, and cutting open read streams.

Tests use these to drive esdbclient's retry/reconnect decorators against the emulator.
Everything here is thread-safe: tests call it while the server's worker threads run.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NoReturn

import grpc

# Short names accepted by `methods=`; "Read" means Streams.Read, not Gossip.Read.
METHOD_ALIASES = {
    "Read": "Streams.Read",
    "Append": "Streams.Append",
    "BatchAppend": "Streams.BatchAppend",
    "Delete": "Streams.Delete",
    "Tombstone": "Streams.Tombstone",
    "List": "PersistentSubscriptions.List",
    "Gossip": "Gossip.Read",
}
ALL_METHODS = frozenset(METHOD_ALIASES.values())
# Gossip is answered by every node, leader or not; the rest honour `requires-leader`.
LEADER_CHECKED_METHODS = ALL_METHODS - {"Gossip.Read"}

INJECTED_DETAILS = "Emulator: injected fault"
CUT_DETAILS = "Emulator: subscription cut"


def abort_call(
    context: grpc.ServicerContext,
    code: grpc.StatusCode,
    details: str,
    trailers: tuple[tuple[str, str], ...] = (),
) -> NoReturn:
    """End the call with a status. Trailers are set first so that they are sent with it."""
    if trailers:
        context.set_trailing_metadata(trailers)
    context.abort(code, details)
    raise AssertionError("grpc.ServicerContext.abort returned")  # it always raises


@dataclass(frozen=True, slots=True)
class Fault:
    """How one call is to fail."""

    code: grpc.StatusCode
    details: str
    trailers: tuple[tuple[str, str], ...] = ()

    def abort(self, context: grpc.ServicerContext) -> NoReturn:
        abort_call(context, self.code, self.details, self.trailers)


@dataclass(slots=True)
class _Rule:
    remaining: int
    methods: frozenset[str]
    fault: Fault
    leader_only: bool  # only calls sent with `requires-leader: true`


def normalise_methods(methods: Iterable[str] | None) -> frozenset[str]:
    if methods is None:
        return ALL_METHODS
    if isinstance(methods, str):
        methods = [methods]
    names = set()
    for name in methods:
        qualified = METHOD_ALIASES.get(name, name)
        if qualified not in ALL_METHODS:
            raise ValueError(f"unknown method {name!r}; use one of {sorted(METHOD_ALIASES)}")
        names.add(qualified)
    return frozenset(names)


class FaultInjector:
    """A FIFO of rules; each call consumes at most one matching rule."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rules: list[_Rule] = []

    def fail_next(
        self,
        n: int,
        code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE,
        methods: Iterable[str] | None = None,
        details: str = INJECTED_DETAILS,
    ) -> None:
        self._add(_Rule(n, normalise_methods(methods), Fault(code, details), leader_only=False))

    def not_leader(
        self, n: int, host: str, port: int, methods: Iterable[str] | None = None
    ) -> None:
        # Exactly what a follower sends (wire notes §1.4); esdbclient reads the trailers.
        fault = Fault(
            grpc.StatusCode.NOT_FOUND,
            "Leader info available",
            (
                ("exception", "not-leader"),
                ("leader-endpoint-host", host),
                ("leader-endpoint-port", str(port)),
            ),
        )
        methods_set = normalise_methods(methods) & LEADER_CHECKED_METHODS
        self._add(_Rule(n, methods_set, fault, leader_only=True))

    def reset(self) -> None:
        with self._lock:
            self._rules.clear()

    def take(self, method: str, requires_leader: bool) -> Fault | None:
        """The fault for this call of `method` (qualified name), consuming one use."""
        with self._lock:
            for rule in self._rules:
                if method not in rule.methods or (rule.leader_only and not requires_leader):
                    continue
                rule.remaining -= 1
                if rule.remaining <= 0:
                    self._rules.remove(rule)
                return rule.fault
        return None

    def _add(self, rule: _Rule) -> None:
        if rule.remaining <= 0:
            return
        with self._lock:
            self._rules.append(rule)


class OpenCall:
    """An open Read call; `cut` asks its generator to abort with UNAVAILABLE."""

    __slots__ = ("cut",)

    def __init__(self) -> None:
        self.cut = False


class OpenCalls:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: set[OpenCall] = set()

    def open(self) -> OpenCall:
        call = OpenCall()
        with self._lock:
            self._calls.add(call)
        return call

    def close(self, call: OpenCall) -> None:
        with self._lock:
            self._calls.discard(call)

    def cut_all(self) -> int:
        with self._lock:
            calls = list(self._calls)
        for call in calls:
            call.cut = True
        return len(calls)

    def __len__(self) -> int:
        with self._lock:
            return len(self._calls)
