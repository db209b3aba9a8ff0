"""The EventStoreDB consumer group behind ``EventStoreDBStore.consumer_group``
(``terret.domain.groups``): a persistent subscription to ``$all``.

The group (the server's subscription group) is created on the first join, with:

* a server-side event-type filter of the wire names asked for (``TypeFilter``, escaped as the
  store's reads are); events that reach a member anyway (a group created by another version
  with a wider filter; internal or system types) and events of streams ``delete_stream``
  removed are acked and passed over, never handed to the caller;
* the Pinned strategy: the server hashes an event's stream into a bucket and gives a bucket
  to one member while it stays connected; a member that joins takes buckets over from the
  others, one that leaves hands its buckets (and what it had not settled) to those that stay;
* a start at the beginning of the log, so that what was appended while no member ran is
  delivered once one joins (the server then resumes from its checkpoints);
* links left unresolved, a message time-out and a retry count after which the server parks
  the event, and no limit on the members (esdbclient's default of 5 would refuse the sixth).

A group that exists already (another worker created it, or won a race) is fine; if its
settings differ from these, they are updated (which drops its members for a moment: they join
again). Its filter cannot be: the server's update request carries none and its info reports
none. A group's filter is fixed at creation; to change the set of wire names, name another
group.

Joining, reading and settling run on the caller's thread through the store's connection. A
dropped read (a cut connection, a restarted server, the group updated or deleted — it is then
created again) is joined again inside the iterator, with backoff; what this member had not
settled the server gives out again. Transient failures are retried for as long as they last
unless ``give_up_after`` bounds them; a permanent one (access denied, a refused setting) ends
the iteration with ``StoreUnavailable`` or ``StoreError``. ``stop()`` from another thread
flushes this member's settlements, leaves the group and ends the iteration.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from esdbclient import RecordedEvent
from esdbclient.exceptions import (
    AlreadyExists,
    InternalError,
    MaximumSubscriptionsReached,
    NotFound,
)

from terret.adapters.stores._esdb import EsdbLog, TypeFilter, to_stored
from terret.adapters.stores._esdb_connection import (
    EsdbConnection,
    Failure,
    Refused,
    Reopening,
    Retrier,
    log,
    refusal,
)
from terret.domain.errors import CorruptRecord, StoreError
from terret.domain.groups import GroupMessage, GroupReader
from terret.domain.store import StoredRecord

CONSUMER_STRATEGY = "Pinned"


DELETIONS_REFRESH_SECONDS = 1.0
"""How often, while events arrive, the streams ``delete_stream`` removed are read again."""


@dataclass(frozen=True)
class GroupOptions:
    """The group's settings on the server (``message_timeout`` seconds before an unsettled
    event is given out again, ``max_retry_count`` deliveries before it is parked,
    ``max_subscriber_count`` 0: any number of members) and this member's
    (``event_buffer_size`` events in flight to it at most; settlements sent in batches at
    least every ``max_ack_delay`` seconds; ``stopping_grace`` for the last batch on stop)."""

    message_timeout: float = 30.0
    max_retry_count: int = 10
    max_subscriber_count: int = 0
    event_buffer_size: int = 150
    max_ack_delay: float = 0.2
    stopping_grace: float = 0.1

    def settings(self) -> dict[str, Any]:
        """What the group must have on the server (created with, updated to)."""
        return {
            "consumer_strategy": CONSUMER_STRATEGY,
            "resolve_links": False,
            "message_timeout": self.message_timeout,
            "max_retry_count": self.max_retry_count,
            "max_subscriber_count": self.max_subscriber_count,
        }

    def changes(self, info: Any) -> dict[str, Any]:
        """The settings an existing group (its ``SubscriptionInfo``) has otherwise."""
        changed: dict[str, Any] = {}
        for key, wanted in self.settings().items():
            found = getattr(info, key, None)
            if isinstance(wanted, float) and isinstance(found, int | float):
                if math.isclose(found, wanted, abs_tol=1e-3):
                    continue
            elif found == wanted:
                continue
            changed[key] = wanted
        return changed

    def read_options(self) -> dict[str, Any]:
        return {
            "event_buffer_size": self.event_buffer_size,
            "max_ack_delay": self.max_ack_delay,
            "stopping_grace": self.stopping_grace,
        }


class EsdbGroupMessage(GroupMessage):
    """One event given to this member. Settled through the read that delivered it: once that
    read is gone (a reconnect, ``stop()``), settling does nothing, and the server gives the
    event out again. Settling twice does nothing the second time."""

    def __init__(self, group: EsdbConsumerGroup, inner: Any, event: RecordedEvent,
                 record: StoredRecord) -> None:
        self.record = record
        self.retry_count = event.retry_count or 0
        """How many times the server gave this event out before."""
        self._group = group
        self._inner = inner
        self._event = event
        self._settled = False
        self._lock = threading.Lock()

    def ack(self) -> None:
        self._settle("ack", "")

    def retry(self, reason: str) -> None:
        self._settle("retry", reason)

    def _settle(self, action: str, reason: str) -> None:
        with self._lock:
            if self._settled:
                log.debug("%s of %s@%d ignored: settled already", action, self.record.stream,
                          self.record.seq)
                return
            self._settled = True
        if reason:
            # esdbclient sends no reason with a nack: it is only logged here.
            log.debug("retry of %s@%d: %s", self.record.stream, self.record.seq, reason)
        self._group.settle(self._inner, self._event, action)

    def __repr__(self) -> str:
        return f"EsdbGroupMessage({self.record.stream}@{self.record.seq}, {self.record.wire_name})"


class EsdbConsumerGroup(GroupReader):
    """This process's membership of the group ``name`` over the events of ``wire_names``
    (see the module's docstring). Iterate it on one thread; ``stop()`` from any."""

    def __init__(self, connection: EsdbConnection, log: EsdbLog, name: str,
                 wire_names: Collection[str], options: GroupOptions | None = None, *,
                 give_up_after: float | None = None) -> None:
        self.name = name
        self.options = options or GroupOptions()
        self._connection = connection
        self._log = log
        self._filter = TypeFilter(frozenset(wire_names))
        self._lock = threading.Lock()
        self._inner: Any = None  # esdbclient's PersistentSubscription while joined
        self._stopped = threading.Event()
        self._finished = False
        self._ensured = False
        self._deleted: frozenset[str] = frozenset()
        self._deleted_at = 0.0
        policy = dataclasses.replace(connection.policy, timeout=give_up_after, max_retries=None)
        self._reopening = Reopening(connection, Retrier(
            policy, f"consumer group {name!r}", connection.describe(), sleep=self._stopped.wait))

    @property
    def rejoins(self) -> int:
        """How many times this member joined again after a failure."""
        return self._reopening.count

    # --- the group on the server -------------------------------------------------------------

    def ensure(self) -> None:
        """Create the group, or bring an existing one's settings to this one's, with the
        connection's bounded retries (``StoreUnavailable``). The first join does it too."""
        try:
            self._connection.run(f"create the consumer group {self.name!r}", self._ensure_once)
        except Refused as refused:
            raise StoreError(f"the consumer group {self.name!r}: {refused}") from None
        self._ensured = True

    def _ensure_once(self, client: Any, timeout: float) -> None:
        """One attempt: create the group; if it exists, update its settings where they differ
        (and if it vanished between the two, create it again). A setting the server refuses
        is a ``StoreError``: trying again would not help."""
        try:
            for _ in range(3):
                if self._create(client, timeout) or self._update(client, timeout):
                    return
        except InternalError as exc:  # the server's PersistentSubscriptionFailed
            text = self._connection.scrub(str(exc))
            raise StoreError(f"the consumer group {self.name!r} was refused: {text}") from None
        raise StoreError(f"the consumer group {self.name!r} kept vanishing; not created")

    def _create(self, client: Any, timeout: float) -> bool:
        """Create the group from the start of the log; False if it exists (another member
        created it, or won a race with this one)."""
        try:
            client.create_subscription_to_all(
                self.name, from_end=False, timeout=timeout, **self.options.settings(),
                **self._filter.server_filter(with_deletions=False))
        except AlreadyExists:
            return False
        log.info("created the consumer group %r", self.name)
        return True

    def _update(self, client: Any, timeout: float) -> bool:
        """Bring the existing group's settings to this one's; False if it is gone. (Its filter
        stays: the server neither reports nor updates one.)"""
        try:
            info = client.get_subscription_info(self.name, timeout=timeout)
        except NotFound:
            return False  # deleted meanwhile: create it
        changes = self.options.changes(info)
        if changes:
            log.info("updating the consumer group %r: %s", self.name, changes)
            client.update_subscription_to_all(self.name, timeout=timeout, **changes)
        return True

    # --- the member's side -------------------------------------------------------------------

    @property
    def stopped(self) -> bool:
        return self._stopped.is_set()

    @property
    def joined(self) -> bool:
        """Whether this member is in the group now (the server confirmed its read)."""
        with self._lock:
            return self._inner is not None

    def stop(self) -> None:
        """Leave the group: the settlements not sent yet are sent, then the read ends (the
        server gives what this member had not settled to the others) and so does the
        iteration. Callable from any thread, more than once."""
        self._stopped.set()
        with self._lock:
            inner = self._inner
        if inner is not None:
            _stop(inner)

    def __next__(self) -> GroupMessage:
        while True:
            if self._stopped.is_set() or self._finished:
                self._drop_inner()
                raise StopIteration
            message = self._step()
            if message is not None:
                return message

    def settle(self, inner: Any, event: RecordedEvent, action: str) -> None:
        """Ack or nack ``event`` through the read that delivered it (a message's ``ack`` and
        ``retry`` come here). A read that is gone (stopped: esdbclient queues the settlement
        and never sends it) takes nothing: the server gives the event out again."""
        try:
            if action == "ack":
                inner.ack(event)
            else:
                inner.nack(event, action=action)
        except Exception as exc:  # noqa: BLE001 - the server gives an unsettled event out again
            log.debug("%s of %s failed: %s", action, event.id, self._connection.scrub(str(exc)))

    # --- one step of the iteration ---------------------------------------------------------

    def _step(self) -> GroupMessage | None:
        """Take one event from the server (joining first if needed), or handle one failure:
        back off and let the next step join again, or raise."""
        try:
            inner = self._inner if self._inner is not None else self._join()
            event = next(inner)
        except StopIteration:
            # esdbclient ends the iteration quietly when the read was cancelled: by stop(), or
            # by a reconnect of the client (another request's) that closed the channel.
            self._drop_inner()
            if self._stopped.is_set():
                return None
            found: Failure | BaseException = Failure(True, "the group's read ended")
        except Exception as exc:
            self._drop_inner()
            if self._stopped.is_set():
                return None
            found = self._classify(exc)
        else:
            return self._receive(inner, event)
        if isinstance(found, BaseException):
            self._finished = True
            raise found  # outside the handler: nothing of esdbclient's chained to it
        self._handle(found)
        return None

    def _classify(self, exc: Exception) -> Failure | BaseException:
        """What a failed join or read means: a failure to back off from, or the error that
        ends the iteration (Terret's, or ``exc`` itself when it is no store failure)."""
        if isinstance(exc, MaximumSubscriptionsReached):
            return Failure(True, "the group has as many members as it allows")
        refused = refusal(exc, self._connection.uri)
        if refused is not None:
            if refused.kind != "missing":
                return StoreError(f"the consumer group {self.name!r}: {refused}")
            self._ensured = False  # deleted: create it again
            return Failure(True, "the group does not exist")
        found = self._connection.failure(exc)
        return exc if found is None else found

    def _handle(self, found: Failure) -> None:
        self._finished = True  # if the retrier gives up, the iteration ends with its error
        self._reopening.failed(found)
        self._finished = False

    def _join(self) -> Any:
        """Create the group if this member has not yet (or it vanished), learn the deleted
        streams, and open the read. Single attempts: failures are retried by ``_step``."""
        client = self._connection.client()
        timeout = self._connection.call_timeout
        if not self._ensured:
            self._ensure_once(client, timeout)
            self._ensured = True
        self._refresh_deletions(client, timeout)
        inner = client.read_subscription_to_all(self.name, **self.options.read_options())
        with self._lock:
            self._inner = inner
        self._reopening.opened()
        if self._stopped.is_set():  # stop() ran while the read was being opened
            _stop(inner)
        return inner

    def _receive(self, inner: Any, event: RecordedEvent) -> GroupMessage | None:
        """The message for ``event``, or None when it is not one to hand over (acked here)."""
        if time.monotonic() - self._deleted_at > DELETIONS_REFRESH_SECONDS:
            self._try_refresh_deletions()
        if not self._filter.delivers(event.type) or event.stream_name in self._deleted:
            self.settle(inner, event, "ack")
            return None
        try:
            record = to_stored(event)
        except CorruptRecord as exc:
            # Parked, not skipped: the server keeps it for an operator to replay.
            log.error("consumer group %r: parking an unreadable event: %s", self.name, exc)
            self.settle(inner, event, "park")
            return None
        self._reopening.received()
        return EsdbGroupMessage(self, inner, event, record)

    # --- deleted streams ---------------------------------------------------------------------

    def _refresh_deletions(self, client: Any, timeout: float) -> None:
        self._log.refresh_deletions(client, timeout)
        self._deleted = self._log.deleted_streams(refresh=False)
        self._deleted_at = time.monotonic()

    def _try_refresh_deletions(self) -> None:
        """While events flow: one attempt; on failure the streams known already are kept."""
        try:
            self._refresh_deletions(self._connection.client(), self._connection.call_timeout)
        except Exception as exc:  # noqa: BLE001 - passing over deleted streams is a saving
            self._deleted_at = time.monotonic()
            log.debug("consumer group %r: the deletions were not read: %s", self.name,
                      self._connection.scrub(str(exc)))

    def _drop_inner(self) -> None:
        with self._lock:
            inner, self._inner = self._inner, None
        if inner is not None:
            # Its call may be over: esdbclient's stop() then waits up to 5 s for a request
            # stream nobody reads. Off this thread, so that joining again is not held up.
            threading.Thread(target=_stop, args=(inner,), name="terret-esdb-group-stop",
                             daemon=True).start()


def _stop(inner: Any) -> None:
    try:
        inner.stop()
    except Exception:  # noqa: BLE001 - the read is gone either way
        pass
