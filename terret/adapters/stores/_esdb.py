"""Support for the EventStoreDB adapter: URI handling (parsed and masked by ``uri``),
the server-side filter regexes, how esdbclient's exceptions are classified, and the bounded
retry loop.

Kept apart from ``eventstoredb.py`` so that the adapter reads as the port's operations.
"""

from __future__ import annotations

import logging
import random
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar
from urllib.parse import parse_qsl, urlsplit

import grpc
from esdbclient import RecordedEvent
from esdbclient.exceptions import (
    AbortedByServer,
    AccessDeniedError,
    CancelledByClient,
    DeadlineExceeded,
    DiscoveryFailed,
    GrpcError,
    NodeIsNotLeader,
    ServiceUnavailable,
    SSLError,
    UnknownError,
)

from terret.adapters.secret import Secret
from terret.adapters.stores.uri import check_esdb_uri, mask_credentials, secret_uri
from terret.domain.errors import CorruptRecord, InvalidStoreURI, StoreUnavailable
from terret.domain.store import StoredRecord

log = logging.getLogger("terret.adapters.stores.eventstoredb")

T = TypeVar("T")

SCHEMES = ("esdb", "esdb+discover")

# esdbclient retries discovery 10 times with a 5 s gossip timeout each: close to a minute
# before a dead cluster is reported, far past any sensible ``retry_timeout``. Unless the URI
# says otherwise, discovery is tried once per attempt and *our* loop does the retrying, so the
# total time stays bounded by the store's own setting.
DEFAULT_URI_OPTIONS = {"MaxDiscoverAttempts": "1"}


# --- URIs and secrets -------------------------------------------------------------------------


def prepare_uri(uri: str) -> Secret:
    """Validate a URI for the adapter and add Terret's defaults; raises ``InvalidStoreURI``
    with the credentials masked."""
    masked = mask_credentials(uri)
    try:
        parts = urlsplit(uri)
    except ValueError as exc:
        raise InvalidStoreURI(f"invalid EventStoreDB URI {masked!r}: {exc}") from None
    if parts.scheme not in SCHEMES:
        raise InvalidStoreURI(
            f"invalid EventStoreDB URI {masked!r}: the scheme must be esdb:// or esdb+discover://"
        )
    check_esdb_uri(uri)  # credentials esdbclient cannot parse, a port that is no port
    given = {key.lower() for key, _ in parse_qsl(parts.query, keep_blank_values=True)}
    extra = [f"{k}={v}" for k, v in DEFAULT_URI_OPTIONS.items() if k.lower() not in given]
    if extra:
        base, _, fragment = uri.partition("#")
        joiner = "&" if parts.query else ("" if base.endswith("?") else "?")
        uri = base + joiner + "&".join(extra) + (f"#{fragment}" if fragment else "")
    # Shown as the operator wrote it (credentials masked), without the options added here.
    secret = secret_uri(uri, display=masked)
    # Let esdbclient's own parser judge the rest now, so a bad URI fails at construction and
    # not at the first append. Its messages quote the whole URI: scrub them.
    from esdbclient.connection_spec import ConnectionSpec

    try:
        spec = ConnectionSpec(uri)
    except ValueError as exc:
        message = secret.scrub(str(exc))
    else:
        for name in ("TlsCaFile", "UserCertFile", "UserKeyFile"):
            path = getattr(spec.options, name)
            if path:
                try:
                    with open(path, "rb"):
                        pass
                except OSError as exc:
                    raise InvalidStoreURI(
                        f"invalid EventStoreDB URI {secret.masked!r}: {name} {path!r}: "
                        f"{exc.strerror}"
                    ) from None
        return secret
    raise InvalidStoreURI(f"invalid EventStoreDB URI {secret.masked!r}: {message}")


# --- server-side filters ----------------------------------------------------------------------

# Characters with a meaning in .NET regular expressions (the server compiles the filter with
# System.Text.RegularExpressions). Escaping only these keeps wire names like "turn/start"
# readable in the request and avoids escapes .NET does not know.
_REGEX_SPECIAL = set("\\^$.|?*+()[]{}#")


