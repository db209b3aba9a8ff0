"""Conversions between the store's data and esdbclient's protobuf messages."""

from __future__ import annotations

import uuid
from typing import Any

from esdbclient.protos.Grpc import code_pb2, shared_pb2, status_pb2, streams_pb2
from google.protobuf import any_pb2, empty_pb2

from .records import (
    EXPECTED_ANY,
    EXPECTED_NO_STREAM,
    EXPECTED_STREAM_EXISTS,
    NO_EVENTS,
    ProposedEvent,
    Record,
)

ReadResp = streams_pb2.ReadResp
ReadEvent = streams_pb2.ReadResp.ReadEvent
RecordedEvent = streams_pb2.ReadResp.ReadEvent.RecordedEvent

JSON = "application/json"
OCTET_STREAM = "application/octet-stream"


class InvalidProposal(ValueError):
    """A proposed message lacks required metadata (server: INVALID_ARGUMENT)."""


def uuid_string(value: shared_pb2.UUID) -> str:
    """Canonical string form of a protobuf UUID, whichever oneof the client used."""
    if value.WhichOneof("value") == "structured":
        most = value.structured.most_significant_bits & (2**64 - 1)
        least = value.structured.least_significant_bits & (2**64 - 1)
        return str(uuid.UUID(int=(most << 64) | least))
    return str(uuid.UUID(value.string)) if value.string else str(uuid.uuid4())


def structured_uuid(text: str) -> shared_pb2.UUID:
    number = uuid.UUID(text).int
    most, least = number >> 64, number & (2**64 - 1)
    return shared_pb2.UUID(
        structured=shared_pb2.UUID.Structured(
            most_significant_bits=most - 2**64 if most >= 2**63 else most,
            least_significant_bits=least - 2**64 if least >= 2**63 else least,
        )
    )


def proposed_event(message: Any) -> ProposedEvent:
    """From AppendReq.ProposedMessage or BatchAppendReq.ProposedMessage."""
    for key in ("type", "content-type"):
        if key not in message.metadata:
            raise InvalidProposal(f"Required Metadata Property '{key}' is missing")
    return ProposedEvent(
        event_id=uuid_string(message.id),
        type=message.metadata["type"],
        content_type=message.metadata["content-type"],
        data=message.data,
        custom_metadata=message.custom_metadata,
    )


def expected_version(options: Any, oneof: str, revision_field: str) -> int:
    """Decode an expected-revision oneof (field names differ between request types)."""
    which = options.WhichOneof(oneof)
    if which == revision_field:
        return int(getattr(options, revision_field))
    return {
        "no_stream": EXPECTED_NO_STREAM,
        "any": EXPECTED_ANY,
        "stream_exists": EXPECTED_STREAM_EXISTS,
    }.get(which or "any", EXPECTED_ANY)


def recorded_event_fields(record: Record, string_ids: bool) -> dict[str, Any]:
    """A record as the fields of a RecordedEvent message (the Streams and the
    PersistentSubscriptions services each have a RecordedEvent type with these fields)."""
    return {
        "id": shared_pb2.UUID(string=record.event_id)
        if string_ids
        else structured_uuid(record.event_id),
        "stream_identifier": shared_pb2.StreamIdentifier(
            stream_name=record.stream.encode("utf8")),
        "stream_revision": record.number,
        "prepare_position": record.position,
        "commit_position": record.position,
        "metadata": {
            "type": record.type,
            "created": str(record.created),
            # The server normalises the content type on the way out.
            "content-type": JSON if record.is_json else OCTET_STREAM,
        },
        "custom_metadata": record.custom_metadata,
        "data": record.data,
    }


def _recorded_event(record: Record, string_ids: bool) -> RecordedEvent:
    return RecordedEvent(**recorded_event_fields(record, string_ids))


def event_resp(record: Record, *, string_ids: bool = True) -> ReadResp:
    """ReadResp carrying `record`; cached on the record for the common string-id case."""
    if string_ids and record.wire is not None:
        return record.wire
    message = ReadResp(
        event=ReadEvent(event=_recorded_event(record, string_ids), commit_position=record.position)
    )
    if string_ids:
        record.wire = message
    return message


def linked_event_resp(target: Record, link: Record, *, string_ids: bool = True) -> ReadResp:
    """A resolved `$>` link: `event` is the target, `link` the link record."""
    return ReadResp(
        event=ReadEvent(
            event=_recorded_event(target, string_ids),
            link=_recorded_event(link, string_ids),
            commit_position=link.position,
        )
    )


def confirmation_resp(subscription_id: str) -> ReadResp:
    return ReadResp(confirmation=ReadResp.SubscriptionConfirmation(subscription_id=subscription_id))


