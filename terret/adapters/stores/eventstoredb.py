"""The EventStoreDB / KurrentDB store, on ``esdbclient.EventStoreDBClient`` (gRPC).

Mapping of the port onto the server:

* a Terret stream is an EventStoreDB stream of the same name (``session-<uuid>``, so the
  server's ``$ce-session`` category works); ``seq`` = stream revision + 1, so a stream's
  version is its last revision + 1 and ``NO_STREAM`` is version 0;
* an event's type is its wire name, its data the JSON payload, its custom metadata the record's
  metadata bytes, and its id the record's ``event_id``, fixed before the first attempt: the
  server treats a repeated append of the same ids at the same expected version as idempotent,
  so a retry after an unknown outcome never writes twice (R7);
* positions are ``$all`` commit positions; reads and subscriptions of ``$all`` carry a
  server-side event-type filter: the wire names asked for, or by default every application
  event (all but the server's ``$`` system events and Terret's internal types); a
  subscription to some streams carries a stream-name filter instead (their names and the
  deletions stream's) and filters on types itself;
* snapshots live in ``snapshot-<stream>`` (type ``terret-snapshot``, ``$maxCount: 1``), outside
  every filter;
* the store's identity (``store_id``) is in the metadata of the ``terret-store`` stream,
  written by the first Terret that asks for it;
* retention: ``set_max_age`` writes ``$maxAge`` into the stream's metadata; ``delete_stream``
  records the deletion in ``terret-deletions`` and then *tombstones* the stream and its
  snapshot stream. A reaped session can never be written again. ``$all`` keeps a tombstoned
  stream's events until the server's next scavenge, so readers of ``$all`` skip the streams the
  deletions stream names: deleted events are gone from ``read_all`` and subscriptions at once.

Every request goes through the store's ``EsdbConnection`` (``_esdb_connection``), shared with
its subscriptions and its worker registry: it owns the client, reconnects it, retries transient
failures (unavailable node, "not leader", deadline, dropped subscription) with backoff for at
most ``retry_timeout`` seconds before ``StoreUnavailable``, and says what each of esdbclient's
exceptions means. The connection URI's credentials never appear in ``describe()``, ``repr``,
logs or errors.
"""

from __future__ import annotations

import atexit
import json
import sys
import time
import weakref
from collections.abc import Collection, Sequence
from typing import Any
from uuid import UUID, uuid4

from esdbclient import NewEvent, RecordedEvent
from esdbclient import StreamState as EsdbStreamState

from terret.adapters.retry import RetryPolicy
from terret.adapters.stores._esdb import (
    DELETION_EVENT_TYPE,
    DELETIONS_STREAM,
    SNAPSHOT_EVENT_TYPE,
    EsdbLog,
    TypeFilter,
    prepare_uri,
    to_stored,
)
from terret.adapters.stores._esdb_connection import EsdbConnection, Refused
from terret.adapters.stores._esdb_group import EsdbConsumerGroup
from terret.adapters.stores._esdb_subscription import EsdbSubscription, SubscriptionOptions
from terret.adapters.stores._esdb_workers import EsdbWorkers
from terret.adapters.stores._rules import check_size
from terret.domain.errors import (
    CorruptRecord,
    PayloadTooLarge,
    StoreError,
    StreamDeleted,
    WrongExpectedVersion,
)
from terret.domain.store import (
    MAX_RECORD_BYTES,
    AppendResult,
    EventStore,
    ExpectedVersion,
    GroupReader,
    NewRecord,
    StoredRecord,
    StreamState,
    Subscription,
    record_size,
)
from terret.domain.workers import WorkerRegistry

__all__ = ["DELETIONS_STREAM", "SNAPSHOT_PREFIX", "STORE_ID_KEY", "STORE_STREAM",
           "EventStoreDBStore"]

