"""Plain data of persistent subscriptions: group settings, messages, names and position texts.

Names and texts follow the EventStoreDB server (PersistentSubscriptionService,
PersistentSubscriptionParams, the *StreamPosition classes), because esdbclient parses some of
them back: `start_from` is split on ":" and "/" by `SubscriptionInfo.update_all_kwargs`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .reads import End, Origin, Start
from .records import Record

ALL_STREAM = "$all"
DISPATCH_TO_SINGLE = "DispatchToSingle"
ROUND_ROBIN = "RoundRobin"
PINNED = "Pinned"
PINNED_BY_CORRELATION = "PinnedByCorrelation"
STRATEGIES = (DISPATCH_TO_SINGLE, ROUND_ROBIN, PINNED, PINNED_BY_CORRELATION)
# The proto enum (CreateReq/UpdateReq.ConsumerStrategy) knows only the first three.
STRATEGY_BY_ENUM = {0: DISPATCH_TO_SINGLE, 1: ROUND_ROBIN, 2: PINNED}

CHECKPOINT_EVENT_TYPE = "$SubscriptionCheckpoint"
LINK_EVENT_TYPE = "$>"
TICKS_PER_MILLISECOND = 10_000


class GroupError(Exception):
    """A request the server answers with PersistentSubscriptionFailed (INTERNAL)."""


def subscription_id(source: str, group: str) -> str:
    """The key the server confirms reads with; esdbclient splits it on "::"."""
    return f"{source}::{group}"


def parked_stream(key: str) -> str:
    return f"$persistentsubscription-{key}-parked"


def checkpoint_stream(key: str) -> str:
    return f"$persistentsubscription-{key}-checkpoint"


def position_text(is_all: bool, position: int) -> str:
    """PersistentSubscriptionAllStreamPosition / SingleStreamPosition .ToString()."""
    return f"C:{position}/P:{position}" if is_all else str(position)


def start_from_text(is_all: bool, origin: Origin) -> str:
    # "From the end" is the live position -1 (C:-1/P:-1 for $all), "from the start" is 0.
    if origin is End:
        return position_text(is_all, -1)
    if origin is Start:
        return position_text(is_all, 0)
    assert isinstance(origin, int)
    return position_text(is_all, origin)


def _millis(settings: Any, oneof: str, ms_field: str, ticks_field: str) -> int:
    which = settings.WhichOneof(oneof)
    if which == ticks_field:
        return int(getattr(settings, ticks_field) // TICKS_PER_MILLISECOND)
    if which == ms_field:
        return int(getattr(settings, ms_field))
    return 0


@dataclass(frozen=True, slots=True)
class GroupSettings:
    """What CreateReq/UpdateReq.Settings carry (the filter and start are kept elsewhere)."""

    resolve_links: bool
    extra_statistics: bool
    message_timeout_ms: int  # 0: messages never time out (the server's TimeSpan.MaxValue)
    max_retry_count: int
    live_buffer_size: int
    read_batch_size: int
    history_buffer_size: int
    checkpoint_after_ms: int
    min_checkpoint_count: int
    max_checkpoint_count: int
    max_subscriber_count: int  # 0: unlimited
    consumer_strategy: str

    @classmethod
    def from_proto(cls, settings: Any) -> GroupSettings:
        """From CreateReq.Settings or UpdateReq.Settings (only Create has the string field,
        which newer clients use for strategies the enum cannot name)."""
        strategy = getattr(settings, "consumer_strategy", "") or STRATEGY_BY_ENUM.get(
            settings.named_consumer_strategy, str(settings.named_consumer_strategy)
        )
        return cls(
            resolve_links=settings.resolve_links,
            extra_statistics=settings.extra_statistics,
            message_timeout_ms=_millis(
                settings, "message_timeout", "message_timeout_ms", "message_timeout_ticks"
            ),
            max_retry_count=settings.max_retry_count,
            live_buffer_size=settings.live_buffer_size,
            read_batch_size=settings.read_batch_size,
            history_buffer_size=settings.history_buffer_size,
            checkpoint_after_ms=_millis(
                settings, "checkpoint_after", "checkpoint_after_ms", "checkpoint_after_ticks"
            ),
            min_checkpoint_count=settings.min_checkpoint_count,
            max_checkpoint_count=settings.max_checkpoint_count,
            max_subscriber_count=settings.max_subscriber_count,
            consumer_strategy=strategy,
        )

    def validate(self) -> None:
        """The server's own checks (registry, PersistentSubscription constructor)."""
        if self.consumer_strategy not in STRATEGIES:
            raise GroupError(f"Consumer strategy {self.consumer_strategy} does not exist.")
        if self.read_batch_size >= self.history_buffer_size:
            raise GroupError("ReadBatchSize may not be greater than or equal to BufferSize")

    @property
    def message_timeout(self) -> float | None:
        return self.message_timeout_ms / 1000 if self.message_timeout_ms > 0 else None

    @property
    def checkpoint_after(self) -> float:
        return max(0, self.checkpoint_after_ms) / 1000


@dataclass(slots=True, eq=False)
class Message:
    """An event on its way through a group (the server's OutstandingMessage).

    `record` is what is delivered as the event, `link` the link it was resolved from (a
    `$>` when resolving links, or the parked-stream link when replaying parked messages).
    """

    record: Record
    link: Record | None
    position: int | None  # source position; None for a replayed parked message
    sequence: int | None  # read order, for checkpoints; None for replayed parked messages
    previous: int | None  # source position read just before this one (None: none yet)
    retry_count: int = 0

    @property
    def original(self) -> Record:
        """The server's OriginalEvent: the link when there is one."""
        return self.link if self.link is not None else self.record

    @property
    def event_id(self) -> str:
        """What consumers ack and nack (esdbclient's `ack_id`)."""
        return self.original.event_id


@dataclass(frozen=True, slots=True)
class Delivery:
    """One event as sent to one consumer (the retry count at the time it was sent)."""

    record: Record
    link: Record | None
    retry_count: int


@dataclass(frozen=True, slots=True)
class ConnectionStats:
    connection_name: str
    peer: str
    total_items: int
    in_flight: int
    available_slots: int


@dataclass(frozen=True, slots=True)
class GroupStats:
    """What SubscriptionInfo reports for one group."""

    event_source: str
    group_name: str
    status: str
    connections: tuple[ConnectionStats, ...]
    total_items: int
    last_checkpointed_position: str
    last_known_position: str
    start_from: str
    settings: GroupSettings
    read_buffer_count: int
    live_buffer_count: int
    retry_buffer_count: int
    total_in_flight: int
    outstanding: int
    parked: int
