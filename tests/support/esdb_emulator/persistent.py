"""One persistent subscription group: the server's PersistentSubscription state machine.

Not thread-safe: the registry (`persistent_registry`) calls every method under its lock.

Flow of a message: read from the source into `pending` (the read buffer, bounded by
`history_buffer_size`), pushed by the consumer strategy to a consumer with a free slot
(`in_flight`, with a deadline of `message_timeout`), then one of:
* ack: done;
* nack retry / unknown, or the deadline passing: back to the `retry` buffer with
  `retry_count + 1` (sent again before anything new), unless it has already been retried
  `max_retry_count` times, in which case it is parked;
* nack park: a link to it is written to the parked stream; nack skip: dropped;
* nack stop: dropped, and that consumer's subscription ends;
* its consumer leaving: back to the retry buffer, `retry_count + 1`, for the others.
Retries and parked messages being replayed go out before new messages.

Checkpoints (TryMarkCheckpoint): every message read gets a sequence number, filtered-out
events included. The checkpoint candidate is the position just before the oldest message
not yet done (or the last position read when everything is done). It is written when at
least `max_checkpoint_count` messages were done since the last checkpoint, or on the clock
when at least `min_checkpoint_count` were and `checkpoint_after` has passed since.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import chain

from esdbclient.protos.Grpc import persistent_pb2

from .persistent_model import (
    ConnectionStats,
    GroupError,
    GroupSettings,
    GroupStats,
    Message,
    position_text,
    start_from_text,
    subscription_id,
)
from .persistent_source import Source
from .persistent_strategies import Consumer, PushResult, Strategy, strategy_for
from .persistent_streams import GroupStreams
from .reads import Origin, resolve_link
from .store import EventStore

Nack = persistent_pb2.ReadReq.Nack
RETRY_ACTIONS = (Nack.Retry, Nack.Unknown)  # the server treats Unknown as Retry

# Why a consumer's call ends (the service turns these into the server's status codes).
DROPPED = "dropped"  # update/delete: PersistentSubscriptionDropped
STOPPED = "stopped"  # nack with action Stop


class MaxSubscribersReached(Exception):
    pass


@dataclass(slots=True)
class InFlight:
    message: Message
    consumer: Consumer
    expires: float | None  # monotonic deadline; None: never times out


class Group:
    def __init__(
        self,
        store: EventStore,
        source: Source,
        name: str,
        settings: GroupSettings,
        origin: Origin,
    ) -> None:
        self._store = store
        self.source = source
        self.name = name
        self.key = subscription_id(source.name, name)
        self.streams = GroupStreams(store, self.key)
        self.checkpoint: int | None = None  # survives updates, like the checkpoint stream
        self.consumers: list[Consumer] = []
        self._start(settings, origin)

    # -- lifecycle -------------------------------------------------------------------------

    def _start(self, settings: GroupSettings, origin: Origin) -> None:
        """(Re)initialise as a new server-side subscription object does: resume after the
        last checkpoint when there is one, else start at `origin`."""
        self.settings = settings
        self.origin = origin
        self.strategy: Strategy = strategy_for(settings.consumer_strategy)
        self.in_flight: dict[str, InFlight] = {}
        self.retry: list[Message] = []
        self.pending: deque[Message] = deque()
        self.total_items = 0
        self.last_known: int | None = None
        self._last_checkpoint_time = -math.inf
        if self.checkpoint is None:
            self.cursor = self.source.start_cursor(self._store, origin)
            self._next_sequence, self._last_read_sequence = 0, -1
            self._checkpointed_sequence = -1
        else:
            self.cursor = self.source.cursor_after(self._store, self.checkpoint)
            self._next_sequence, self._last_read_sequence = 1, 0
            self._checkpointed_sequence = 0
        self._last_read_position = self.checkpoint
        self._fill()

    def update(self, settings: GroupSettings, origin: Origin) -> None:
        """Settings change: the server replaces the subscription, dropping its consumers."""
        self._drop_consumers()
        self._start(settings, origin)

    def delete(self) -> None:
        self._drop_consumers()
        self.streams.delete()

    def _drop_consumers(self) -> None:
        for consumer in self.consumers:
            consumer.drop(DROPPED)
        self.consumers = []

    # -- consumers -------------------------------------------------------------------------

    def connect(self, consumer: Consumer) -> None:
        limit = self.settings.max_subscriber_count
        if limit > 0 and len(self.consumers) >= limit:
            raise MaxSubscribersReached(self.key)
        self.consumers.append(consumer)
        self.strategy.add(consumer)
        self.dispatch()

    def disconnect(self, consumer: Consumer) -> None:
        """The consumer's call ended: what it had in flight goes to the others."""
        if consumer not in self.consumers:
            return  # already dropped by an update or delete
        self.consumers.remove(consumer)
        self.strategy.remove(consumer)
        lost = [f for f in self.in_flight.values() if f.consumer is consumer]
        for entry in sorted(lost, key=lambda f: f.message.original.number):
            self._retry(entry)
        self.dispatch()

    # -- acknowledgements ------------------------------------------------------------------

    def ack(self, event_ids: Iterable[str]) -> None:
        for event_id in event_ids:
            entry = self.in_flight.pop(event_id, None)
            if entry is not None:
                self._release(entry)
        self._try_checkpoint(time_check=False)
        self.dispatch()

    def nack(self, event_ids: Iterable[str], action: int, reason: str, consumer: Consumer) -> None:
        for event_id in event_ids:
            entry = self.in_flight.get(event_id)
            if entry is None:
                continue  # timed out or acked already
            if action in RETRY_ACTIONS:
                self._retry_or_park(entry)
            elif action == Nack.Park:
                self._park(entry, "Client explicitly NAK'ed message.\n" + reason)
            else:  # Skip, Stop: the server forgets the message
                del self.in_flight[event_id]
                self._release(entry)
        if action == Nack.Stop:
            # The server's StopSubscription is a no-op; the docs say "stop the
            # subscription", so the consumer that asked is disconnected.
            consumer.drop(STOPPED)
        self._try_checkpoint(time_check=False)
        self.dispatch()

    def replay_parked(self, stop_at: int | None) -> None:
        """Parked messages (below parked-stream event number `stop_at`) go out again as
        resolved links, before new messages; the parked stream is truncated past them."""
        if stop_at is not None and stop_at < 0:
            raise GroupError("Cannot stop replaying parked message at a negative version.")
        links, end = self.streams.parked_links(stop_at)
        for link in links:
            target = resolve_link(self._store, link)
            record, via = (target, link) if target is not None else (link, None)
            self.retry.append(Message(record, via, None, None, None))
        if end is not None:
            self.streams.mark_replayed(end)
        self.dispatch()

    # -- the clock -----------------------------------------------------------------------------

    def tick(self, now: float) -> None:
        """Time-outs, new events, time-based checkpoints (the server's clock tick)."""
        expired = [f for f in self.in_flight.values() if f.expires is not None and f.expires <= now]
        for entry in sorted(expired, key=lambda f: f.expires or 0.0):
            self._retry_or_park(entry)
        self.dispatch()
        self._try_checkpoint(time_check=True, now=now)

    def next_deadline(self) -> float | None:
        """When `tick` next has something to do without new events (None: nothing)."""
        deadlines = [f.expires for f in self.in_flight.values() if f.expires is not None]
        # Only a checkpoint the clock can actually write counts: one held back by an
        # unacked message would otherwise make the clock spin until that message is done.
        candidate = self._checkpoint_candidate()
        if candidate is not None and candidate[0] - self._checkpointed_sequence >= max(
            1, self.settings.min_checkpoint_count
        ):
            deadlines.append(self._last_checkpoint_time + self.settings.checkpoint_after)
        return min(deadlines) if deadlines else None

    # -- dispatch ------------------------------------------------------------------------------

    def dispatch(self) -> None:
        self._fill()
        if not self.consumers:
            return
        self.retry, halted = self._push_all(self.retry)
        while not halted:
            remaining, halted = self._push_all(list(self.pending))
            self.pending = deque(remaining)
            before = len(self.pending)
            self._fill()
            if len(self.pending) == before:
                return  # nothing more to read, or the read buffer is full of skipped messages

    def _push_all(self, messages: list[Message]) -> tuple[list[Message], bool]:
        """Offer each message to the strategy; returns those not sent and whether no
        consumer has any capacity left."""
        remaining: list[Message] = []
        for index, message in enumerate(messages):
            if message.event_id in self.in_flight:
                continue  # the server skips a duplicate event id
            pushed = self.strategy.push(message)
            if pushed.result is PushResult.SENT:
                assert pushed.consumer is not None
                self._begin(message, pushed.consumer)
            elif pushed.result is PushResult.SKIPPED:
                remaining.append(message)
            else:
                remaining.extend(messages[index:])
                return remaining, True
        return remaining, False

    def _begin(self, message: Message, consumer: Consumer) -> None:
        timeout = self.settings.message_timeout
        expires = None if timeout is None else time.monotonic() + timeout
        self.in_flight[message.event_id] = InFlight(message, consumer, expires)
        self.total_items += 1

    def _fill(self) -> None:
        limit = max(1, self.settings.history_buffer_size)
        while len(self.pending) < limit:
            item = self.source.read(self._store, self.cursor, self.settings.resolve_links)
            if item is None:
                return
            self.cursor += 1
            if not item.visible:
                continue
            sequence, previous = self._next_sequence, self._last_read_position
            self._next_sequence += 1
            self._last_read_sequence, self._last_read_position = sequence, item.position
            if item.matches:
                self.pending.append(
                    Message(item.record, item.link, item.position, sequence, previous)
                )
                self.last_known = item.position

    # -- outcomes of a message -----------------------------------------------------------------

    def _release(self, entry: InFlight) -> None:
        entry.consumer.release(entry.message.event_id)
        self.strategy.released(entry.consumer, entry.message)

    def _retry_or_park(self, entry: InFlight) -> None:
        if entry.message.retry_count >= self.settings.max_retry_count:
            self._park(entry, f"Reached retry count of {self.settings.max_retry_count}")
        else:
            self._retry(entry)

    def _retry(self, entry: InFlight) -> None:
        message = entry.message
        del self.in_flight[message.event_id]
        self._release(entry)
        message.retry_count += 1
        # Retries are kept in read order; replayed parked messages (no sequence) go last.
        index = next(
            (
                i
                for i, queued in enumerate(self.retry)
                if queued.sequence is None
                or (message.sequence is not None and queued.sequence > message.sequence)
            ),
            len(self.retry),
        )
        self.retry.insert(index, message)

    def _park(self, entry: InFlight, reason: str) -> None:
        del self.in_flight[entry.message.event_id]
        self._release(entry)
        self.streams.park(entry.message, reason)

    # -- checkpoints -----------------------------------------------------------------------------

    def _checkpoint_candidate(self) -> tuple[int, int] | None:
        """(sequence, position) a checkpoint would record now: just before the oldest
        message not done, or the last position read. None: nothing done yet."""
        undone = [
            m
            for m in chain((f.message for f in self.in_flight.values()), self.retry, self.pending)
            if m.sequence is not None
        ]
        if undone:
            oldest = min(undone, key=lambda m: m.sequence or 0)
            assert oldest.sequence is not None
            sequence, position = oldest.sequence - 1, oldest.previous
        else:
            sequence, position = self._last_read_sequence, self._last_read_position
        return None if position is None else (sequence, position)

    def _try_checkpoint(self, *, time_check: bool, now: float | None = None) -> None:
        candidate = self._checkpoint_candidate()
        if candidate is None:
            return
        sequence, position = candidate
        done = sequence - self._checkpointed_sequence
        if done <= 0:
            return
        now = time.monotonic() if now is None else now
        settings = self.settings
        if now - self._last_checkpoint_time < settings.checkpoint_after and (
            done < settings.max_checkpoint_count
        ):
            return
        if (done >= settings.min_checkpoint_count and time_check) or (
            done >= settings.max_checkpoint_count
        ):
            self._last_checkpoint_time = now
            self._checkpointed_sequence = sequence
            self.checkpoint = position
            self.streams.write_checkpoint(position_text(self.source.is_all, position))

    # -- statistics ----------------------------------------------------------------------------

    def stats(self) -> GroupStats:
        is_all = self.source.is_all
        live = self.source.at_end(self._store, self.cursor)
        connections = tuple(
            ConnectionStats(
                connection_name=c.connection_name,
                peer=c.peer,
                total_items=c.total_items,
                in_flight=len(c.in_flight),
                available_slots=c.available_slots,
            )
            for c in self.consumers
        )
        return GroupStats(
            event_source=self.source.name,
            group_name=self.name,
            status="Live" if live else "Behind",
            connections=connections,
            total_items=self.total_items,
            last_checkpointed_position=(
                "" if self.checkpoint is None else position_text(is_all, self.checkpoint)
            ),
            last_known_position=(
                "" if self.last_known is None else position_text(is_all, self.last_known)
            ),
            start_from=start_from_text(is_all, self.origin),
            settings=self.settings,
            read_buffer_count=0 if live else len(self.pending),
            live_buffer_count=len(self.pending) if live else 0,
            retry_buffer_count=len(self.retry),
            total_in_flight=sum(len(c.in_flight) for c in self.consumers),
            outstanding=len(self.in_flight),
            parked=self.streams.parked_count(),
        )
