"""The `event_store.client.streams.Streams` service.

Error encodings differ per method and esdbclient depends on each (wire notes §2):
* Append: wrong version in the AppendResp; a deleted stream as FAILED_PRECONDITION;
* BatchAppend: both in BatchAppendResp.error, a Status with one packed detail;
* Delete/Tombstone: FAILED_PRECONDITION with texts the client parses;
* Read: `stream_not_found` as a message; a tombstoned stream as FAILED_PRECONDITION.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any, NoReturn

import grpc
from esdbclient.protos.Grpc import streams_pb2, streams_pb2_grpc

from . import convert
from .faults import FaultInjector, OpenCalls, abort_call
from .reads import InvalidRead, ReadRequest, read_all, read_stream
from .records import ProposedEvent
from .scope import CallScope
from .store import (
    EventStore,
    StreamDeleted,
    StreamDeletedError,
    WriteOutcome,
    Written,
    WrongVersion,
)
from .subscriptions import subscribe_all, subscribe_stream

# A real server answers over a network and cannot complete a call within a few
# milliseconds; the emulator on loopback sometimes could, racing the client's own deadline
# timer. Calls arriving with less time left than this fail at once with DEADLINE_EXCEEDED
# (and write nothing), so that e.g. timeout=0 or timeout=0.001 behave deterministically.
MIN_SERVICE_SECONDS = 0.005

# The server's default --max-append-size (1 MiB); larger appends are rejected whole.
DEFAULT_MAX_APPEND_SIZE = 1_048_576


def append_size(events: list[ProposedEvent]) -> int:
    # As the server counts an event (Event.SizeOnDisk): data + metadata + type (UTF-16).
    return sum(len(e.data) + len(e.custom_metadata) + 2 * len(e.type) for e in events)


def guard_call(context: grpc.ServicerContext, faults: FaultInjector, method: str) -> None:
    """Common prologue: expired deadlines and injected faults end the call here."""
    remaining = context.time_remaining()
    if remaining is not None and remaining < MIN_SERVICE_SECONDS:
        abort_call(context, grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
    metadata = dict(context.invocation_metadata())
    requires_leader = metadata.get("requires-leader") == "true"
    fault = faults.take(method, requires_leader)
    if fault is not None:
        fault.abort(context)


def abort_stream_deleted(context: grpc.ServicerContext, stream: str) -> NoReturn:
    abort_call(
        context,
        grpc.StatusCode.FAILED_PRECONDITION,
        f"Event stream '{stream}' is deleted.",
        (("exception", "stream-deleted"), ("stream-name", stream)),
    )


def abort_delete_wrong_version(
    context: grpc.ServicerContext, stream: str, expected: int, actual: int
) -> NoReturn:
    # The same "Delete" wording is used for Tombstone (RpcExceptions.WrongExpectedVersion);
    # the client recognises a missing stream by "Actual version: -1".
    abort_call(
        context,
        grpc.StatusCode.FAILED_PRECONDITION,
        f"Delete failed due to WrongExpectedVersion. Stream: {stream},"
        f" Expected version: {expected}, Actual version: {actual}",
        (
            ("exception", "wrong-expected-version"),
            ("stream-name", stream),
            ("expected-version", str(expected)),
            ("actual-version", str(actual)),
        ),
    )


class StreamsServicer(streams_pb2_grpc.StreamsServicer):
    def __init__(
        self,
        store: EventStore,
        faults: FaultInjector,
        calls: OpenCalls,
        max_append_size: int = DEFAULT_MAX_APPEND_SIZE,
    ) -> None:
        self._store = store
        self._faults = faults
        self._calls = calls
        self._max_append_size = max_append_size

    # -- Read ------------------------------------------------------------------------------

    def Read(  # noqa: N802 - gRPC method name
        self, request: streams_pb2.ReadReq, context: grpc.ServicerContext
    ) -> Iterator[streams_pb2.ReadResp]:
        guard_call(context, self._faults, "Streams.Read")
        try:
            read = ReadRequest.parse(request)
        except InvalidRead as error:
            abort_call(context, grpc.StatusCode.UNKNOWN, str(error))
        scope = CallScope(context, self._store, self._calls)
        try:
            if read.stream is None:
                generator = subscribe_all if read.subscribe else read_all
            else:
                generator = subscribe_stream if read.subscribe else read_stream
            yield from generator(self._store, read, scope)
        except StreamDeletedError as error:
            abort_stream_deleted(context, str(error))
        finally:
            scope.close()

    # -- Append ----------------------------------------------------------------------------

    def Append(  # noqa: N802
        self, request_iterator: Iterator[streams_pb2.AppendReq], context: grpc.ServicerContext
    ) -> streams_pb2.AppendResp:
        guard_call(context, self._faults, "Streams.Append")
        first = next(request_iterator, None)
        if first is None or first.WhichOneof("content") != "options":
            abort_call(context, grpc.StatusCode.INVALID_ARGUMENT, "Options Were Not Provided")
        options = first.options
        stream = options.stream_identifier.stream_name.decode("utf8")
        expected = convert.expected_version(options, "expected_stream_revision", "revision")
        try:
            events = [convert.proposed_event(req.proposed_message) for req in request_iterator]
        except convert.InvalidProposal as error:
            abort_call(context, grpc.StatusCode.INVALID_ARGUMENT, str(error))
        if append_size(events) > self._max_append_size:
            abort_call(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"Maximum Append Size of {self._max_append_size} Exceeded.",
            )
        self._abort_if_expired(context)
        outcome = self._store.append(stream, expected, events)
        if isinstance(outcome, Written):
            return convert.append_success(outcome.position, outcome.current)
        if isinstance(outcome, WrongVersion):
            return convert.append_wrong_version(outcome.current, expected)
        abort_stream_deleted(context, stream)

    # -- BatchAppend -----------------------------------------------------------------------

    def BatchAppend(  # noqa: N802
        self,
        request_iterator: Iterator[streams_pb2.BatchAppendReq],
        context: grpc.ServicerContext,
    ) -> Iterator[streams_pb2.BatchAppendResp]:
        guard_call(context, self._faults, "Streams.BatchAppend")
        # A batch may span several requests sharing a correlation id; `is_final` commits it.
        pending: dict[str, _PendingBatch] = {}
        for request in request_iterator:
            key = request.correlation_id.SerializeToString()
            batch = pending.get(key)
            if batch is None:
                batch = pending[key] = _PendingBatch(request)
            try:
                batch.add(request.proposed_messages)
            except convert.InvalidProposal as error:
                batch.error = convert.batch_bad_request(str(error))
            if request.is_final:
                del pending[key]
                self._abort_if_expired(context)
                # Durable before the response: the sync client returns on the first one.
                yield self._commit_batch(batch)

    def _commit_batch(self, batch: _PendingBatch) -> streams_pb2.BatchAppendResp:
        response = batch.response_template()
        if batch.error is not None:
            response.error.CopyFrom(batch.error)
        elif append_size(batch.events) > self._max_append_size:
            response.error.CopyFrom(convert.batch_too_big(self._max_append_size))
        elif batch.deadline_passed():
            response.error.CopyFrom(convert.batch_timeout())
        else:
            outcome = self._store.append(batch.stream, batch.expected, batch.events)
            if isinstance(outcome, Written):
                response.success.CopyFrom(convert.batch_success(outcome.position, outcome.current))
            elif isinstance(outcome, WrongVersion):
                response.error.CopyFrom(
                    convert.batch_wrong_version(outcome.current, batch.expected)
                )
            else:
                response.error.CopyFrom(convert.batch_stream_deleted(batch.stream))
        return response

    # -- Delete / Tombstone ------------------------------------------------------------------

    def Delete(  # noqa: N802
        self, request: streams_pb2.DeleteReq, context: grpc.ServicerContext
    ) -> streams_pb2.DeleteResp:
        guard_call(context, self._faults, "Streams.Delete")
        stream, expected = self._delete_target(request.options)
        outcome = self._store.delete(stream, expected)
        position = self._delete_position(context, stream, expected, outcome)
        return streams_pb2.DeleteResp(
            position=streams_pb2.DeleteResp.Position(
                commit_position=position, prepare_position=position
            )
        )

    def Tombstone(  # noqa: N802
        self, request: streams_pb2.TombstoneReq, context: grpc.ServicerContext
    ) -> streams_pb2.TombstoneResp:
        guard_call(context, self._faults, "Streams.Tombstone")
        stream, expected = self._delete_target(request.options)
        outcome = self._store.tombstone(stream, expected)
        position = self._delete_position(context, stream, expected, outcome)
        return streams_pb2.TombstoneResp(
            position=streams_pb2.TombstoneResp.Position(
                commit_position=position, prepare_position=position
            )
        )

    @staticmethod
    def _delete_target(options: Any) -> tuple[str, int]:
        stream = options.stream_identifier.stream_name.decode("utf8")
        return stream, convert.expected_version(options, "expected_stream_revision", "revision")

    @staticmethod
    def _delete_position(
        context: grpc.ServicerContext, stream: str, expected: int, outcome: WriteOutcome
    ) -> int:
        if isinstance(outcome, WrongVersion):
            abort_delete_wrong_version(context, stream, expected, outcome.current)
        if isinstance(outcome, StreamDeleted):
            abort_stream_deleted(context, stream)
        assert outcome.position is not None  # deletes always write a record
        return outcome.position

    @staticmethod
    def _abort_if_expired(context: grpc.ServicerContext) -> None:
        # Never write once the caller has given up (e.g. timeout=0): it sees a failure.
        remaining = context.time_remaining()
        if remaining is not None and remaining <= 0:
            abort_call(context, grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")


class _PendingBatch:
    """One BatchAppend batch being assembled from its requests."""

    def __init__(self, first: streams_pb2.BatchAppendReq) -> None:
        self.correlation_id = first.correlation_id
        self.options = first.options
        self.stream = first.options.stream_identifier.stream_name.decode("utf8")
        self.expected = convert.expected_version(
            first.options, "expected_stream_position", "stream_position"
        )
        self.events: list[ProposedEvent] = []
        self.error: Any = None
        self._received_at = time.monotonic()

    def add(self, messages: Any) -> None:
        self.events.extend(convert.proposed_event(m) for m in messages)

    def deadline_passed(self) -> bool:
        """The request-level deadline (options.deadline) is relative to receipt."""
        which = self.options.WhichOneof("deadline_option")
        if which == "deadline":
            seconds = self.options.deadline.seconds + self.options.deadline.nanos / 1e9
            return seconds <= 0 or time.monotonic() - self._received_at > seconds
        if which == "deadline_21_10_0":
            return self.options.deadline_21_10_0.ToNanoseconds() <= time.time_ns()
        return False

    def response_template(self) -> streams_pb2.BatchAppendResp:
        response = streams_pb2.BatchAppendResp(
            correlation_id=self.correlation_id,
            stream_identifier=self.options.stream_identifier,
        )
        which = self.options.WhichOneof("expected_stream_position")
        if which == "stream_position":
            response.stream_position = self.options.stream_position
        elif which is not None:
            getattr(response, which).SetInParent()
        return response
