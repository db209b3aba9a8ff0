"""The `event_store.client.persistent_subscriptions.PersistentSubscriptions` service.

Errors use the server's RpcExceptions encodings, which esdbclient maps as follows:
* group exists: ALREADY_EXISTS -> AlreadyExists; no such group: NOT_FOUND -> NotFound
  (for List, NotFound becomes an empty list);
* a reader beyond `max_subscriber_count`: FAILED_PRECONDITION "Maximum subscriptions
  reached ..." -> MaximumSubscriptionsReached;
* readers of a group that is updated or deleted: CANCELLED "... was dropped" -> GrpcError;
* invalid settings (unknown strategy, bad start): INTERNAL "... failed: ..." -> InternalError.

Read is bidirectional: the handler thread yields the confirmation and then the consumer's
outbox, while a helper thread consumes the client's acks and nacks.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NoReturn, cast

import grpc
from esdbclient.protos.Grpc import persistent_pb2, persistent_pb2_grpc

from .convert import uuid_string
from .faults import CUT_DETAILS, FaultInjector, OpenCall, OpenCalls, abort_call
from .persistent import Group, MaxSubscribersReached
from .persistent_convert import confirmation_resp, event_resp, subscription_info
from .persistent_model import ALL_STREAM, Delivery, GroupError, GroupSettings
from .persistent_registry import GroupExists, GroupNotFound, PersistentRegistry
from .persistent_source import AllSource, Source, StreamSource
from .persistent_strategies import Consumer
from .reads import End, EventFilter, InvalidRead, Origin, Start
from .streams_service import guard_call

# How long a Read call waits for its outbox before re-checking that it is still active.
WAIT_SLICE_SECONDS = 1.0

ReadResp = persistent_pb2.ReadResp


def _trailers(kind: str, stream: str, group: str) -> tuple[tuple[str, str], ...]:
    return (("exception", kind), ("stream-name", stream), ("group-name", group))


def abort_not_found(context: grpc.ServicerContext, stream: str, group: str) -> NoReturn:
    abort_call(
        context,
        grpc.StatusCode.NOT_FOUND,
        f"Subscription group {group} on stream {stream} does not exist.",
        _trailers("persistent-subscription-does-not-exist", stream, group),
    )


def abort_failed(context: grpc.ServicerContext, stream: str, group: str, reason: str) -> NoReturn:
    abort_call(
        context,
        grpc.StatusCode.INTERNAL,
        f"Subscription group {group} on stream {stream} failed: '{reason}'",
        (*_trailers("persistent-subscription-failed", stream, group), ("reason", reason)),
    )


def abort_dropped(context: grpc.ServicerContext, stream: str, group: str) -> NoReturn:
    abort_call(
        context,
        grpc.StatusCode.CANCELLED,
        f"Subscription group {group} on stream {stream} was dropped.",
        _trailers("persistent-subscription-dropped", stream, group),
    )


def _stream_name(identifier: Any) -> str:
    return str(identifier.stream_name.decode("utf8"))


def _target(options: Any) -> str:
    """The event source named by a Delete/GetInfo/ReplayParked/Read request's options."""
    if options.WhichOneof("stream_option") == "all":
        return ALL_STREAM
    return _stream_name(options.stream_identifier)


def _source_name(options: Any) -> str:
    """The event source a Create/Update request names (before its settings are read)."""
    which = options.WhichOneof("stream_option")
    if which == "all":
        return ALL_STREAM
    if which == "stream":
        return _stream_name(options.stream.stream_identifier)
    return _stream_name(options.stream_identifier)  # clients before 21.10


@contextmanager
def _group_errors(context: grpc.ServicerContext, stream: str, group: str) -> Iterator[None]:
    """The server's answers for a group that does not exist, or a request it refuses."""
    try:
        yield
    except GroupNotFound:
        abort_not_found(context, stream, group)
    except GroupError as error:
        abort_failed(context, stream, group, str(error))


def _stream_origin(stream_options: Any) -> Origin:
    which = stream_options.WhichOneof("revision_option")
    if which == "revision":
        return int(stream_options.revision)
    return End if which == "end" else Start


def _all_origin(all_options: Any) -> Origin:
    which = all_options.WhichOneof("all_option")
    if which == "position":
        position = all_options.position
        if position.prepare_position > position.commit_position:
            raise GroupError(
                "Invalid Start From position: prepare position must be less than or equal"
                " to the commit position."
            )
        return int(position.commit_position)
    return End if which == "end" else Start