SNAPSHOT_PREFIX = "snapshot-"
STORE_STREAM = "terret-store"
"""Its stream metadata holds the store's id (``STORE_ID_KEY``); the stream has no events."""
STORE_ID_KEY = "terretStoreId"
READ_CHUNK = 4096
"""The most events one read request of ``$all`` asks for (a page larger is several requests)."""


class EventStoreDBStore(EventStore):
    """``EventStoreDBStore("esdb://localhost:2113?Tls=false")``.

    Options:

    * ``retry_timeout`` — seconds an operation may keep failing transiently before
      ``StoreUnavailable`` (default 10); ``call_timeout`` — gRPC deadline of one attempt
      (default 5); ``backoff_initial`` / ``backoff_max`` — pauses between attempts;
    * ``catalogue_only`` — when a read or subscription names no wire names, deliver only the
      catalogue's (Terret's and registered extensions') instead of every application event;
      for a database shared with other applications;
    * ``window_size`` / ``checkpoint_interval_multiplier`` — server-side filter paging: the
      server sends a checkpoint every window × multiplier events considered;
    * ``idle_checkpoint_after`` — a caught-up subscription that received nothing for this many
      seconds asks the server whether it may checkpoint past filtered-out events;
    * ``subscription_buffer`` — events a subscription prefetches ahead of its consumer;
    * ``max_append_bytes`` — the server's ``--max-append-size`` (default 1 MiB);
    * ``root_certificates`` — PEM bytes, instead of ``TlsCaFile`` in the URI.
    """

    native_expiry = True  # $maxAge

    def __init__(
        self,
        uri: str,
        *,
        retry_timeout: float = 10.0,
        call_timeout: float = 5.0,
        backoff_initial: float = 0.05,
        backoff_max: float = 1.0,
        catalogue_only: bool = False,
        window_size: int = 64,
        checkpoint_interval_multiplier: int = 2,
        idle_checkpoint_after: float = 0.5,
        subscription_buffer: int = 10_000,
        max_append_bytes: int = MAX_RECORD_BYTES,
        root_certificates: bytes | None = None,
    ) -> None:
        policy = RetryPolicy(backoff_base=backoff_initial, backoff_cap=backoff_max, jitter=0.5,
                             timeout=retry_timeout, call_timeout=call_timeout,
                             min_call_timeout=min(0.5, call_timeout))
        self.connection = EsdbConnection(prepare_uri(uri), policy,
                                         root_certificates=root_certificates)
        self.log = EsdbLog(self.connection, catalogue_only=catalogue_only)
        self.options = SubscriptionOptions(
            window_size=window_size,
            checkpoint_interval_multiplier=checkpoint_interval_multiplier,
            idle_checkpoint_after=idle_checkpoint_after)
        self.subscription_buffer = subscription_buffer
        self.max_append_bytes: int = max_append_bytes
        self._subscriptions: weakref.WeakSet[EsdbSubscription] = weakref.WeakSet()
        self._groups: weakref.WeakSet[EsdbConsumerGroup] = weakref.WeakSet()
        self._store_id: str | None = None
        self._workers: WorkerRegistry | None = None
        _OPEN.add(self)

    @property
    def retry(self) -> RetryPolicy:
        """The retry policy of every request (``timeout``, ``call_timeout``, backoff)."""
        return self.connection.policy

    @property
    def catalogue_only(self) -> bool:
        return self.log.catalogue_only

    # --- description -----------------------------------------------------------------------

    def describe(self) -> str:
        return self.connection.describe()

    def __repr__(self) -> str:
        return f"EventStoreDBStore({self.connection.uri.masked!r})"

    # --- identity --------------------------------------------------------------------------

    def store_id(self) -> str:
        """The id in the metadata of ``terret-store`` (``STORE_ID_KEY``), written by the first
        Terret to ask (with an expected version, so racing processes agree on one). Stream
        metadata is a ``$metadata`` event in ``$$terret-store``: a system event, which no read
        of ``$all`` delivers and which does not move the head. A copy of the database (a
        backup) keeps it; another server has its own."""
        if self._store_id is not None:
            return self._store_id
        for _ in range(5):
            metadata, version = self.connection.read_metadata("read the store id",
                                                              STORE_STREAM)
            found = metadata.get(STORE_ID_KEY)
            if isinstance(found, str) and found:
                self._store_id = found
                return found
            try:
                self.connection.call("write the store id", "set_stream_metadata", STORE_STREAM,
                                     metadata={**metadata, STORE_ID_KEY: uuid4().hex},
                                     current_version=version)
            except Refused as refused:
                if refused.kind != "conflict":
                    raise StoreError(f"{STORE_STREAM}: {refused}") from None
                # another process wrote it first: read theirs
        raise StoreError(f"the metadata of {STORE_STREAM!r} kept changing; no store id")

    # --- appends ---------------------------------------------------------------------------

    def append(
        self, stream: str, records: Sequence[NewRecord], expected_version: ExpectedVersion
    ) -> AppendResult:
        what, total = self._check_size(records)
        if not records:
            return self._append_nothing(stream, expected_version)
        if isinstance(expected_version, int) and expected_version < 0:
            raise WrongExpectedVersion(stream, expected_version, self.stream_version(stream))
        events = [
            NewEvent(type=r.wire_name, data=r.data, metadata=r.metadata,
                     content_type="application/json", id=r.event_id)
            for r in records
        ]
        # One event goes by the Append RPC, a batch by BatchAppend (both atomic). Append is
        # the cheaper call (a client stream and one reply, where BatchAppend opens a duplex
        # stream) and single-event appends are most of what a session writes.
        try:
            position: int = self.connection.call(
                f"append to {stream}", "append_to_stream", stream,
                current_version=_to_esdb_version(expected_version),
                events=events[0] if len(events) == 1 else events)
        except Refused as refused:
            raise self._refused_append(refused, stream, expected_version, what, total) \
                from None
        if expected_version is StreamState.ANY:
            return AppendResult(position, self._version_at(stream, position))
        # With an exact expected version the new version follows; an idempotent repeat gets
        # the original append's result, as the port requires (R7).
        base = 0 if expected_version is StreamState.NO_STREAM else expected_version
        assert isinstance(base, int)
        return AppendResult(position, base + len(records))

    def _check_size(self, records: Sequence[NewRecord]) -> tuple[str, int]:
        """What the append is (for errors) and its size as the server counts it (data +
        metadata + the type in UTF-16); ``PayloadTooLarge`` before anything is sent."""
        check_size(records, self.max_record_bytes)
        total = sum(map(record_size, records))
        what = f"{records[0].wire_name} (batch of {len(records)})" if records else ""
        if total > self.max_append_bytes:
            # The server limits a whole append, not only one record; refusing here gives the
            # same error as the other adapters instead of a server-side rejection.
            raise PayloadTooLarge(what, total, self.max_append_bytes)
        return what, total

    def _refused_append(self, refused: Refused, stream: str, expected: ExpectedVersion,
                        what: str, total: int) -> StoreError:
        if refused.kind == "conflict":
            return self._conflict(stream, expected, refused.actual)
        if refused.kind == "deleted":
            return StreamDeleted(f"stream {stream!r} was deleted")
        if refused.kind == "too_large":
            return PayloadTooLarge(what, total, refused.limit or MAX_RECORD_BYTES)
        return StoreError(f"append to {stream}: {refused}")

    def _append_nothing(self, stream: str, expected: ExpectedVersion) -> AppendResult:
        version = self.stream_version(stream)
        wanted = 0 if expected is StreamState.NO_STREAM else expected
        if isinstance(wanted, int) and wanted != version:
            raise WrongExpectedVersion(stream, wanted, version)
        last = self.read_stream(stream, backwards=True, limit=1)
        return AppendResult(last[0].position if last else 0, version)

    def _conflict(self, stream: str, expected: ExpectedVersion, actual: int | None
                  ) -> WrongExpectedVersion:
        shown: object = 0 if expected is StreamState.NO_STREAM else expected
        if expected is StreamState.ANY:
            shown = "any"
        return WrongExpectedVersion(stream, shown,
                                    actual if actual is not None else self.stream_version(stream))

    def _version_at(self, stream: str, position: int) -> int:
        """The seq of the event at ``position`` (the last one an ``ANY`` append wrote, or, for
        an idempotent repeat, the last one the original append wrote)."""

        def op(client: Any, timeout: float) -> RecordedEvent | None:
            with client.read_all(
                commit_position=position, filter_exclude=(), limit=1, timeout=timeout
            ) as events:
                for event in events:
                    return event  # type: ignore[no-any-return]
            return None

        event = self.connection.run(f"read the event at {position}", op)
        if event is not None and event.stream_name == stream:
            return event.stream_position + 1
        return self.stream_version(stream)

    # --- retention -------------------------------------------------------------------------

    def delete_stream(self, stream: str) -> None:
        # Recorded first: if the process dies before the tombstone, the stream already reads
        # as deleted in $all, and running delete_stream again finishes the job.
        record = NewEvent(
            type=DELETION_EVENT_TYPE,
            data=json.dumps({"stream": stream, "at": time.time()}).encode(),
            id=uuid4(),
        )
        try:
            self.connection.call(f"record the deletion of {stream}", "append_to_stream",
                                 DELETIONS_STREAM, current_version=EsdbStreamState.ANY,
                                 events=[record])
        except Refused as refused:
            raise StoreError(f"{DELETIONS_STREAM}: {refused}") from None
        self.log.noted(stream)
        for name in (stream, _snapshot_stream(stream)):
            try:
                self.connection.call(f"delete {name}", "tombstone_stream", name,
                                     current_version=EsdbStreamState.ANY)
            except Refused as refused:
                if refused.kind not in ("deleted", "missing"):
                    raise StoreError(f"delete {name}: {refused}") from None
                # already gone: deleting is idempotent

    def deleted_streams(self, refresh: bool = True) -> frozenset[str]:
        """Streams ``delete_stream`` removed (by any process), read from the deletions stream;
        ``refresh`` reads what was recorded since the last call (one small read)."""
        return self.log.deleted_streams(refresh)

    def set_max_age(self, stream: str, seconds: int) -> None:
        if seconds <= 0:
            raise ValueError(f"max age must be positive, not {seconds}")
        # The snapshot stream expires with its session, or it would outlive the events.
        for name in (stream, _snapshot_stream(stream)):
            self.connection.update_metadata(name, {"$maxAge": int(seconds)})

    def max_age(self, stream: str) -> int | None:
        try:
            metadata, _ = self.connection.read_metadata(f"read the metadata of {stream}", stream)
        except Refused as refused:
            if refused.kind == "deleted":
                return None
            raise StoreError(f"the metadata of {stream!r}: {refused}") from None
        seconds = metadata.get("$maxAge")
        return seconds if isinstance(seconds, int) and not isinstance(seconds, bool) else None

    def workers(self) -> WorkerRegistry:
        if self._workers is None:
            self._workers = EsdbWorkers(self.connection)
        return self._workers

    # --- snapshots -------------------------------------------------------------------------

    def write_snapshot(self, stream: str, version: int, state: bytes) -> None:
        name = _snapshot_stream(stream)
        check_size([NewRecord(UUID(int=0), SNAPSHOT_EVENT_TYPE, state)], self.max_record_bytes)
        for _ in range(5):
            current = self._latest_snapshot(name)
            if current is not None and current[0] >= version:
                return  # never replace a snapshot with an older one
            if current is None:
                self.connection.update_metadata(name, {"$maxCount": 1})
            expected: int | EsdbStreamState = (
                current[2] if current is not None else EsdbStreamState.NO_STREAM
            )
            event = NewEvent(
                type=SNAPSHOT_EVENT_TYPE,
                data=state,
                metadata=json.dumps({"version": version}).encode(),
                content_type="application/octet-stream",
            )
            try:
                self.connection.call(f"write a snapshot of {stream}", "append_to_stream", name,
                                     current_version=expected, events=[event])
                return
            except Refused as refused:
                if refused.kind == "deleted":
                    return  # the session was deleted: nothing to keep
                if refused.kind != "conflict":
                    raise StoreError(f"write a snapshot of {stream}: {refused}") from None
                # a concurrent snapshot: compare versions again

    def read_snapshot(self, stream: str) -> tuple[int, bytes] | None:
        current = self._latest_snapshot(_snapshot_stream(stream))
        return (current[0], current[1]) if current is not None else None

    def _latest_snapshot(self, name: str) -> tuple[int, bytes, int] | None:
        """(version, state, revision) of the latest snapshot in ``name``."""
        events = self._read(f"read {name}", name, backwards=True, limit=1)
        if not events:
            return None
        event = events[0]
        try:
            version = int(json.loads(event.metadata)["version"])
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptRecord(event.commit_position or 0, f"snapshot metadata: {exc}") from None
        return version, event.data, event.stream_position

    # --- reads -----------------------------------------------------------------------------

    def _read(self, what: str, stream: str, **kwargs: Any) -> Sequence[RecordedEvent]:
        """``get_stream``; unknown, soft-deleted and tombstoned streams all read as empty (the
        port's rule; appending to a tombstoned one raises ``StreamDeleted``)."""
        try:
            events: Sequence[RecordedEvent] = self.connection.call(
                what, "get_stream", stream, **kwargs)
        except Refused as refused:
            if refused.kind in ("missing", "deleted"):
                return ()
            raise StoreError(f"{what}: {refused}") from None
        return events

    def read_stream(
        self,
        stream: str,
        *,
        from_seq: int | None = None,
        backwards: bool = False,
        limit: int | None = None,
    ) -> list[StoredRecord]:
        if limit is not None and limit <= 0:
            return []
        revision: int | None = None
        if from_seq is not None:
            if backwards and from_seq < 1:
                return []
            revision = max(from_seq, 1) - 1
        events = self._read(f"read {stream}", stream, stream_position=revision,
                            backwards=backwards,
                            limit=limit if limit is not None else sys.maxsize)
        return [to_stored(e) for e in events]

    def stream_version(self, stream: str) -> int:
        def op(client: Any, timeout: float) -> int:
            try:
                current = client.get_current_version(stream, timeout=timeout)
            except IndexError:
                # The stream exists but every event expired ($maxAge) or was truncated: its
                # revision cannot be read back. Only closed sessions are given a max age.
                return 0
            return 0 if current is EsdbStreamState.NO_STREAM else int(current) + 1

        try:
            return self.connection.run(f"read the version of {stream}", op)
        except Refused as refused:
            if refused.kind == "deleted":
                return 0
            raise StoreError(f"read the version of {stream}: {refused}") from None

    def head_position(self) -> int:
        """The position of the last event a default subscription could deliver.

        Not the log's raw head: snapshots, deletion records and system events are never
        delivered, and EventStoreDB sends checkpoints past them only now and then, so waiting
        for such a position could take long."""
        return self.log.head()

    def read_all(
        self, *, after: int = 0, limit: int = 1000, wire_names: Collection[str] | None = None
    ) -> list[StoredRecord]:
        if limit <= 0:
            return []
        type_filter = self.log.type_filter(wire_names)
        server_filter = type_filter.server_filter()
        deleted = set(self.log.deleted_streams())
        out: list[StoredRecord] = []
        cursor = after
        # A page can come back short of ``limit`` after deleted streams' events are dropped:
        # read on from the last position seen until the page is full or the log ends.
        while len(out) < limit:
            # At most READ_CHUNK events a request: a request's deadline is the same whatever
            # its size, and a rebuild's page of 40,000 events from a busy server outran it.
            want = min(limit - len(out) + 1, READ_CHUNK)
            received, page = self._read_page(cursor, want, server_filter)
            self._take_page(page, out, deleted, type_filter)
            if received < want or not page:
                break  # the end of the log
            cursor = page[-1].commit_position or cursor
        return out[:limit]

    def _read_page(
        self, cursor: int, want: int, server_filter: dict[str, Any]
    ) -> tuple[int, list[RecordedEvent]]:
        """Up to ``want`` events of ``$all`` from ``cursor``: how many the server sent, and
        those after ``cursor``."""

        def op(client: Any, timeout: float) -> tuple[int, list[RecordedEvent]]:
            # A forward read of $all from P *includes* the event at P: the caller asks for one
            # more.
            with client.read_all(
                commit_position=cursor if cursor > 0 else None,
                limit=want,
                timeout=max(timeout, self.connection.call_timeout),
                **server_filter,
            ) as events:
                got = list(events)
            return len(got), [e for e in got if (e.commit_position or 0) > cursor]

        return self.connection.run("read $all", op)

    def _take_page(
        self,
        page: list[RecordedEvent],
        out: list[StoredRecord],
        deleted: set[str],
        type_filter: TypeFilter,
    ) -> None:
        """Add a page's records to ``out``, leaving out deleted streams' (``deleted`` grows)."""
        for event in page:
            if event.type == DELETION_EVENT_TYPE:
                # Deleted after this read began: drop what was already taken from it.
                gone = self.log.note_deletion(event)
                if gone is not None:
                    deleted.add(gone)
                    out[:] = [r for r in out if r.stream != gone]
            elif event.stream_name not in deleted and type_filter.delivers(event.type):
                out.append(to_stored(event))

    # --- subscriptions ---------------------------------------------------------------------

    def open_subscription(
        self, *, after: int = 0, wire_names: Collection[str] | None = None,
        streams: Collection[str] | None = None,
    ) -> Subscription:
        """Filtered server-side: on ``wire_names``, or, for a subscription to ``streams``, on
        their names (and on the wire names here: the server filters on one or the other)."""
        sub = EsdbSubscription(self.connection, self.log, self.options, after, wire_names,
                               streams)
        self._subscriptions.add(sub)
        return sub

    consumer_groups = True

    def consumer_group(self, name: str, *, wire_names: Collection[str]) -> GroupReader:
        """A member of the persistent subscription group ``name`` to ``$all`` (Pinned), over
        the events of ``wire_names`` (``_esdb_group``)."""
        group = EsdbConsumerGroup(self.connection, self.log, name, wire_names)
        self._groups.add(group)
        return group

    def close(self) -> None:
        _OPEN.discard(self)
        for group in list(self._groups):
            group.stop()
        for sub in list(self._subscriptions):
            sub.stop()
        self.connection.close()


_OPEN: weakref.WeakSet[EventStoreDBStore] = weakref.WeakSet()
"""The stores not closed yet."""


@atexit.register
def _close_open_stores() -> None:
    """Close what the program left open, while its threads still run. Left to the garbage
    collector at interpreter exit, the gRPC channel of a store never closed is closed after the
    daemon threads were frozen — one of them (a subscription's, gRPC's) may hold the channel's
    lock, and the exit then hangs for ever."""
    for store in list(_OPEN):
        try:
            store.close()
        except Exception:  # noqa: BLE001, S110 - the program is ending: nothing to report to
            pass


# --- helpers ---------------------------------------------------------------------------------


def _to_esdb_version(expected: ExpectedVersion) -> int | EsdbStreamState:
    if expected is StreamState.ANY:
        return EsdbStreamState.ANY
    if expected is StreamState.NO_STREAM or expected == 0:
        return EsdbStreamState.NO_STREAM
    assert isinstance(expected, int)
    return expected - 1


def _snapshot_stream(stream: str) -> str:
    return f"{SNAPSHOT_PREFIX}{stream}"
