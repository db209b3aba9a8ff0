"""The EventStoreDB catch-up subscription behind ``EventStoreDBStore.subscribe``.

A reader thread owns the gRPC subscription to ``$all`` (server-side filter on wire names,
checkpoints and caught-up included) and fills a bounded buffer that the consumer iterates; the
buffer's size is exposed as ``buffered`` so that the projection runner can batch.

No gap, no duplicate: when the subscription drops (node unavailable, "not leader", the server
ended the call, the channel was replaced by a reconnect), the reader resubscribes from the last
position it *received*. The server's start is exclusive, and anything at or before that
position is dropped on arrival as well. Failures that persist past the store's retry bound end
the iteration with ``StoreUnavailable``.

Checkpoints past filtered-out events: the server sends them only every few windows, and never
at the end of catch-up. So the reader notes the store's head before subscribing (everything up
to it has been considered once the server says "caught up"), and a consumer left idle asks the
server whether anything this subscription would deliver lies between its position and the
current head; if nothing does, it may safely checkpoint at the head (an event committed after
the head was read has a greater position, so it is still delivered).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from esdbclient import RecordedEvent
from esdbclient.events import CaughtUp as EsdbCaughtUp
from esdbclient.events import Checkpoint as EsdbCheckpoint

from terret.adapters.stores._esdb import (
    DELETION_EVENT_TYPE,
    Failure,
    Retrier,
    TypeFilter,
    classify,
    log,
    to_stored,
)
from terret.domain.store import CaughtUp, Checkpoint, Subscription, SubscriptionItem

if TYPE_CHECKING:
    from terret.adapters.stores.eventstoredb import EventStoreDBStore

# A subscription that stayed up this long before failing counts as recovered: its failure
# starts a fresh retry window (a load balancer cutting idle calls every minute is not a
# persistent fault). One that fails faster keeps the old window, so a server that accepts and
# drops every subscription at once still ends in StoreUnavailable.
STABLE_SECONDS = 1.0

# How often a subscription re-reads the deletions stream while events flow, so that a stream
# deleted during a long catch-up stops being delivered soon after.
DELETIONS_REFRESH_SECONDS = 1.0


class EsdbSubscription(Subscription):
    def __init__(
        self, store: EventStoreDBStore, after: int, wire_names: Collection[str] | None
    ) -> None:
        super().__init__()
        self._store = store
        self._wire_names = frozenset(wire_names) if wire_names is not None else None
        self._filter: TypeFilter = store.type_filter(self._wire_names)
        self._position = after  # the last position received (event, checkpoint or probe)
        self._position_lock = threading.Lock()
        self._deleted: frozenset[str] = frozenset()
        self._deleted_at = 0.0
        self._items: deque[SubscriptionItem] = deque()
        self._cond = threading.Condition()
        self._waiting = False
        self._error: BaseException | None = None
        self._done = False
        self._caught_up = False
        self._head_before = 0  # the log's head read just before the current subscription
        self._inner: Any = None  # esdbclient's CatchupSubscription while one is open
        self._inner_lock = threading.Lock()
        self._thread = threading.Thread(
            target=self._read_loop, name="terret-esdb-subscription", daemon=True
        )
        self.resubscriptions = 0  # how many times the subscription was re-established

    # --- consumer side ---------------------------------------------------------------------

    @property
    def position(self) -> int:
        """The position up to which the server's events were received or skipped."""
        return self._position

    @property
    def buffered(self) -> int:
        """Items received and not yet taken by the consumer."""
        return len(self._items)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        super().stop()
        with self._inner_lock:
            inner = self._inner
        if inner is not None:
            try:
                inner.stop()  # cancels the gRPC call: the reader's blocked next() returns
            except Exception:  # noqa: BLE001 - the call is gone either way
                pass
        with self._cond:
            self._cond.notify_all()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def __next__(self) -> SubscriptionItem:
        if self.stopped:
            raise StopIteration
        try:
            return self._items.popleft()
        except IndexError:
            pass
        # Outside the handler, so that an error raised while waiting is not chained to it.
        return self._wait_next()

    def _wait_next(self) -> SubscriptionItem:
        idle_since = time.monotonic()
        while True:
            if self.stopped:
                raise StopIteration
            with self._cond:
                # Flag first, then look: the reader appends, then reads the flag, so an item
                # that the look misses comes with a notify (the timeout is only a safety net).
                self._waiting = True
                if self._items:
                    self._waiting = False
                    return self._items.popleft()
                error = self._error
                if error is None:
                    if self._done:
                        raise StopIteration
                    self._cond.wait(0.1)
                    self._waiting = False
                else:
                    self._error = None
                    self._waiting = False
            if error is not None:
                raise error
            if (
                self._caught_up
                and not self._items
                and time.monotonic() - idle_since >= self._store.idle_checkpoint_after
            ):
                idle_since = time.monotonic()
                checkpoint = self._probe()
                if checkpoint is not None:
                    return checkpoint

    def _probe(self) -> Checkpoint | None:
        """A checkpoint at the log's head, if nothing this subscription would deliver lies
        between its position and that head (so nothing can arrive at or before it later).
        One attempt, no retries: an idle subscription simply tries again later."""
        store = self._store
        with self._position_lock:
            start = self._position
        if self._inner is None:
            return None  # the reader is reconnecting: its failure, not an idle stream
        try:
            client = store._client()
            head = store.read_head(client, store.retry.call_timeout)
            if head <= start:
                return None
            with client.read_all(
                commit_position=start if start > 0 else None,
                limit=2,
                timeout=store.retry.call_timeout,
                **self._filter.server_filter(),
            ) as events:
                for event in events:
                    position = event.commit_position or 0
                    if start < position <= head:
                        return None  # on its way to the reader: no checkpoint past it
        except Exception as exc:  # noqa: BLE001 - a probe is optional
            log.debug("idle checkpoint probe failed: %s", store._uri.scrub(str(exc)))
            return None
        with self._position_lock:
            if self._position != start:
                return None  # the reader moved meanwhile; its items come first
            self._position = head
        return Checkpoint(head)

    # --- reader side -----------------------------------------------------------------------

    def _push(self, item: SubscriptionItem) -> None:
        self._items.append(item)
        if self._waiting:
            with self._cond:
                self._cond.notify()
        limit = self._store.subscription_buffer
        if len(self._items) >= limit:
            # Back-pressure: the consumer is behind; let it drain to half before reading on.
            while len(self._items) > limit // 2 and not self.stopped:
                time.sleep(0.005)

    def _advance(self, position: int) -> bool:
        """Move the position forward; False if ``position`` was already passed."""
        with self._position_lock:
            if position <= self._position:
                return False
            self._position = position
            return True

    def _receive(self, event: RecordedEvent) -> None:
        if isinstance(event, EsdbCheckpoint):
            if event.commit_position is not None and self._advance(event.commit_position):
                self._push(Checkpoint(event.commit_position))
        elif isinstance(event, EsdbCaughtUp):
            # Everything up to the head read before subscribing has been considered: say so
            # with a checkpoint (as the other stores do), then mark the switch to live once.
            if self._advance(self._head_before):
                self._push(Checkpoint(self._head_before))
            if not self._caught_up:
                self._caught_up = True
                self._push(CaughtUp(self._position))
        else:
            position = event.commit_position
            if position is None or not self._advance(position):
                return  # already delivered before a resubscription
            if event.type == DELETION_EVENT_TYPE:
                self._store.note_deletion(event)
                self._deleted = self._store.deleted_streams(refresh=False)
                return
            if not self._filter.delivers(event.type):
                return  # the server filter is authoritative; this only keeps internals out
            if time.monotonic() - self._deleted_at > DELETIONS_REFRESH_SECONDS:
                self._refresh_deletions()
            if event.stream_name in self._deleted:
                return
            self._push(to_stored(event))

    def _refresh_deletions(self) -> None:
        self._deleted = self._store.deleted_streams()
        self._deleted_at = time.monotonic()

    def _open(self) -> Any:
        store = self._store
        if self._wire_names is None:
            # The catalogue may have grown since the last (re)subscription.
            self._filter = store.type_filter(None)
        client = store._client()
        # Every event up to this head was committed before the subscription starts, so the
        # server has considered all of them once it says "caught up". Single attempts here:
        # a failure is retried by the subscription's own loop, within its own bound.
        timeout = store.retry.call_timeout
        self._head_before = store.read_head(client, timeout)
        store.refresh_deletions(client, timeout)
        self._deleted = store.deleted_streams(refresh=False)
        self._deleted_at = time.monotonic()
        with self._position_lock:
            start = self._position
        inner = client.subscribe_to_all(
            commit_position=start if start > 0 else None,
            include_checkpoints=True,
            include_caught_up=True,
            window_size=store.window_size,
            checkpoint_interval_multiplier=store.checkpoint_interval_multiplier,
            **self._filter.server_filter(),
        )
        with self._inner_lock:
            self._inner = inner
            stopped = self.stopped
        if stopped:  # stop() ran while the call was being set up and could not cancel it
            inner.stop()
        return inner

    def _close_inner(self) -> None:
        with self._inner_lock:
            inner, self._inner = self._inner, None
        if inner is not None:
            try:
                inner.stop()
            except Exception:  # noqa: BLE001 - the call is gone either way
                pass

    def _read_loop(self) -> None:
        try:
            self._follow()
        except BaseException as exc:  # handed to the consumer, raised from __next__
            with self._cond:
                self._error = exc
        finally:
            self._close_inner()
            with self._cond:
                self._done = True
                self._cond.notify_all()

    def _follow(self) -> None:
        store = self._store
        retrier = Retrier(
            store.retry, "subscription to $all", store.describe(), sleep=self._stopped.wait
        )
        while not self.stopped:
            opened_at: float | None = None
            failure: Failure | None
            try:
                inner = self._open()
                opened_at = time.monotonic()
                for event in inner:
                    self._receive(event)
                    if retrier.attempts:
                        retrier.reset()
                if self.stopped:
                    return
                # esdbclient ends the iteration quietly when its channel is closed under it
                # (another thread reconnected) or the server ends the call: resume.
                failure = Failure(True, "the subscription ended", reconnect=False)
            except Exception as exc:
                if self.stopped:
                    return
                failure = classify(exc, store._uri)
                if failure is None:
                    raise
            finally:
                self._close_inner()
            if opened_at is not None and time.monotonic() - opened_at >= STABLE_SECONDS:
                retrier.reset()
            store._recover(failure, retrier.attempts + 1)
            retrier.failed(failure)
            self.resubscriptions += 1