def dotnet_escape(name: str) -> str:
    return "".join("\\" + ch if ch in _REGEX_SPECIAL or ch.isspace() else ch for ch in name)


def include_pattern(wire_names: Iterable[str]) -> str:
    """The single pattern to pass as ``filter_include``: esdbclient wraps it in ``^…$``, so
    the server receives ``^(a|b|c)$``. Without the group, ``^a|b$`` would match any type that
    merely *starts* with a or *ends* with b (the server uses search semantics)."""
    names = sorted(set(wire_names))
    if not names:
        # An empty set matches nothing; "(?!)" never matches, in .NET as in Python.
        return "(?!)"
    return "(" + "|".join(dotnet_escape(n) for n in names) + ")"


SNAPSHOT_EVENT_TYPE = "terret-snapshot"
"""Snapshots (in ``snapshot-<stream>``): never delivered by reads of ``$all``."""

DELETION_EVENT_TYPE = "terret-stream-deleted"
"""A record of ``delete_stream`` (in the deletions stream). Subscriptions and reads of ``$all``
receive it to learn which streams are gone; they never deliver it."""

WORKER_EVENT_TYPE = "terret-worker-beat"
"""Worker heartbeats (in ``terret-workers``): never delivered by reads of ``$all``."""

INTERNAL_EVENT_TYPES = frozenset({SNAPSHOT_EVENT_TYPE, DELETION_EVENT_TYPE, WORKER_EVENT_TYPE})

# Types the server writes for itself: "$metadata", "$streamDeleted", "$>", projections'
# "$…" housekeeping, and the persistent subscriptions' "PersistentConfig1"
# (esdbclient's DEFAULT_EXCLUDE_FILTER).
_SYSTEM_TYPE = re.compile(r"^(\$.*|PersistentConfig\d+)$")
_SYSTEM_PATTERNS = (r"\$.*", r"PersistentConfig\d+")


@dataclass(frozen=True, slots=True)
class TypeFilter:
    """Which events a read of ``$all`` delivers, and the server-side filter that selects them.

    ``names`` None means every application event: everything but the server's system events
    and Terret's internal ones (so events of unknown wire names, written by a newer version or
    an extension not installed here, are delivered too). The server-side filter also lets
    deletion records through (``with_deletions``): readers use them, never deliver them."""

    names: frozenset[str] | None

    def server_filter(self, with_deletions: bool = True) -> dict[str, Any]:
        if self.names is None:
            excluded = [*_SYSTEM_PATTERNS, dotnet_escape(SNAPSHOT_EVENT_TYPE),
                        dotnet_escape(WORKER_EVENT_TYPE)]
            if not with_deletions:
                excluded.append(dotnet_escape(DELETION_EVENT_TYPE))
            return {"filter_exclude": excluded, "filter_include": ()}
        names = set(self.names) - INTERNAL_EVENT_TYPES
        if with_deletions:
            names.add(DELETION_EVENT_TYPE)
        return {"filter_include": [include_pattern(names)], "filter_exclude": ()}

    def delivers(self, wire_name: str) -> bool:
        if wire_name in INTERNAL_EVENT_TYPES:
            return False
        if self.names is None:
            return _SYSTEM_TYPE.match(wire_name) is None
        return wire_name in self.names


# --- failures ---------------------------------------------------------------------------------

_PERMANENT_CODES = {
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.UNIMPLEMENTED,
}


def _status_code(exc: BaseException) -> grpc.StatusCode | None:
    for arg in exc.args:
        if isinstance(arg, grpc.Call):
            try:
                return arg.code()
            except Exception:  # noqa: BLE001 - a half-built call object: unknown code
                return None
    return None


@dataclass(frozen=True, slots=True)
class Failure:
    """A classified failure of one attempt."""

    transient: bool
    reason: str
    leader: str | None = None  # the leader's host:port when the node said "not leader"
    reconnect: bool = False