def _create_target(options: Any) -> tuple[Source, Origin]:
    which = options.WhichOneof("stream_option")
    if which == "all":
        event_filter = None
        if options.all.WhichOneof("filter_option") == "filter":
            try:
                # The persistent FilterOptions has the Streams one's shape.
                event_filter = EventFilter.from_options(cast(Any, options.all.filter))
            except InvalidRead as error:
                raise GroupError(str(error)) from None
        return AllSource(event_filter), _all_origin(options.all)
    name, origin = _update_target(options)
    return StreamSource(name), origin


def _update_target(options: Any) -> tuple[str, Origin]:
    which = options.WhichOneof("stream_option")
    if which == "all":
        return ALL_STREAM, _all_origin(options.all)
    if which == "stream":
        return _source_name(options), _stream_origin(options.stream)
    # Clients before 21.10 named the stream and revision outside the oneof.
    return _source_name(options), int(options.settings.revision)


class PersistentSubscriptionsServicer(persistent_pb2_grpc.PersistentSubscriptionsServicer):
    def __init__(
        self, registry: PersistentRegistry, faults: FaultInjector, calls: OpenCalls
    ) -> None:
        self._registry = registry
        self._faults = faults
        self._calls = calls

    # -- management ------------------------------------------------------------------------

    def Create(  # noqa: N802 - gRPC method name
        self, request: persistent_pb2.CreateReq, context: grpc.ServicerContext
    ) -> persistent_pb2.CreateResp:
        guard_call(context, self._faults, "PersistentSubscriptions.Create")
        options = request.options
        group, stream = options.group_name, _source_name(options)
        with _group_errors(context, stream, group):
            source, origin = _create_target(options)
            try:
                self._registry.create(
                    source, group, GroupSettings.from_proto(options.settings), origin)
            except GroupExists:
                abort_call(
                    context,
                    grpc.StatusCode.ALREADY_EXISTS,
                    f"Subscription group {group} on stream {stream} exists.",
                    _trailers("persistent-subscription-exists", stream, group),
                )
        return persistent_pb2.CreateResp()

    def Update(  # noqa: N802
        self, request: persistent_pb2.UpdateReq, context: grpc.ServicerContext
    ) -> persistent_pb2.UpdateResp:
        guard_call(context, self._faults, "PersistentSubscriptions.Update")
        options = request.options
        group, stream = options.group_name, _source_name(options)
        with _group_errors(context, stream, group):
            _, origin = _update_target(options)
            self._registry.update(stream, group, GroupSettings.from_proto(options.settings), origin)
        return persistent_pb2.UpdateResp()

    def Delete(  # noqa: N802
        self, request: persistent_pb2.DeleteReq, context: grpc.ServicerContext
    ) -> persistent_pb2.DeleteResp:
        guard_call(context, self._faults, "PersistentSubscriptions.Delete")
        stream, group = _target(request.options), request.options.group_name
        with _group_errors(context, stream, group):
            self._registry.delete(stream, group)
        return persistent_pb2.DeleteResp()

    def GetInfo(  # noqa: N802
        self, request: persistent_pb2.GetInfoReq, context: grpc.ServicerContext
    ) -> persistent_pb2.GetInfoResp:
        guard_call(context, self._faults, "PersistentSubscriptions.GetInfo")
        stream, group = _target(request.options), request.options.group_name
        with _group_errors(context, stream, group):
            stats = self._registry.run(stream, group, Group.stats)
        return persistent_pb2.GetInfoResp(subscription_info=subscription_info(stats))

    def List(  # noqa: N802
        self, request: persistent_pb2.ListReq, context: grpc.ServicerContext
    ) -> persistent_pb2.ListResp:
        guard_call(context, self._faults, "PersistentSubscriptions.List")
        options = request.options
        source: str | None = None
        if options.WhichOneof("list_option") == "list_for_stream":
            stream_option = options.list_for_stream
            source = (
                ALL_STREAM
                if stream_option.WhichOneof("stream_option") == "all"
                else _stream_name(stream_option.stream)
            )
        with self._registry.changed:
            infos = [subscription_info(g.stats()) for g in self._registry.groups(source)]
        if source is not None and not infos:
            abort_not_found(context, source, "")  # the server's answer for a stream
        return persistent_pb2.ListResp(subscriptions=infos)

    def ReplayParked(  # noqa: N802
        self, request: persistent_pb2.ReplayParkedReq, context: grpc.ServicerContext
    ) -> persistent_pb2.ReplayParkedResp:
        guard_call(context, self._faults, "PersistentSubscriptions.ReplayParked")
        options = request.options
        stream, group = _target(options), options.group_name
        stop_at = options.stop_at if options.WhichOneof("stop_at_option") == "stop_at" else None
        with _group_errors(context, stream, group):
            self._registry.run(stream, group, lambda g: g.replay_parked(stop_at))
        return persistent_pb2.ReplayParkedResp()

    # -- Read --------------------------------------------------------------------------------

    def Read(  # noqa: N802, C901 - the call's whole life: options, connect, confirm, deliver, drop
        self, request_iterator: Iterator[persistent_pb2.ReadReq], context: grpc.ServicerContext
    ) -> Iterator[ReadResp]:
        guard_call(context, self._faults, "PersistentSubscriptions.Read")
        first = next(request_iterator, None)
        if first is None:
            return
        if first.WhichOneof("content") != "options":
            abort_call(context, grpc.StatusCode.UNKNOWN, "Expected the read options first")
        options = first.options
        stream, name = _target(options), options.group_name
        metadata = dict(context.invocation_metadata())
        connection_name = str(metadata.get("connection-name", ""))
        consumer = Consumer(options.buffer_size, connection_name, context.peer())
        try:
            group = self._registry.run(stream, name, lambda g: self._connect(g, consumer))
        except GroupNotFound:
            abort_not_found(context, stream, name)
        except MaxSubscribersReached:
            abort_call(
                context,
                grpc.StatusCode.FAILED_PRECONDITION,
                f"Maximum subscriptions reached for subscription group {name} on stream {stream}.",
                _trailers("maximum-subscribers-reached", stream, name),
            )
        call = self._calls.open()
        if not context.add_callback(lambda: self._on_terminated(consumer)):
            consumer.closed = True  # the call has already ended
        try:
            yield confirmation_resp(group.key)
            acks = threading.Thread(
                target=self._read_acks,
                args=(request_iterator, group, consumer),
                name="esdb-emulator-acks",
                daemon=True,
            )
            acks.start()
            string_ids = options.uuid_option.WhichOneof("content") != "structured"
            while True:
                batch, reason = self._wait_for_outbox(consumer, call)
                for delivery in batch:
                    yield event_resp(delivery, string_ids=string_ids)
                if call.cut:
                    abort_call(context, grpc.StatusCode.UNAVAILABLE, CUT_DETAILS)
                if reason is not None:
                    abort_dropped(context, stream, name)
                if consumer.closed or not context.is_active():
                    return
        finally:
            with self._registry.locked():
                group.disconnect(consumer)
            self._calls.close(call)

    @staticmethod
    def _connect(group: Group, consumer: Consumer) -> Group:
        group.connect(consumer)
        return group

    def _wait_for_outbox(
        self, consumer: Consumer, call: OpenCall
    ) -> tuple[list[Delivery], str | None]:
        """What to send next and whether the consumer was dropped. `cut_subscriptions()`
        and the call's end wake this wait too (PersistentRegistry.wake)."""
        changed = self._registry.changed
        with changed:
            changed.wait_for(
                lambda: bool(consumer.outbox) or consumer.ended or call.cut,
                timeout=WAIT_SLICE_SECONDS,
            )
            batch = list(consumer.outbox)
            consumer.outbox.clear()
            return batch, consumer.drop_reason

    def _on_terminated(self, consumer: Consumer) -> None:
        consumer.closed = True
        self._registry.wake()

    def _read_acks(
        self, requests: Iterator[persistent_pb2.ReadReq], group: Group, consumer: Consumer
    ) -> None:
        try:
            for request in requests:
                self._handle_ack(request, group, consumer)
        except Exception:  # noqa: BLE001 - the request stream raises once the call has ended
            return

    def _handle_ack(
        self, request: persistent_pb2.ReadReq, group: Group, consumer: Consumer
    ) -> None:
        which = request.WhichOneof("content")
        if which == "ack":
            ids = [uuid_string(i) for i in request.ack.ids]
            with self._registry.locked():
                group.ack(ids)
        elif which == "nack":
            nack = request.nack
            ids = [uuid_string(i) for i in nack.ids]
            with self._registry.locked():
                group.nack(ids, nack.action, nack.reason, consumer)
