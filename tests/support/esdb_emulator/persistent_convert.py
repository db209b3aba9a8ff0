"""Conversions to the PersistentSubscriptions protos (their messages are not the Streams ones,
though the recorded-event fields match)."""

from __future__ import annotations

from typing import Any

from esdbclient.protos.Grpc import persistent_pb2

from .convert import recorded_event_fields
from .persistent_model import Delivery, GroupStats
from .records import Record

ReadResp = persistent_pb2.ReadResp
ReadEvent = persistent_pb2.ReadResp.ReadEvent
RecordedEvent = persistent_pb2.ReadResp.ReadEvent.RecordedEvent
SubscriptionInfo = persistent_pb2.SubscriptionInfo

ANONYMOUS = "anonymous"  # the user name the server reports for an insecure connection


def confirmation_resp(subscription_id: str) -> ReadResp:
    return ReadResp(
        subscription_confirmation=ReadResp.SubscriptionConfirmation(subscription_id=subscription_id)
    )


def _recorded_event(record: Record, string_ids: bool) -> RecordedEvent:
    return RecordedEvent(**recorded_event_fields(record, string_ids))


def event_resp(delivery: Delivery, *, string_ids: bool) -> ReadResp:
    """The event, the link it came through (if any), the original's position, retry count."""
    original = delivery.link if delivery.link is not None else delivery.record
    event = ReadEvent(
        event=_recorded_event(delivery.record, string_ids),
        commit_position=original.position,
        retry_count=delivery.retry_count,
    )
    if delivery.link is not None:
        event.link.CopyFrom(_recorded_event(delivery.link, string_ids))
    return ReadResp(event=event)


def subscription_info(stats: GroupStats) -> SubscriptionInfo:
    settings = stats.settings
    info = SubscriptionInfo(
        event_source=stats.event_source,
        group_name=stats.group_name,
        status=stats.status,
        average_per_second=0,
        total_items=stats.total_items,
        count_since_last_measurement=0,
        last_checkpointed_event_position=stats.last_checkpointed_position,
        last_known_event_position=stats.last_known_position,
        resolve_link_tos=settings.resolve_links,
        start_from=stats.start_from,
        message_timeout_milliseconds=settings.message_timeout_ms,
        extra_statistics=settings.extra_statistics,
        max_retry_count=settings.max_retry_count,
        live_buffer_size=settings.live_buffer_size,
        buffer_size=settings.history_buffer_size,
        read_batch_size=settings.read_batch_size,
        check_point_after_milliseconds=settings.checkpoint_after_ms,
        min_check_point_count=settings.min_checkpoint_count,
        max_check_point_count=settings.max_checkpoint_count,
        read_buffer_count=stats.read_buffer_count,
        live_buffer_count=stats.live_buffer_count,
        retry_buffer_count=stats.retry_buffer_count,
        total_in_flight_messages=stats.total_in_flight,
        outstanding_messages_count=stats.outstanding,
        named_consumer_strategy=settings.consumer_strategy,
        max_subscriber_count=settings.max_subscriber_count,
        parked_message_count=stats.parked,
    )
    for connection in stats.connections:
        fields: dict[str, Any] = {
            "from": connection.peer,  # a Python keyword, hence the dict
            "username": ANONYMOUS,
            "total_items": connection.total_items,
            "available_slots": connection.available_slots,
            "in_flight_messages": connection.in_flight,
            "connection_name": connection.connection_name,
        }
        info.connections.append(SubscriptionInfo.ConnectionInfo(**fields))
    return info
