"""Consumers of a persistent subscription group and the strategies that choose one per message.

The strategies follow the server's ConsumerStrategy classes:
* RoundRobin: each message goes to the next consumer in turn that has a free slot;
* DispatchToSingle: every message goes to the first consumer until it is full, then the
  queue rotates to the next one (and stays rotated);
* Pinned / PinnedByCorrelation: the source stream (or the `$correlationId` of the event
  metadata) is hashed into one of 1024 buckets. A bucket is assigned, on first use, to the
  connected consumer with the fewest buckets and stays with it while it is connected; a
  consumer that joins takes over buckets from consumers holding more than their share; the
  buckets of a consumer that leaves are reassigned on their next message. When the bucket's
  consumer is full the message is skipped for now (later messages may still go out).
"""

from __future__ import annotations

import enum
import math
import zlib
from collections import deque
from dataclasses import dataclass
from typing import Protocol

from .persistent_model import (
    DISPATCH_TO_SINGLE,
    LINK_EVENT_TYPE,
    PINNED,
    PINNED_BY_CORRELATION,
    ROUND_ROBIN,
    Delivery,
    Message,
)
from .records import json_object

BUCKET_COUNT = 1024
CORRELATION_ID_PROPERTY = "$correlationId"


class Consumer:
    """One Read call connected to a group: its in-flight messages and its outbox.

    `max_in_flight` is the `buffer_size` of the read request (esdbclient's
    `event_buffer_size`): the server never has more unacknowledged messages out to it.
    """

    def __init__(self, max_in_flight: int, connection_name: str, peer: str) -> None:
        self.max_in_flight = max(1, max_in_flight)
        self.connection_name = connection_name
        self.peer = peer
        self.in_flight: dict[str, Message] = {}
        self.outbox: deque[Delivery] = deque()
        self.total_items = 0
        self.drop_reason: str | None = None  # set: the call is to end with this drop
        self.closed = False  # set: the call has ended (client went away)

    @property
    def available_slots(self) -> int:
        return self.max_in_flight - len(self.in_flight)

    def push(self, message: Message) -> bool:
        if self.available_slots <= 0:
            return False
        self.in_flight[message.event_id] = message
        self.outbox.append(Delivery(message.record, message.link, message.retry_count))
        self.total_items += 1
        return True

    def release(self, event_id: str) -> Message | None:
        return self.in_flight.pop(event_id, None)

    @property
    def ended(self) -> bool:
        return self.closed or self.drop_reason is not None

    def drop(self, reason: str) -> None:
        if self.drop_reason is None:
            self.drop_reason = reason


class PushResult(enum.Enum):
    SENT = "sent"
    SKIPPED = "skipped"  # this message cannot go now; later ones may
    NO_CAPACITY = "no capacity"  # no consumer can take anything


@dataclass(frozen=True, slots=True)
class Pushed:
    result: PushResult
    consumer: Consumer | None = None


NO_CAPACITY = Pushed(PushResult.NO_CAPACITY)
SKIPPED = Pushed(PushResult.SKIPPED)


class Strategy(Protocol):
    name: str

    def add(self, consumer: Consumer) -> None: ...

    def remove(self, consumer: Consumer) -> None: ...

    def push(self, message: Message) -> Pushed: ...

    def released(self, consumer: Consumer, message: Message) -> None:
        """`message` left `consumer`'s in-flight set (ack, nack, timeout)."""


class RoundRobin:
    name = ROUND_ROBIN

    def __init__(self) -> None:
        self.queue: deque[Consumer] = deque()

    def add(self, consumer: Consumer) -> None:
        self.queue.append(consumer)

    def remove(self, consumer: Consumer) -> None:
        self.queue.remove(consumer)

    def push(self, message: Message) -> Pushed:
        for _ in range(len(self.queue)):
            consumer = self.queue.popleft()
            self.queue.append(consumer)
            if consumer.push(message):
                return Pushed(PushResult.SENT, consumer)
        return NO_CAPACITY

    def released(self, consumer: Consumer, message: Message) -> None:
        pass


