"""Support for the EventStoreDB adapter: URI handling (parsed and masked by ``_uri``), Terret's
internal event types, the server-side filter regexes, and ``EsdbLog`` — what every reader of
``$all`` (the store's reads, its subscriptions) shares: the type filter, the head, and the streams
``delete_stream`` removed. Requests go through the connection (``_esdb_connection``).

Kept apart from ``eventstoredb.py`` so that the adapter reads as the port's operations.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import SplitResult, parse_qsl, urlsplit

from esdbclient import RecordedEvent
from esdbclient.connection_spec import ConnectionSpec

from terret.adapters.secret import Secret
from terret.adapters.stores._esdb_connection import EsdbConnection, log, refusal
from terret.adapters.stores._uri import check_esdb_uri, mask_credentials, secret_uri
from terret.domain.errors import CorruptRecord, InvalidStoreURI, shown
from terret.domain.store import StoredRecord

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
        raise InvalidStoreURI(f"invalid EventStoreDB URI {shown(masked)}: {exc}") from None
    if parts.scheme not in SCHEMES:
        raise InvalidStoreURI(
            f"invalid EventStoreDB URI {shown(masked)}: the scheme must be esdb:// or esdb+discover://"
        )
    check_esdb_uri(uri)  # credentials esdbclient cannot parse, a port that is no port
    uri = _with_defaults(uri, parts)
    # Shown as the operator wrote it (credentials masked), without the options added here.
    secret = secret_uri(uri, display=masked)
    _check_with_esdbclient(uri, secret)
    return secret


def _with_defaults(uri: str, parts: SplitResult) -> str:
    """The URI with each of ``DEFAULT_URI_OPTIONS`` it does not set itself."""
    given = {key.lower() for key, _ in parse_qsl(parts.query, keep_blank_values=True)}
    extra = [f"{k}={v}" for k, v in DEFAULT_URI_OPTIONS.items() if k.lower() not in given]
    if not extra:
        return uri
    base, _, fragment = uri.partition("#")
    joiner = "&" if parts.query else ("" if base.endswith("?") else "?")
    return base + joiner + "&".join(extra) + (f"#{fragment}" if fragment else "")


def _check_with_esdbclient(uri: str, secret: Secret) -> None:
    """Let esdbclient's own parser judge the rest now, so a bad URI fails at construction and
    not at the first append. Its messages quote the whole URI: scrub them."""
    try:
        spec = ConnectionSpec(uri)
    except ValueError as exc:
        # It quotes the URI once more: once, cut, is enough.
        message = secret.scrub(str(exc)).replace(f": {secret.masked}", "")
    else:
        _check_files(spec, secret)
        return
    # Outside the handler: the error does not carry esdbclient's unscrubbed one as its context.
    raise InvalidStoreURI(f"invalid EventStoreDB URI {shown(secret.masked)}: {message}")


def _check_files(spec: ConnectionSpec, secret: Secret) -> None:
    """The certificate and key files the URI names can be opened."""
    for name in ("TlsCaFile", "UserCertFile", "UserKeyFile"):
        path = getattr(spec.options, name)
        if path:
            try:
                with open(path, "rb"):
                    pass
            except OSError as exc:
                raise InvalidStoreURI(
                    f"invalid EventStoreDB URI {shown(secret.masked)}: {name} {path!r}: "
                    f"{exc.strerror}"
                ) from None


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

DELETIONS_STREAM = "terret-deletions"
"""Where ``delete_stream`` records what it removed (``DELETION_EVENT_TYPE``)."""

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


# --- what readers of $all share ----------------------------------------------------------------


class EsdbLog:
    """The log as readers of ``$all`` see it: which event types they deliver (``type_filter``),
    the head a default subscription could reach (``read_head``), and the streams
    ``delete_stream`` removed (by any process), learnt from the deletions stream — read, or
    received by a subscription (``note_deletion``). Shared by the store and its subscriptions."""

    def __init__(self, connection: EsdbConnection, *, catalogue_only: bool = False) -> None:
        self.connection = connection
        self.catalogue_only = catalogue_only
        self._deleted: set[str] = set()
        self._deleted_revision = -1  # the last revision of the deletions stream read
        self._lock = threading.Lock()

    def type_filter(self, wire_names: Collection[str] | None) -> TypeFilter:
        if wire_names is not None:
            return TypeFilter(frozenset(wire_names))
        return TypeFilter(default_wire_names() if self.catalogue_only else None)

    def head(self) -> int:
        """``read_head`` with the connection's retries."""
        return self.connection.run("read the head position", self.read_head)

    def read_head(self, client: Any, timeout: float) -> int:
        """One attempt at the position of the last event a default subscription could
        deliver (not the log's raw head: snapshots, deletion records and system events are
        never delivered, and the server sends checkpoints past them only now and then)."""
        kwargs = self.type_filter(None).server_filter(with_deletions=False)
        return int(client.get_commit_position(timeout=timeout, **kwargs))

    def deleted_streams(self, refresh: bool = True) -> frozenset[str]:
        """The streams known to be deleted; ``refresh`` reads what was recorded since the last
        read first (one small read)."""
        if refresh:
            self.connection.run("read the deletions", self.refresh_deletions)
        with self._lock:
            return frozenset(self._deleted)

    def refresh_deletions(self, client: Any, timeout: float) -> None:
        """One attempt at reading the deletions recorded since the last read."""
        with self._lock:
            after = self._deleted_revision
        try:
            events = client.get_stream(DELETIONS_STREAM,
                                       stream_position=after + 1 if after >= 0 else None,
                                       timeout=timeout)
        except Exception as exc:
            refused = refusal(exc, self.connection.uri)
            if refused is None or refused.kind != "missing":
                raise
            return  # nothing deleted yet
        for event in events:
            self.note_deletion(event)

    def note_deletion(self, event: RecordedEvent) -> str | None:
        """Learn a deletion from a record of the deletions stream (read or subscribed);
        the deleted stream's name, or None for a malformed record (ignored)."""
        try:
            stream = str(json.loads(event.data)["stream"])
        except (ValueError, KeyError, TypeError):
            log.warning("ignoring a malformed deletion record at %s", event.commit_position)
            return None
        with self._lock:
            self._deleted.add(stream)
            if event.stream_name == DELETIONS_STREAM:
                self._deleted_revision = max(self._deleted_revision, event.stream_position)
        return stream

    def noted(self, stream: str) -> None:
        """``stream`` was deleted by this process."""
        with self._lock:
            self._deleted.add(stream)
