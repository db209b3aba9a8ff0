"""One connection to EventStoreDB, shared by the store, its subscriptions and the worker registry
(as an httpx transport is shared by the requests of a client).

``EsdbConnection`` owns the ``esdbclient`` client (opened on first use), reconnects it (to the
leader a node names, or afresh after repeated unavailability) and runs each request with the
retry policy (``terret.adapters.retry``): ``run`` → attempts → ``StoreUnavailable`` past the
policy's time bound. It is also the one place that says what an esdbclient exception means:

* ``failure(exc)`` — a transport or server failure: transient (retried) or permanent;
* ``refusal(exc)`` — the server's answer to the request (a version conflict, a deleted or missing
  stream, an append over the size limit): never retried, raised to the caller as ``Refused``,
  which the store turns into Terret's errors or results.

Anything else (a programming error) passes through unchanged. Errors never quote the URI's
credentials: every text from esdbclient is scrubbed, and failures are re-raised outside the
``except`` block so that no esdbclient exception is chained to what a caller sees.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, NoReturn, TypeVar

import grpc
from esdbclient import EventStoreDBClient, StreamState
from esdbclient.exceptions import (
    AbortedByServer,
    AccessDeniedError,
    CancelledByClient,
    DeadlineExceeded,
    DiscoveryFailed,
    FailedPrecondition,
    GrpcError,
    MaximumAppendSizeExceededError,
    NodeIsNotLeader,
    NotFound,
    ServiceUnavailable,
    SSLError,
    StreamIsDeleted,
    UnknownError,
    WrongCurrentVersion,
)

from terret.adapters.retry import RetryPolicy
from terret.adapters.secret import Secret
from terret.domain.errors import StoreError, StoreUnavailable

log = logging.getLogger("terret.adapters.stores.eventstoredb")

T = TypeVar("T")
Op = Callable[[EventStoreDBClient, float], T]
"""One request: ``op(client, attempt_timeout)``."""


# --- what an exception means ----------------------------------------------------------------

_PERMANENT_CODES = {
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.UNIMPLEMENTED,
}


@dataclass(frozen=True, slots=True)
class Failure:
    """A classified failure of one attempt."""

    transient: bool
    reason: str
    leader: str | None = None  # the leader's host:port when the node said "not leader"
    reconnect: bool = False


def _details(exc: BaseException) -> str:
    """What went wrong, without gRPC's dump of the call (``<_MultiThreadedRendezvous …
    debug_error_string = …>``): the status's details when esdbclient wraps a gRPC error."""
    for candidate in (exc, *exc.args[:1]):
        details = getattr(candidate, "details", None)
        if isinstance(candidate, grpc.RpcError) and callable(details):
            try:
                text = details()
            except Exception:  # noqa: BLE001 - a call that cannot say: its text below
                continue
            if text:
                code = getattr(candidate, "code", None)
                status = code() if callable(code) else None
                name = getattr(status, "name", None)
                return f"{name}: {text}" if name else str(text)
    return str(exc)


def failure(exc: BaseException, uri: Secret) -> Failure | None:  # noqa: C901 - one table
    """How to react to an exception raised by esdbclient (or grpc under it). ``None``: it is
    not a transport or server failure (a refusal, a programming error). One flat table of
    exception types, in the order they must be tried (SSLError is a ServiceUnavailable, which is
    a GrpcError): its branches are its rows."""
    reason = f"{type(exc).__name__}: {uri.scrub(_details(exc)) or 'no details'}"
    if isinstance(exc, SSLError):
        # A TLS handshake that fails will fail again: a wrong CA file or host name.
        return Failure(False, f"TLS handshake failed ({reason}); check that the server speaks TLS "
                       "(Tls=false if it does not), TlsCaFile and the host")
    if isinstance(exc, AccessDeniedError):
        return Failure(False, f"access denied ({reason}); check the user's ACLs")
    if isinstance(exc, NodeIsNotLeader):
        try:
            leader = exc.leader_grpc_target
        except KeyError:  # a "not leader" answer without the leader's address
            leader = None
        return Failure(True, "the node is not the leader", leader=leader, reconnect=True)
    if isinstance(exc, ServiceUnavailable):
        return Failure(True, reason, reconnect=True)
    if isinstance(exc, DiscoveryFailed | DeadlineExceeded | AbortedByServer | UnknownError
                  | CancelledByClient):
        return Failure(True, reason)
    if isinstance(exc, GrpcError):
        code = _status_code(exc)
        if code in _PERMANENT_CODES:
            assert code is not None
            return Failure(False, f"the server refused the call with {code.name} ({reason})")
        return Failure(True, reason)
    if isinstance(exc, ValueError) and (
        "Channel closed" in str(exc) or "closed channel" in str(exc)
    ):
        # Another thread reconnected and closed the channel this call was using.
        return Failure(True, reason, reconnect=True)
    if isinstance(exc, grpc.RpcError):
        code = _status_code(exc) or getattr(exc, "code", lambda: None)()
        return Failure(code not in _PERMANENT_CODES, reason)
    return None