class DispatchToSingle(RoundRobin):
    name = DISPATCH_TO_SINGLE

    def push(self, message: Message) -> Pushed:
        for _ in range(len(self.queue)):
            consumer = self.queue[0]
            if consumer.push(message):
                return Pushed(PushResult.SENT, consumer)
            self.queue.rotate(-1)
        return NO_CAPACITY


class _Node:
    def __init__(self, consumer: Consumer) -> None:
        self.consumer = consumer
        self.connected = True
        self.assignments = 0


class _Bucket:
    __slots__ = ("in_flight", "node")

    def __init__(self) -> None:
        self.node: _Node | None = None  # None: unassigned; a disconnected node: to reassign
        self.in_flight = 0

    @property
    def assigned(self) -> bool:
        return self.node is not None and self.node.connected


def source_stream(message: Message) -> str:
    """The stream an event comes from; an unresolved link points at `N@stream`."""
    record = message.record
    if record.type == LINK_EVENT_TYPE:
        _, sep, stream = record.data.decode("utf8", "replace").partition("@")
        if sep:
            return stream
    return record.stream


class Pinned:
    name = PINNED

    def __init__(self) -> None:
        self.nodes: list[_Node] = []
        self.buckets = [_Bucket() for _ in range(BUCKET_COUNT)]

    def pin_key(self, message: Message) -> str:
        return source_stream(message)

    def _bucket(self, message: Message) -> _Bucket:
        # The server hashes with xxHash; any stable hash gives the same behaviour.
        return self.buckets[zlib.crc32(self.pin_key(message).encode("utf8")) % BUCKET_COUNT]

    def _node(self, consumer: Consumer) -> _Node | None:
        return next((n for n in self.nodes if n.consumer is consumer), None)

    def _assign(self, bucket: _Bucket, node: _Node) -> None:
        if bucket.node is not None:
            bucket.node.assignments -= 1
        bucket.node = node
        node.assignments += 1

    def add(self, consumer: Consumer) -> None:
        new = _Node(consumer)
        self.nodes.append(new)
        connected = [n for n in self.nodes if n.connected]
        assigned = sum(1 for b in self.buckets if b.assigned)
        share = math.ceil(assigned / len(connected))
        # Existing consumers over their share hand buckets to the newcomer, the buckets
        # with the fewest messages in flight first.
        for node in connected:
            if node is new or node.assignments <= share:
                continue
            owned = [b for b in self.buckets if b.node is node]
            owned.sort(key=lambda b: b.in_flight)
            for bucket in owned[: node.assignments - share]:
                self._assign(bucket, new)
        self.nodes = [n for n in self.nodes if n.connected or n.assignments > 0]

    def remove(self, consumer: Consumer) -> None:
        node = self._node(consumer)
        if node is None:
            return
        node.connected = False
        for bucket in self.buckets:
            if bucket.node is node:
                bucket.in_flight = 0

    def push(self, message: Message) -> Pushed:
        connected = [n for n in self.nodes if n.connected]
        if sum(max(0, n.consumer.available_slots) for n in connected) <= 0:
            return NO_CAPACITY
        bucket = self._bucket(message)
        if not bucket.assigned:
            self._assign(bucket, min(connected, key=lambda n: n.assignments))
        assert bucket.node is not None
        if not bucket.node.consumer.push(message):
            return SKIPPED
        bucket.in_flight += 1
        return Pushed(PushResult.SENT, bucket.node.consumer)

    def released(self, consumer: Consumer, message: Message) -> None:
        bucket = self._bucket(message)
        if bucket.node is not None and bucket.node.consumer is consumer:
            bucket.in_flight = max(0, bucket.in_flight - 1)


class PinnedByCorrelation(Pinned):
    name = PINNED_BY_CORRELATION

    def pin_key(self, message: Message) -> str:
        metadata = json_object(message.record.custom_metadata) or {}
        correlation = metadata.get(CORRELATION_ID_PROPERTY)
        return correlation if isinstance(correlation, str) else source_stream(message)


def strategy_for(name: str) -> Strategy:
    factories: dict[str, type[Strategy]] = {
        DISPATCH_TO_SINGLE: DispatchToSingle,
        ROUND_ROBIN: RoundRobin,
        PINNED: Pinned,
        PINNED_BY_CORRELATION: PinnedByCorrelation,
    }
    return factories[name]()