def classify(exc: BaseException, uri: Secret) -> Failure | None:
    """How to react to an exception raised by esdbclient (or grpc under it). ``None``: it is
    not a transport or server failure (a programming error, or something the caller maps)."""
    reason = f"{type(exc).__name__}: {uri.scrub(str(exc)) or 'no details'}"
    if isinstance(exc, SSLError):
        # A TLS handshake that fails will fail again: a wrong CA file or host name.
        return Failure(False, f"TLS handshake failed ({reason}); check TlsCaFile and the host")
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
    if isinstance(exc, DiscoveryFailed):
        return Failure(True, reason)
    if isinstance(exc, DeadlineExceeded | AbortedByServer | UnknownError | CancelledByClient):
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
        if code in _PERMANENT_CODES:
            return Failure(False, reason)
        return Failure(True, reason)
    return None


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """``timeout``: how long one operation may keep failing before ``StoreUnavailable``;
    ``call_timeout``: the gRPC deadline of one attempt (capped by what is left of ``timeout``,
    never below ``min_call_timeout``); backoff doubles from ``initial_backoff`` to
    ``max_backoff`` with jitter."""

    timeout: float = 10.0
    call_timeout: float = 5.0
    min_call_timeout: float = 0.5
    initial_backoff: float = 0.05
    max_backoff: float = 1.0

    def backoff(self, attempt: int) -> float:
        base = min(self.max_backoff, self.initial_backoff * (2 ** max(0, attempt - 1)))
        # Jitter so that many clients cut off at once do not come back in lock step.
        return base * (0.5 + random.random() / 2)


class Retrier:
    """Tracks one operation's consecutive failures against the policy's time bound.
    ``sleep`` waits between attempts (a subscription passes its stop event's ``wait`` so that
    ``stop()`` is not held up by a backoff)."""

    def __init__(
        self,
        policy: RetryPolicy,
        what: str,
        where: str,
        sleep: Callable[[float], object] = time.sleep,
    ) -> None:
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
        left = self.started + self.policy.timeout - time.monotonic()
        return max(self.policy.min_call_timeout, min(self.policy.call_timeout, left))

    def failed(self, failure: Failure) -> None:
        """Record a failure; sleep before the next attempt, or raise ``StoreUnavailable``."""
        self.attempts += 1
        self.last_reason = failure.reason
        if not failure.transient:
            self.give_up(permanent=True)
        pause = self.policy.backoff(self.attempts)
        elapsed = time.monotonic() - self.started
        if elapsed + pause > self.policy.timeout:
            self.give_up()
        log.info(
            "%s on %s failed (%s); retry %d in %.2fs",
            self.what,
            self.where,
            failure.reason,
            self.attempts,
            pause,
        )
        self._sleep(pause)

    def give_up(self, permanent: bool = False) -> NoReturn:
        elapsed = time.monotonic() - self.started
        if permanent:
            message = f"{self.what} on {self.where} failed: {self.last_reason}"
        else:
            message = (
                f"{self.what} on {self.where} failed after {self.attempts} attempt(s) over "
                f"{elapsed:.1f}s: {self.last_reason}"
            )
        raise StoreUnavailable(message)


# --- records ----------------------------------------------------------------------------------


def default_wire_names() -> frozenset[str]:
    """Every wire name registered in the process-wide catalogue (Terret's and extensions'),
    read at call time so that an extension registered later is part of later reads."""
    import terret.domain  # noqa: F401 - importing the package registers Terret's own events
    from terret.domain.catalogue import catalogue

    return catalogue.wire_names()


def to_stored(event: RecordedEvent) -> StoredRecord:
    position = event.commit_position
    if position is None:
        # Servers before 22.10 leave stream reads without positions; Terret needs them.
        raise CorruptRecord(0, f"{event.stream_name}@{event.stream_position} has no position")
    return StoredRecord(
        stream=event.stream_name,
        seq=event.stream_position + 1,
        position=position,
        event_id=event.id,
        wire_name=event.type,
        data=event.data,
        metadata=event.metadata,
        recorded_at=event.recorded_at.timestamp() if event.recorded_at is not None else 0.0,
    )