def _status_code(exc: BaseException) -> grpc.StatusCode | None:
    for arg in exc.args:
        if isinstance(arg, grpc.Call):
            try:
                return arg.code()
            except Exception:  # noqa: BLE001 - a half-built call object: unknown code
                return None
    return None


RefusalKind = Literal["conflict", "deleted", "missing", "too_large"]

_LAST_REVISION = re.compile(r"Stream position of last event is (\d+)")


class Refused(Exception):  # noqa: N818 - an answer, not a failure
    """The server refused a request: ``kind`` says why. ``actual`` (conflicts) is the stream's
    version if the server said it (None: unknown), ``limit`` (too large) the server's limit."""

    def __init__(self, kind: RefusalKind, text: str, *, actual: int | None = None,
                 limit: int | None = None) -> None:
        super().__init__(f"{kind}: {text}")
        self.kind: RefusalKind = kind
        self.actual = actual
        self.limit = limit


def refusal(exc: BaseException, uri: Secret) -> Refused | None:
    """The server's answer that ``exc`` carries, or None if it is no refusal."""
    text = uri.scrub(str(exc))
    if isinstance(exc, WrongCurrentVersion):
        match = _LAST_REVISION.search(text)
        if match:
            return Refused("conflict", text, actual=int(match.group(1)) + 1)
        return Refused("conflict", text, actual=0 if "does not exist" in text else None)
    if isinstance(exc, StreamIsDeleted) or (
            isinstance(exc, FailedPrecondition) and "is deleted" in text):
        # The unary Append RPC says StreamIsDeleted, BatchAppend a FailedPrecondition.
        return Refused("deleted", text)
    if isinstance(exc, NotFound):
        return Refused("missing", text)
    if isinstance(exc, MaximumAppendSizeExceededError):
        match = re.search(r"(\d+)", text)
        return Refused("too_large", text, limit=int(match.group(1)) if match else None)
    return None


# --- retries --------------------------------------------------------------------------------


# A long read (a catch-up subscription, a consumer group's read) that stayed up this long
# before it failed counts as recovered: its failure starts a fresh retry window (a load
# balancer cutting idle calls every minute is not a persistent fault). One that fails faster
# keeps the old window, so a server that accepts and drops every read at once still ends in
# StoreUnavailable.
STABLE_SECONDS = 1.0


class Reopening:
    """The retries of a long read that is opened again after each failure: the window (see
    ``STABLE_SECONDS``), the connection's recovery before the backoff, and a count of the
    reopenings. The subscription to ``$all`` and a consumer group's read share it."""

    def __init__(self, connection: EsdbConnection, retrier: Retrier) -> None:
        self._connection = connection
        self.retrier = retrier
        self._opened_at: float | None = None
        self.count = 0

    def opened(self) -> None:
        self._opened_at = time.monotonic()

    def received(self) -> None:
        """A message came through: the read works again, the next failure starts afresh."""
        if self.retrier.attempts:
            self.retrier.reset()

    def failed(self, found: Failure) -> None:
        """Back off before the read is opened again; raises ``StoreUnavailable`` when the
        retrier gives up."""
        if self._opened_at is not None and time.monotonic() - self._opened_at >= STABLE_SECONDS:
            self.retrier.reset()
        self._opened_at = None  # only the read that was up earns the fresh window
        self._connection.recover(found, self.retrier.attempts + 1)
        self.retrier.failed(found)
        self.count += 1