def checkpoint_resp(position: int) -> ReadResp:
    return ReadResp(
        checkpoint=ReadResp.Checkpoint(commit_position=position, prepare_position=position)
    )


def caught_up_resp() -> ReadResp:
    return ReadResp(caught_up=ReadResp.CaughtUp())


def stream_not_found_resp(stream: str) -> ReadResp:
    return ReadResp(
        stream_not_found=ReadResp.StreamNotFound(
            stream_identifier=shared_pb2.StreamIdentifier(stream_name=stream.encode("utf8"))
        )
    )


def append_wrong_version(current: int, expected: int) -> streams_pb2.AppendResp:
    """AppendResp.wrong_expected_version with both the 20.6.0 and the current fields."""
    wev = streams_pb2.AppendResp.WrongExpectedVersion()
    empty = shared_pb2.Empty()
    if current == NO_EVENTS:
        wev.current_no_stream.CopyFrom(empty)
        wev.no_stream_20_6_0.CopyFrom(empty)
    else:
        wev.current_revision = current
        wev.current_revision_20_6_0 = current
    if expected >= 0:
        wev.expected_revision = expected
        wev.expected_revision_20_6_0 = expected
    elif expected == EXPECTED_ANY:
        wev.expected_any.CopyFrom(empty)
        wev.any_20_6_0.CopyFrom(empty)
    elif expected == EXPECTED_STREAM_EXISTS:
        wev.expected_stream_exists.CopyFrom(empty)
        wev.stream_exists_20_6_0.CopyFrom(empty)
    else:
        wev.expected_no_stream.CopyFrom(empty)
    return streams_pb2.AppendResp(wrong_expected_version=wev)


def append_success(position: int | None, current: int) -> streams_pb2.AppendResp:
    success = streams_pb2.AppendResp.Success()
    if current == NO_EVENTS:
        success.no_stream.CopyFrom(shared_pb2.Empty())
    else:
        success.current_revision = current
    if position is None:
        success.no_position.CopyFrom(shared_pb2.Empty())
    else:
        success.position.CopyFrom(
            streams_pb2.AppendResp.Position(commit_position=position, prepare_position=position)
        )
    return streams_pb2.AppendResp(success=success)


def batch_success(position: int | None, current: int) -> streams_pb2.BatchAppendResp.Success:
    success = streams_pb2.BatchAppendResp.Success()
    if current == NO_EVENTS:
        success.no_stream.CopyFrom(empty_pb2.Empty())
    else:
        success.current_revision = current
    if position is None:
        success.no_position.CopyFrom(empty_pb2.Empty())
    else:
        success.position.CopyFrom(
            shared_pb2.AllStreamPosition(commit_position=position, prepare_position=position)
        )
    return success


def status_with_detail(
    code: code_pb2.Code.ValueType, message: str, detail: Any
) -> status_pb2.Status:
    """esdbclient.rpc.Status with exactly one packed detail, as the server sends."""
    packed = any_pb2.Any()
    packed.Pack(detail)
    return status_pb2.Status(code=code, message=message, details=packed)


def batch_wrong_version(current: int, expected: int) -> status_pb2.Status:
    wev = shared_pb2.WrongExpectedVersion()
    empty = empty_pb2.Empty()
    if current == NO_EVENTS:
        wev.current_no_stream.CopyFrom(empty)
    else:
        wev.current_stream_revision = current
    if expected >= 0:
        wev.expected_stream_position = expected
    elif expected == EXPECTED_ANY:
        wev.expected_any.CopyFrom(empty)
    elif expected == EXPECTED_STREAM_EXISTS:
        wev.expected_stream_exists.CopyFrom(empty)
    else:
        wev.expected_no_stream.CopyFrom(empty)
    return status_with_detail(code_pb2.ALREADY_EXISTS, "WrongExpectedVersion", wev)


def batch_stream_deleted(stream: str) -> status_pb2.Status:
    detail = shared_pb2.StreamDeleted(
        stream_identifier=shared_pb2.StreamIdentifier(stream_name=stream.encode("utf8"))
    )
    return status_with_detail(code_pb2.NOT_FOUND, "StreamDeleted", detail)


def batch_timeout() -> status_pb2.Status:
    return status_with_detail(code_pb2.DEADLINE_EXCEEDED, "Timeout", shared_pb2.Timeout())


def batch_bad_request(message: str) -> status_pb2.Status:
    detail = shared_pb2.BadRequest(message=message)
    return status_with_detail(code_pb2.INVALID_ARGUMENT, message, detail)


def batch_too_big(max_append_size: int) -> status_pb2.Status:
    detail = shared_pb2.MaximumAppendSizeExceeded(maxAppendSize=max_append_size)
    return status_with_detail(code_pb2.INVALID_ARGUMENT, "MaximumAppendSizeExceeded", detail)
