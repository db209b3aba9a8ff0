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
  event (all but the server's ``$`` system events and Terret's internal types);
* snapshots live in ``snapshot-<stream>`` (type ``terret-snapshot``, ``$maxCount: 1``), outside
  every filter;
* the store's identity (``store_id``) is in the metadata of the ``terret-store`` stream,
  written by the first Terret that asks for it;
* retention: ``set_max_age`` writes ``$maxAge`` into the stream's metadata; ``delete_stream``
  records the deletion in ``terret-deletions`` and then *tombstones* the stream and its
  snapshot stream. A reaped session can never be written again. ``$all`` keeps a tombstoned
  stream's events until the server's next scavenge, so readers of ``$all`` skip the streams the
  deletions stream names: deleted events are gone from ``read_all`` and subscriptions at once.

Transient failures (unavailable node, "not leader", deadline, dropped subscription) are retried
with backoff for at most ``retry_timeout`` seconds, then surface as ``StoreUnavailable``. The
connection URI's credentials never appear in ``describe()``, ``repr``, logs or errors.
"""

from __future__ import annotations

import json
import re
import sys
import threading
import time
import weakref
from collections.abc import Callable, Collection, Sequence
from typing import Any, TypeVar
from uuid import UUID, uuid4

from esdbclient import EventStoreDBClient, NewEvent, RecordedEvent
from esdbclient import StreamState as EsdbStreamState
from esdbclient.exceptions import (
    FailedPrecondition,
    MaximumAppendSizeExceededError,
    NotFound,
    StreamIsDeleted,
    WrongCurrentVersion,
)

from terret.adapters.secret import Secret
from terret.adapters.stores._esdb import (
    DELETION_EVENT_TYPE,
    SNAPSHOT_EVENT_TYPE,
    Failure,
    Retrier,
    RetryPolicy,
    TypeFilter,
    classify,
    default_wire_names,
    log,
    prepare_uri,
    to_stored,
)
from terret.adapters.stores._esdb_subscription import EsdbSubscription
from terret.adapters.stores._rules import check_size
from terret.domain.errors import (
    CorruptRecord,
    PayloadTooLarge,
    StoreError,
    StoreUnavailable,
    StreamDeleted,
    WrongExpectedVersion,
)
from terret.domain.store import (
    MAX_RECORD_BYTES,
    AppendResult,
    EventStore,
    ExpectedVersion,
    NewRecord,
    StoredRecord,
    StreamState,
    Subscription,
)
from terret.domain.workers import WorkerRegistry

T = TypeVar("T")

SNAPSHOT_PREFIX = "snapshot-"
DELETIONS_STREAM = "terret-deletions"
STORE_STREAM = "terret-store"
"""Its stream metadata holds the store's id (``STORE_ID_KEY``); the stream has no events."""
STORE_ID_KEY = "terretStoreId"