class Retrier:
    """Tracks one operation's consecutive failures against the policy's time bound.
    ``sleep`` waits between attempts (a subscription passes its stop event's ``wait`` so that
    ``stop()`` is not held up by a backoff)."""

    def __init__(self, policy: RetryPolicy, what: str, where: str,
                 sleep: Callable[[float], object] = time.sleep) -> None:
        self.policy = policy
        self._sleep = sleep
        self.what = what
        self.where = where
        self.started = time.monotonic()
        self.attempts = 0
        self.last_reason = ""

    def reset(self) -> None:
        self.started = time.monotonic()
        self.attempts = 0

    def attempt_timeout(self) -> float:
        return self.policy.attempt_timeout(self.started)

    def failed(self, found: Failure) -> None:
        """Record a failure; sleep before the next attempt, or raise ``StoreUnavailable``."""
        self.attempts += 1
        self.last_reason = found.reason
        if not found.transient:
            self.give_up(permanent=True)
        pause = self.policy.delay(self.attempts - 1)
        if self.policy.gives_up(self.attempts - 1, self.started, pause):
            self.give_up()
        # The first retry of an operation is said; the rest only at DEBUG: during an outage
        # every reader retries several times a second, and serve's log was a flood of them
        # (its WARNINGs say what gave up).
        (log.info if self.attempts == 1 else log.debug)(
            "%s on %s failed (%s); retry %d in %.2fs", self.what, self.where, found.reason,
            self.attempts, pause)
        self._sleep(pause)

    def give_up(self, permanent: bool = False) -> NoReturn:
        elapsed = time.monotonic() - self.started
        if permanent:
            message = f"{self.what} on {self.where} failed: {self.last_reason}"
        else:
            message = (f"{self.what} on {self.where} failed after {self.attempts} attempt(s) "
                       f"over {elapsed:.1f}s: {self.last_reason}")
        raise StoreUnavailable(message)


# --- the connection -------------------------------------------------------------------------


