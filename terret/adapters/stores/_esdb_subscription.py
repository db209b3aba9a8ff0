"""The EventStoreDB catch-up subscription behind ``EventStoreDBStore.subscribe``.

The consumer's own thread iterates the gRPC subscription to ``$all`` (server-side filter on
wire names, checkpoints and caught-up included): a reader thread handing items over would cost
a thread switch per event, which measured as a third of the catch-up throughput.

A subscription to some streams filters on stream names server-side instead (the server filters
on event types or on stream names, not both; ``stream_filter``) and on wire names here. Its
filter lets the deletions stream through as well: the subscription learns from its records
which streams are gone (and never delivers them), as one filtered on types does.

No gap, no duplicate: when the subscription drops (node unavailable, "not leader", the server
ended the call, the channel was replaced by a reconnect), it resubscribes from the last
position it received. The server's start is exclusive, and anything at or before that position
is dropped on arrival as well. Failures that persist past the store's retry bound end the
iteration with ``StoreUnavailable``.

Checkpoints past filtered-out events: the server sends them only every few windows, and never
at the end of catch-up. So the subscription notes the store's head before subscribing
(everything up to it has been considered once the server says "caught up"). And while the
consumer waits on an idle subscription, a watchdog thread asks the server, now and then,
whether anything this subscription would deliver lies between its position and the current
head; if nothing does, a checkpoint at that head is safe (an event committed after the head was
read has a greater position and is still delivered). To hand the checkpoint over, the watchdog
cancels the waiting call, and the consumer resubscribes from the checkpoint.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from esdbclient import RecordedEvent
from esdbclient.events import CaughtUp as EsdbCaughtUp
from esdbclient.events import Checkpoint as EsdbCheckpoint

from terret.adapters.stores._esdb import (
    DELETION_EVENT_TYPE,
    DELETIONS_STREAM,
    EsdbLog,
    TypeFilter,
    include_pattern,
    to_stored,
)
from terret.adapters.stores._esdb_connection import EsdbConnection, Failure, Reopening, log
from terret.domain.store import CaughtUp, Checkpoint, Subscription, SubscriptionItem

# How often a subscription re-reads the deletions stream while events flow, so that a stream
# deleted during a long catch-up stops being delivered soon after.
DELETIONS_REFRESH_SECONDS = 1.0


def stream_filter(streams: Collection[str]) -> dict[str, Any]:
    """The server-side filter of a subscription to ``streams``: their exact names (escaped,
    anchored: esdbclient wraps the pattern in ``^…$``), and the deletions stream's."""
    return {"filter_include": [include_pattern({*streams, DELETIONS_STREAM})],
            "filter_exclude": (), "filter_by_stream_name": True}


@dataclass(frozen=True)
class SubscriptionOptions:
    """The server-side filter's paging (a checkpoint every ``window_size`` ×
    ``checkpoint_interval_multiplier`` events considered) and the idle probe's period."""

    window_size: int = 64
    checkpoint_interval_multiplier: int = 2
    idle_checkpoint_after: float = 0.5