_LAST_REVISION = re.compile(r"Stream position of last event is (\d+)")


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
        self._uri: Secret = prepare_uri(uri)
        self.retry = RetryPolicy(
            timeout=retry_timeout,
            call_timeout=call_timeout,
            min_call_timeout=min(0.5, call_timeout),
            initial_backoff=backoff_initial,
            max_backoff=backoff_max,
        )
        self.catalogue_only = catalogue_only
        self.window_size = window_size
        self.checkpoint_interval_multiplier = checkpoint_interval_multiplier
        self.idle_checkpoint_after = idle_checkpoint_after
        self.subscription_buffer = subscription_buffer
        self.max_append_bytes = max_append_bytes
        self._root_certificates = root_certificates
        self._client_lock = threading.Lock()
        self._client_obj: EventStoreDBClient | None = None
        self._closed = False
        self._subscriptions: weakref.WeakSet[EsdbSubscription] = weakref.WeakSet()
        self._deleted: set[str] = set()
        self._deleted_revision = -1  # the last revision of the deletions stream read
        self._deleted_lock = threading.Lock()
        self._store_id: str | None = None
        self._workers: WorkerRegistry | None = None

    # --- description -----------------------------------------------------------------------

    def describe(self) -> str:
        return f"eventstoredb {self._uri.masked}"

    def __repr__(self) -> str:
        return f"EventStoreDBStore({self._uri.masked!r})"

    # --- identity --------------------------------------------------------------------------

    def store_id(self) -> str:
        """The id in the metadata of ``terret-store`` (``STORE_ID_KEY``), written by the first
        Terret to ask (with an expected version, so racing processes agree on one). Stream
        metadata is a ``$metadata`` event in ``$$terret-store``: a system event, which no read
        of ``$all`` delivers and which does not move the head. A copy of the database (a
        backup) keeps it; another server has its own."""
        if self._store_id is not None:
            return self._store_id

        def op(client: EventStoreDBClient, timeout: float) -> str | None:
            metadata, version = client.get_stream_metadata(STORE_STREAM, timeout=timeout)
            found = metadata.get(STORE_ID_KEY)
            if isinstance(found, str) and found:
                return found
            try:
                client.set_stream_metadata(
                    STORE_STREAM, metadata={**metadata, STORE_ID_KEY: uuid4().hex},
                    current_version=version, timeout=timeout)
            except WrongCurrentVersion:
                pass  # another process wrote it first: read theirs
            return None

        for _ in range(5):
            found = self._run("read the store id", op)
            if found is not None:
                self._store_id = found
                return found
        raise StoreError(f"the metadata of {STORE_STREAM!r} kept changing; no store id")

    # --- connection and retries ------------------------------------------------------------

    def _client(self) -> EventStoreDBClient:
        """The shared client, created on first use. Creating it may gossip with the cluster
        (``esdb+discover://`` or several hosts), which can fail transiently: callers run it
        inside their retry loop."""
        client = self._client_obj
        if client is not None:
            return client
        with self._client_lock:
            if self._closed:
                raise StoreUnavailable(f"{self.describe()} is closed")
            if self._client_obj is None:
                self._client_obj = EventStoreDBClient(
                    self._uri.reveal(), root_certificates=self._root_certificates
                )
            return self._client_obj

    def _recover(self, failure: Failure, attempts: int) -> None:
        """React to a transient failure before the next attempt: follow a "not leader" answer
        to the leader it names; after repeated unavailability, open a fresh channel (a gRPC
        channel in TRANSIENT_FAILURE keeps failing fast for its own growing backoff, and on a
        cluster URI reconnecting re-runs discovery). esdbclient's decorators already reconnect
        once inside a call; this covers calls they do not wrap (reads, subscriptions)."""
        client = self._client_obj
        if client is None or not failure.reconnect:
            return
        if failure.leader is None and attempts < 2:
            return
        try:
            client.reconnect(failure.leader)
        except Exception as exc:  # noqa: BLE001 - classified on the next attempt instead
            log.info("reconnect to %s failed: %s", self.describe(), self._uri.scrub(str(exc)))

    def _run(self, what: str, op: Callable[[EventStoreDBClient, float], T]) -> T:
        """Run ``op(client, attempt_timeout)`` with bounded retries of transient failures.

        Domain errors raised by ``op`` pass through. A failure is re-raised *outside* the
        ``except`` block, so no esdbclient exception (whose text may quote the URI) is chained
        to the ``StoreUnavailable`` a caller sees."""
        retrier = Retrier(self.retry, what, self.describe())
        while True:
            try:
                return op(self._client(), retrier.attempt_timeout())
            except Exception as exc:
                failure = classify(exc, self._uri)
                if failure is None:
                    raise
            self._recover(failure, retrier.attempts + 1)
            retrier.failed(failure)

    def type_filter(self, wire_names: Collection[str] | None) -> TypeFilter:
        if wire_names is not None:
            return TypeFilter(frozenset(wire_names))
        return TypeFilter(default_wire_names() if self.catalogue_only else None)

    # --- appends ---------------------------------------------------------------------------

    def append(
        self, stream: str, records: Sequence[NewRecord], expected_version: ExpectedVersion
    ) -> AppendResult:
        check_size(records, self.max_record_bytes)
        # As the server counts an append: data + metadata + the type in UTF-16.
        total = sum(2 * len(r.wire_name) + len(r.data) + len(r.metadata) for r in records)
        if total > self.max_append_bytes:
            # The server limits a whole append, not only one record; refusing here gives the
            # same error as the other adapters instead of a server-side rejection.
            raise PayloadTooLarge(
                f"{records[0].wire_name} (batch of {len(records)})", total, self.max_append_bytes
            )
        if not records:
            return self._append_nothing(stream, expected_version)
        if isinstance(expected_version, int) and expected_version < 0:
            raise WrongExpectedVersion(stream, expected_version, self.stream_version(stream))
        current = _to_esdb_version(expected_version)
        events = [
            NewEvent(
                type=r.wire_name,
                data=r.data,
                metadata=r.metadata,
                content_type="application/json",
                id=r.event_id,
            )
            for r in records
        ]

        # One event goes by the Append RPC, a batch by BatchAppend (both atomic). Append is
        # the cheaper call (a client stream and one reply, where BatchAppend opens a duplex
        # stream) and single-event appends are most of what a session writes.
        payload: NewEvent | list[NewEvent] = events[0] if len(events) == 1 else events

        def op(client: EventStoreDBClient, timeout: float) -> int:
            try:
                return client.append_to_stream(
                    stream, current_version=current, events=payload, timeout=timeout
                )
            except WrongCurrentVersion as exc:
                raise self._conflict(stream, expected_version, str(exc)) from None
            except StreamIsDeleted:
                raise StreamDeleted(f"stream {stream!r} was deleted") from None
            except FailedPrecondition as exc:
                if "is deleted" in str(exc):
                    raise StreamDeleted(f"stream {stream!r} was deleted") from None
                raise
            except MaximumAppendSizeExceededError as exc:
                raise PayloadTooLarge(
                    f"{records[0].wire_name} (batch of {len(records)})", total, _max_size(exc)
                ) from None

        position = self._run(f"append to {stream}", op)
        if expected_version is StreamState.ANY:
            return AppendResult(position, self._version_at(stream, position))
        # With an exact expected version the new version follows; an idempotent repeat gets
        # the original append's result, as the port requires (R7).
        base = 0 if expected_version is StreamState.NO_STREAM else expected_version
        assert isinstance(base, int)
        return AppendResult(position, base + len(records))

    def _append_nothing(self, stream: str, expected: ExpectedVersion) -> AppendResult:
        version = self.stream_version(stream)
        wanted = 0 if expected is StreamState.NO_STREAM else expected
        if isinstance(wanted, int) and wanted != version:
            raise WrongExpectedVersion(stream, wanted, version)
        last = self.read_stream(stream, backwards=True, limit=1)
        return AppendResult(last[0].position if last else 0, version)

    def _conflict(self, stream: str, expected: ExpectedVersion, text: str) -> WrongExpectedVersion:
        shown: object = 0 if expected is StreamState.NO_STREAM else expected
        if expected is StreamState.ANY:
            shown = "any"
        match = _LAST_REVISION.search(text)
        if match:
            actual = int(match.group(1)) + 1
        elif "does not exist" in text:
            actual = 0
        else:
            actual = self.stream_version(stream)
        return WrongExpectedVersion(stream, shown, actual)

    def _version_at(self, stream: str, position: int) -> int:
        """The seq of the event at ``position`` (the last one an ``ANY`` append wrote, or, for
        an idempotent repeat, the last one the original append wrote)."""

        def op(client: EventStoreDBClient, timeout: float) -> RecordedEvent | None:
            with client.read_all(
                commit_position=position, filter_exclude=(), limit=1, timeout=timeout
            ) as events:
                for event in events:
                    return event
            return None

        event = self._run(f"read the event at {position}", op)
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

        def op(client: EventStoreDBClient, timeout: float) -> None:
            client.append_to_stream(
                DELETIONS_STREAM,
                current_version=EsdbStreamState.ANY,
                events=[record],
                timeout=timeout,
            )

        self._run(f"record the deletion of {stream}", op)
        with self._deleted_lock:
            self._deleted.add(stream)
        for name in (stream, _snapshot_stream(stream)):
            self._tombstone(name)

    def _tombstone(self, stream: str) -> None:
        def op(client: EventStoreDBClient, timeout: float) -> None:
            try:
                client.tombstone_stream(
                    stream, current_version=EsdbStreamState.ANY, timeout=timeout
                )
            except (StreamIsDeleted, NotFound):
                pass  # already gone: deleting is idempotent
            except FailedPrecondition as exc:
                if "is deleted" not in str(exc):
                    raise

        self._run(f"delete {stream}", op)

    def deleted_streams(self, refresh: bool = True) -> frozenset[str]:
        """Streams ``delete_stream`` removed (by any process), read from the deletions stream;
        ``refresh`` reads what was recorded since the last call (one small read)."""
        if refresh:
            self._run("read the deletions", self.refresh_deletions)
        with self._deleted_lock:
            return frozenset(self._deleted)

    def refresh_deletions(self, client: EventStoreDBClient, timeout: float) -> None:
        """One attempt at reading the deletions recorded since the last read."""
        with self._deleted_lock:
            after = self._deleted_revision
        try:
            events = client.get_stream(
                DELETIONS_STREAM,
                stream_position=after + 1 if after >= 0 else None,
                timeout=timeout,
            )
        except NotFound:
            return
        for event in events:
            self.note_deletion(event)

    def note_deletion(self, event: RecordedEvent) -> str | None:
        """Learn a deletion from a record of the deletions stream (read or subscribed);
        the deleted stream's name, or None for a malformed record (ignored)."""
        stream = _deleted_name(event)
        if stream is None:
            log.warning("ignoring a malformed deletion record at %s", event.commit_position)
            return None
        with self._deleted_lock:
            self._deleted.add(stream)
            if event.stream_name == DELETIONS_STREAM:
                self._deleted_revision = max(self._deleted_revision, event.stream_position)
        return stream

    def set_max_age(self, stream: str, seconds: int) -> None:
        if seconds <= 0:
            raise ValueError(f"max age must be positive, not {seconds}")
        # The snapshot stream expires with its session, or it would outlive the events.
        for name in (stream, _snapshot_stream(stream)):
            self._update_metadata(name, {"$maxAge": int(seconds)})

    def run(self, what: str, op: Callable[[EventStoreDBClient, float], T]) -> T:
        """Run ``op(client, timeout)`` with this store's retries and error mapping (for the
        adapters beside the store that keep streams of their own, like the worker registry)."""
        return self._run(what, op)

    def update_metadata(self, stream: str, changes: dict[str, Any]) -> None:
        """Merge ``changes`` into a stream's metadata (``$maxCount``, ``$maxAge``, …)."""
        self._update_metadata(stream, changes)

    def workers(self) -> WorkerRegistry:
        if self._workers is None:
            from terret.adapters.stores.workers import EsdbWorkers

            self._workers = EsdbWorkers(self)
        return self._workers

    def _update_metadata(self, stream: str, changes: dict[str, Any]) -> None:
        """Merge ``changes`` into a stream's metadata, with optimistic concurrency on the
        metastream (another writer's keys are kept)."""

        def op(client: EventStoreDBClient, timeout: float) -> None:
            for _ in range(5):
                try:
                    metadata, version = client.get_stream_metadata(stream, timeout=timeout)
                except StreamIsDeleted:
                    return  # a tombstoned stream needs no retention
                if all(metadata.get(k) == v for k, v in changes.items()):
                    return
                try:
                    client.set_stream_metadata(
                        stream,
                        metadata={**metadata, **changes},
                        current_version=version,
                        timeout=timeout,
                    )
                    return
                except WrongCurrentVersion:
                    continue  # someone else changed the metadata meanwhile: merge again
            raise StoreError(f"the metadata of {stream!r} kept changing; not updated")

        self._run(f"set metadata of {stream}", op)

    # --- snapshots -------------------------------------------------------------------------

    def write_snapshot(self, stream: str, version: int, state: bytes) -> None:
        name = _snapshot_stream(stream)
        check_size([NewRecord(UUID(int=0), SNAPSHOT_EVENT_TYPE, state)], self.max_record_bytes)
        for _ in range(5):
            current = self._latest_snapshot(name)
            if current is not None and current[0] >= version:
                return  # never replace a snapshot with an older one
            if current is None:
                self._update_metadata(name, {"$maxCount": 1})
            expected: int | EsdbStreamState = (
                current[2] if current is not None else EsdbStreamState.NO_STREAM
            )
            event = NewEvent(
                type=SNAPSHOT_EVENT_TYPE,
                data=state,
                metadata=json.dumps({"version": version}).encode(),
                content_type="application/octet-stream",
            )

            def op(
                client: EventStoreDBClient,
                timeout: float,
                expected: int | EsdbStreamState = expected,
                event: NewEvent = event,
            ) -> bool:
                try:
                    client.append_to_stream(
                        name, current_version=expected, events=[event], timeout=timeout
                    )
                except WrongCurrentVersion:
                    return False  # a concurrent snapshot: compare versions again
                except (StreamIsDeleted, FailedPrecondition):
                    return True  # the session was deleted: nothing to keep
                return True

            if self._run(f"write a snapshot of {stream}", op):
                return

    def read_snapshot(self, stream: str) -> tuple[int, bytes] | None:
        current = self._latest_snapshot(_snapshot_stream(stream))
        return (current[0], current[1]) if current is not None else None

    def _latest_snapshot(self, name: str) -> tuple[int, bytes, int] | None:
        """(version, state, revision) of the latest snapshot in ``name``."""

        def op(client: EventStoreDBClient, timeout: float) -> Sequence[RecordedEvent]:
            try:
                return client.get_stream(name, backwards=True, limit=1, timeout=timeout)
            except (NotFound, StreamIsDeleted):
                return ()

        events = self._run(f"read {name}", op)
        if not events:
            return None
        event = events[0]
        try:
            version = int(json.loads(event.metadata)["version"])
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptRecord(event.commit_position or 0, f"snapshot metadata: {exc}") from None
        return version, event.data, event.stream_position

    # --- reads -----------------------------------------------------------------------------

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

        def op(client: EventStoreDBClient, timeout: float) -> Sequence[RecordedEvent]:
            try:
                return client.get_stream(
                    stream,
                    stream_position=revision,
                    backwards=backwards,
                    limit=limit if limit is not None else sys.maxsize,
                    timeout=timeout,
                )
            except (NotFound, StreamIsDeleted):
                # Unknown, soft-deleted and tombstoned streams all read as empty (the port's
                # rule); appending to a tombstoned one raises StreamDeleted.
                return ()

        return [to_stored(e) for e in self._run(f"read {stream}", op)]

    def stream_version(self, stream: str) -> int:
        def op(client: EventStoreDBClient, timeout: float) -> int:
            try:
                current = client.get_current_version(stream, timeout=timeout)
            except StreamIsDeleted:
                return 0
            except IndexError:
                # The stream exists but every event expired ($maxAge) or was truncated: its
                # revision cannot be read back. Only closed sessions are given a max age.
                return 0
            return 0 if current is EsdbStreamState.NO_STREAM else int(current) + 1

        return self._run(f"read the version of {stream}", op)

    def head_position(self) -> int:
        """The position of the last event a default subscription could deliver.

        Not the log's raw head: snapshots, deletion records and system events are never
        delivered, and EventStoreDB sends checkpoints past them only now and then, so waiting
        for such a position could take long."""
        return self._run("read the head position", self.read_head)

    def read_head(self, client: EventStoreDBClient, timeout: float) -> int:
        """One attempt at ``head_position``."""
        kwargs = self.type_filter(None).server_filter(with_deletions=False)
        return client.get_commit_position(timeout=timeout, **kwargs)

    def read_all(
        self, *, after: int = 0, limit: int = 1000, wire_names: Collection[str] | None = None
    ) -> list[StoredRecord]:
        if limit <= 0:
            return []
        type_filter = self.type_filter(wire_names)
        kwargs = type_filter.server_filter()
        deleted = self.deleted_streams()
        out: list[StoredRecord] = []
        cursor = after
        # A page can come back short of ``limit`` after deleted streams' events are dropped:
        # read on from the last position seen until the page is full or the log ends.
        while len(out) < limit:
            want = limit - len(out) + 1

            def op(
                client: EventStoreDBClient, timeout: float, cursor: int = cursor, want: int = want
            ) -> tuple[int, list[RecordedEvent]]:
                # A forward read of $all from P *includes* the event at P: ask for one more.
                with client.read_all(
                    commit_position=cursor if cursor > 0 else None,
                    limit=want,
                    timeout=max(timeout, self.retry.call_timeout),
                    **kwargs,
                ) as events:
                    got = list(events)
                return len(got), [e for e in got if (e.commit_position or 0) > cursor]

            received, page = self._run("read $all", op)
            for event in page:
                if event.type == DELETION_EVENT_TYPE:
                    # Deleted after this read began: drop what was already taken from it.
                    gone = self.note_deletion(event)
                    if gone is not None:
                        deleted = deleted | {gone}
                        out = [r for r in out if r.stream != gone]
                elif event.stream_name not in deleted and type_filter.delivers(event.type):
                    out.append(to_stored(event))
            if received < want or not page:
                break  # the end of the log
            cursor = page[-1].commit_position or cursor
        return out[:limit]

    # --- subscriptions ---------------------------------------------------------------------

    def subscribe(
        self, *, after: int = 0, wire_names: Collection[str] | None = None
    ) -> Subscription:
        sub = EsdbSubscription(self, after, wire_names)
        self._subscriptions.add(sub)
        sub.start()
        return sub

    def close(self) -> None:
        for sub in list(self._subscriptions):
            sub.stop()
        with self._client_lock:
            self._closed = True
            client, self._client_obj = self._client_obj, None
        if client is not None:
            try:
                client.close()
            except Exception as exc:  # noqa: BLE001 - closing must not fail
                log.debug("closing %s: %s", self.describe(), self._uri.scrub(str(exc)))


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


def _deleted_name(event: RecordedEvent) -> str | None:
    """The stream a deletion record names; None if the record is malformed."""
    try:
        return str(json.loads(event.data)["stream"])
    except (ValueError, KeyError, TypeError):
        return None


def _max_size(exc: Exception) -> int:
    match = re.search(r"(\d+)", str(exc))
    return int(match.group(1)) if match else MAX_RECORD_BYTES