class EsdbConnection:
    """The client, its reconnects and the retries of every request to one EventStoreDB.

    ``uri`` is the prepared URI (``_esdb.prepare_uri``); ``policy`` bounds the retries
    (``timeout``) and each attempt (``call_timeout``)."""

    def __init__(self, uri: Secret, policy: RetryPolicy, *,
                 root_certificates: bytes | None = None) -> None:
        self.uri = uri
        self.policy = policy
        self._root_certificates = root_certificates
        self._lock = threading.Lock()
        self._client: EventStoreDBClient | None = None
        self._closed = False

    def describe(self) -> str:
        return f"eventstoredb {self.uri.masked}"

    @property
    def call_timeout(self) -> float:
        """The deadline of a single attempt (a subscription's or a probe's)."""
        assert self.policy.call_timeout is not None
        return self.policy.call_timeout

    def scrub(self, text: str) -> str:
        return self.uri.scrub(text)

    def client(self) -> EventStoreDBClient:
        """The client, created on first use. Creating it may gossip with the cluster
        (``esdb+discover://`` or several hosts), which can fail transiently: callers run it
        inside their retry loop."""
        client = self._client
        if client is not None:
            return client
        with self._lock:
            if self._closed:
                raise StoreUnavailable(f"{self.describe()} is closed")
            if self._client is None:
                self._client = EventStoreDBClient(
                    self.uri.reveal(), root_certificates=self._root_certificates)
            return self._client

    def failure(self, exc: BaseException) -> Failure | None:
        return failure(exc, self.uri)

    def retrier(self, what: str, sleep: Callable[[float], object] = time.sleep) -> Retrier:
        return Retrier(self.policy, what, self.describe(), sleep=sleep)

    def recover(self, found: Failure, attempts: int) -> None:
        """React to a transient failure before the next attempt: follow a "not leader" answer
        to the leader it names; after repeated unavailability, open a fresh channel (a gRPC
        channel in TRANSIENT_FAILURE keeps failing fast for its own growing backoff, and on a
        cluster URI reconnecting re-runs discovery). esdbclient's decorators already reconnect
        once inside a call; this covers calls they do not wrap (reads, subscriptions)."""
        client = self._client
        if client is None or not found.reconnect:
            return
        if found.leader is None and attempts < 2:
            return
        try:
            client.reconnect(found.leader)
        except Exception as exc:  # noqa: BLE001 - classified on the next attempt instead
            log.info("reconnect to %s failed: %s", self.describe(), self.scrub(str(exc)))

    def run(self, what: str, op: Op[T]) -> T:
        """``op(client, attempt_timeout)`` with bounded retries of transient failures; a
        refusal is raised as ``Refused``, a permanent failure or one that outlasts the policy
        as ``StoreUnavailable``; other exceptions (Terret's own errors) pass through."""
        retrier = self.retrier(what)
        while True:
            try:
                return op(self.client(), retrier.attempt_timeout())
            except Exception as exc:
                refused = refusal(exc, self.uri)
                found = failure(exc, self.uri) if refused is None else None
                if refused is None and found is None:
                    raise
            if refused is not None:
                raise refused  # outside the handler: nothing of esdbclient's chained to it
            assert found is not None
            self.recover(found, retrier.attempts + 1)
            retrier.failed(found)

    def call(self, what: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """``client.<method>(*args, timeout=…, **kwargs)`` through ``run``."""
        return self.run(what, lambda client, timeout: getattr(client, method)(
            *args, timeout=timeout, **kwargs))

    def read_metadata(self, what: str, stream: str) -> tuple[dict[str, Any], Any]:
        """A stream's metadata and the version of its metastream (``NO_STREAM`` when it has
        none), as ``get_stream_metadata`` returns them — read with ``get_stream`` of the
        metastream, because ``get_stream_metadata`` nests esdbclient's retrying decorators
        around it: against a server that is down, one attempt of it slept through sixteen
        tries (1.5 s), whatever ``--store-timeout`` said; this is four."""
        def read(client: EventStoreDBClient, timeout: float) -> tuple[dict[str, Any], Any]:
            try:
                found = client.get_stream(f"$${stream}", backwards=True, limit=1,
                                          timeout=timeout)
            except NotFound:
                return {}, StreamState.NO_STREAM
            return json.loads(found[0].data), found[0].stream_position

        return self.run(what, read)

    def update_metadata(self, stream: str, changes: dict[str, Any]) -> None:
        """Merge ``changes`` into a stream's metadata (``$maxCount``, ``$maxAge``, …), with
        optimistic concurrency on the metastream (another writer's keys are kept). A
        tombstoned stream needs no metadata: nothing is done."""
        for _ in range(5):
            try:
                metadata, version = self.read_metadata(f"read the metadata of {stream}",
                                                       stream)
            except Refused as refused:
                if refused.kind == "deleted":
                    return
                raise StoreError(f"the metadata of {stream!r}: {refused}") from None
            if all(metadata.get(k) == v for k, v in changes.items()):
                return
            try:
                self.call(f"set the metadata of {stream}", "set_stream_metadata", stream,
                          metadata={**metadata, **changes}, current_version=version)
                return
            except Refused as refused:
                if refused.kind == "deleted":
                    return
                if refused.kind != "conflict":
                    raise StoreError(f"the metadata of {stream!r}: {refused}") from None
                # someone else changed the metadata meanwhile: merge again
        raise StoreError(f"the metadata of {stream!r} kept changing; not updated")

    def close(self) -> None:
        with self._lock:
            self._closed = True
            client, self._client = self._client, None
        if client is not None:
            try:
                client.close()
            except Exception as exc:  # noqa: BLE001 - closing must not fail
                log.debug("closing %s: %s", self.describe(), self.scrub(str(exc)))