class EsdbSubscription(Subscription):
    def __init__(self, connection: EsdbConnection, log: EsdbLog, options: SubscriptionOptions,
                 after: int, wire_names: Collection[str] | None,
                 streams: Collection[str] | None = None) -> None:
        super().__init__()
        self._connection = connection
        self._log = log
        self._options = options
        self._wire_names = frozenset(wire_names) if wire_names is not None else None
        self._filter: TypeFilter = log.type_filter(self._wire_names)
        self._streams = frozenset(streams) if streams is not None else None
        # Built once: every (re)subscription and idle probe asks the server for these streams.
        self._stream_filter = stream_filter(self._streams) if self._streams is not None else None
        self._ready: deque[SubscriptionItem] = deque()
        # Shared with the watchdog: the position, the open call, a checkpoint it decided on.
        self._lock = threading.Lock()
        self._position = after  # the last position received (event, checkpoint or probe)
        self._inner: Any = None  # esdbclient's CatchupSubscription while one is open
        self._pending: int | None = None
        self._waiting = False  # the consumer is blocked in the server call
        self._last_activity = time.monotonic()
        self._caught_up = False
        self._head_before = 0  # the store's head read just before the current subscription
        self._deleted: frozenset[str] = frozenset()
        self._deleted_at = 0.0
        self._reopening = Reopening(connection, connection.retrier(
            "subscription to $all", sleep=self._stopped.wait))
        self._finished = False
        self._watchdog: threading.Thread | None = None

    @property
    def resubscriptions(self) -> int:
        """How many times the subscription was re-established."""
        return self._reopening.count

    # --- the consumer's side ---------------------------------------------------------------

    @property
    def position(self) -> int:
        """The position up to which the server's events were received or skipped."""
        return self._position

    @property
    def buffered(self) -> int:
        """Items that can be taken without waiting for new events: the ones already received,
        plus, during catch-up, the history still streaming in (counted as one), so that a
        consumer batching on ``buffered`` batches history and hands live events over at once."""
        return len(self._ready) + (0 if self._caught_up else 1)

    def start(self) -> None:
        """Nothing to do: the first ``next()`` subscribes."""

    def stop(self) -> None:
        super().stop()
        with self._lock:
            inner = self._inner
        if inner is not None:
            _cancel(inner)  # the consumer's blocked next() returns

    def __next__(self) -> SubscriptionItem:
        while True:
            if self.stopped or self._finished:
                self._drop_inner()
                raise StopIteration
            if self._ready:
                return self._ready.popleft()
            self._step()

    def _step(self) -> None:
        """Take one message from the server (subscribing first if needed), or handle one
        failure: back off and let the next step resubscribe, or raise ``StoreUnavailable``."""
        failure: Failure | None = None
        try:
            inner = self._inner if self._inner is not None else self._open()
            with self._lock:
                self._waiting = True
            try:
                event = next(inner)
            finally:
                with self._lock:
                    self._waiting = False
        except StopIteration:
            # esdbclient ends the iteration quietly when the call was cancelled (stop(), the
            # watchdog, another thread's reconnect closing the channel) or the server ended it.
            planned = self._take_pending()
            self._drop_inner()
            if self.stopped or planned:
                return
            failure = Failure(True, "the subscription ended", reconnect=False)
        except Exception as exc:
            self._take_pending()
            self._drop_inner()
            if self.stopped:
                return
            failure = self._connection.failure(exc)
            if failure is None:
                self._finished = True
                raise
        else:
            try:
                self._receive(event)
            except BaseException:
                self._finished = True  # e.g. CorruptRecord: never skipped, never retried
                raise
            return
        self._handle(failure)

    def _handle(self, failure: Failure) -> None:
        self._finished = True  # if the retrier gives up, the iteration ends with its error
        self._reopening.failed(failure)
        self._finished = False

    def _receive(self, event: RecordedEvent) -> None:
        position = self._advance(event)
        if position is None:
            return
        self._reopening.received()
        self._deliver(event, position)

    def _advance(self, event: RecordedEvent) -> int | None:
        """Under the lock: the watchdog's pending checkpoint, then the caught-up mark or the
        event's position. The position to deliver the event at, or None if it is not one."""
        with self._lock:
            self._last_activity = time.monotonic()
            if self._pending is not None:
                # The watchdog checkpointed while this message was on its way; the checkpoint
                # is below it (nothing deliverable lay below the checkpoint), so it goes first.
                self._queue_checkpoint(self._pending)
                self._pending = None
            if isinstance(event, EsdbCaughtUp):
                self._mark_caught_up()
                return None
            position = event.commit_position
            if position is None or position <= self._position:
                return None  # already delivered before a resubscription
            self._position = position
            return position

    def _mark_caught_up(self) -> None:
        # Everything up to the head read before subscribing has been considered: say so with a
        # checkpoint (as the other stores do), then mark the switch once. (Under the lock.)
        if self._head_before > self._position:
            self._position = self._head_before
            self._ready.append(Checkpoint(self._position))
        if not self._caught_up:
            self._caught_up = True
            self._ready.append(CaughtUp(self._position))

    def _deliver(self, event: RecordedEvent, position: int) -> None:
        if isinstance(event, EsdbCheckpoint):
            self._ready.append(Checkpoint(position))
        elif event.type == DELETION_EVENT_TYPE:
            self._log.note_deletion(event)
            self._deleted = self._log.deleted_streams(refresh=False)
        elif self._filter.delivers(event.type) and (
                self._streams is None or event.stream_name in self._streams):
            if time.monotonic() - self._deleted_at > DELETIONS_REFRESH_SECONDS:
                self._refresh_deletions()
            if event.stream_name not in self._deleted:
                self._ready.append(to_stored(event))

    def _server_filter(self) -> dict[str, Any]:
        """What the server selects: these streams' events (and the deletions), or the wire
        names' (and the deletions)."""
        if self._stream_filter is not None:
            return self._stream_filter
        return self._filter.server_filter()

    def _refresh_deletions(self) -> None:
        self._deleted = self._log.deleted_streams()
        self._deleted_at = time.monotonic()

    def _open(self) -> Any:
        if self._wire_names is None:
            # The catalogue may have grown since the last (re)subscription.
            self._filter = self._log.type_filter(None)
        client = self._connection.client()
        # Single attempts: a failure here is retried by this subscription's own loop, within
        # its own bound.
        timeout = self._connection.call_timeout
        self._head_before = self._log.read_head(client, timeout)
        self._log.refresh_deletions(client, timeout)
        self._deleted = self._log.deleted_streams(refresh=False)
        self._deleted_at = time.monotonic()
        with self._lock:
            start = self._position
        inner = client.subscribe_to_all(
            commit_position=start if start > 0 else None,
            include_checkpoints=True,
            include_caught_up=True,
            window_size=self._options.window_size,
            checkpoint_interval_multiplier=self._options.checkpoint_interval_multiplier,
            **self._server_filter(),
        )
        with self._lock:
            self._inner = inner
            self._last_activity = time.monotonic()
        self._reopening.opened()
        self._start_watchdog()
        if self.stopped:  # stop() ran while the call was being set up and could not cancel it
            _cancel(inner)
        return inner

    def _drop_inner(self) -> None:
        with self._lock:
            inner, self._inner = self._inner, None
        if inner is not None:
            _cancel(inner)

    def _take_pending(self) -> bool:
        """Queue the watchdog's checkpoint, if it decided on one; True if it did."""
        with self._lock:
            pending, self._pending = self._pending, None
            if pending is None:
                return False
            self._queue_checkpoint(pending)
        return True

    def _queue_checkpoint(self, position: int) -> None:
        """The watchdog's checkpoint. Servers before 23.10 never say "caught up"; a probe that
        found nothing to deliver up to the head means exactly that, so it says it for them."""
        self._ready.append(Checkpoint(position))
        if not self._caught_up:
            self._caught_up = True
            self._ready.append(CaughtUp(position))

    # --- the watchdog ----------------------------------------------------------------------

    def _start_watchdog(self) -> None:
        if self._watchdog is None and self._options.idle_checkpoint_after > 0:
            self._watchdog = threading.Thread(
                target=self._watch, name="terret-esdb-idle-checkpoints", daemon=True
            )
            self._watchdog.start()

    def _watch(self) -> None:
        idle = self._options.idle_checkpoint_after
        while not self._stopped.wait(idle / 2):
            with self._lock:
                due = (
                    self._waiting
                    and self._inner is not None
                    and self._pending is None
                    and time.monotonic() - self._last_activity >= idle
                )
                start = self._position
            if not due:
                continue
            head = self._probe(start)
            if head is None:
                continue
            with self._lock:
                if self._position != start or not self._waiting or self._inner is None:
                    continue  # something arrived meanwhile; it comes first
                if head <= start and self._caught_up:
                    continue  # nothing new to say
                self._position = max(head, start)
                self._pending = self._position
                self._last_activity = time.monotonic()
                inner = self._inner
            _cancel(inner)

    def _probe(self, start: int) -> int | None:
        """The store's head, if nothing this subscription would deliver lies between ``start``
        and it (a head at or below ``start`` included: there is nothing left to deliver).
        One attempt, no retries: an idle subscription simply asks again later."""
        timeout = self._connection.call_timeout
        try:
            client = self._connection.client()
            head = self._log.read_head(client, timeout)
            if head <= start:
                return head  # nothing after the position: caught up, if not said yet
            with client.read_all(
                commit_position=start if start > 0 else None,
                limit=2,
                timeout=timeout,
                **self._server_filter(),
            ) as events:
                for event in events:
                    if start < (event.commit_position or 0) <= head:
                        return None  # on its way to the consumer: no checkpoint past it
        except Exception as exc:  # noqa: BLE001 - a probe is optional
            log.debug("idle checkpoint probe failed: %s", self._connection.scrub(str(exc)))
            return None
        return head


def _cancel(inner: Any) -> None:
    try:
        inner.stop()
    except Exception:  # noqa: BLE001 - the call is gone either way
        pass
