"""Persistent subscriptions, driven through esdbclient's public API as a user would.

Every test has an emulator of its own (groups are server state, and the session emulator's
`list_subscriptions()` must stay empty). Consumers run in threads (`Reader`) because
esdbclient's subscription iterator blocks.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from esdbclient import EventStoreDBClient, NewEvent, StreamState
from esdbclient.common import AbstractPersistentSubscription as PersistentSubscription
from esdbclient.events import RecordedEvent
from esdbclient.exceptions import (
    AlreadyExists,
    GrpcError,
    InternalError,
    MaximumSubscriptionsReached,
    NotFound,
    ServiceUnavailable,
)

from tests.support.esdb_emulator import EsdbEmulator

# Short client-side ack batching and stop grace keep each test well under a second.
FAST: dict[str, Any] = {"max_ack_delay": 0.02, "stopping_grace": 0.02}
QUIET_SECONDS = 0.3  # how long "nothing more arrives" is watched for

Policy = Callable[[PersistentSubscription, RecordedEvent], None]


def ack(subscription: PersistentSubscription, event: RecordedEvent) -> None:
    subscription.ack(event)


def keep(subscription: PersistentSubscription, event: RecordedEvent) -> None:
    """Neither ack nor nack: the event stays in flight."""


class Reader:
    """One consumer: iterates a persistent subscription in a thread, recording events."""

    def __init__(self, subscription: PersistentSubscription, policy: Policy = ack) -> None:
        self.subscription = subscription
        self.policy = policy
        self.events: list[RecordedEvent] = []
        self.error: BaseException | None = None
        self.expected: int | None = None
        """The count the last ``wait_for`` waited for: ``assert_quiet`` holds it to exactly that."""
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for event in self.subscription:
                self.events.append(event)
                self.policy(self.subscription, event)
        except Exception as error:  # noqa: BLE001 - recorded for the test to assert on
            self.error = error
            # esdbclient's stop() of a subscription the server ended waits up to 5 s for
            # its request stream, and client.close() stops every subscription it holds:
            # stop it now, off the test's path, so that close() finds it stopped.
            threading.Thread(target=self.subscription.stop, daemon=True).start()

    def wait_for(self, count: int, timeout: float = 5.0) -> list[RecordedEvent]:
        eventually(lambda: len(self.events) >= count, timeout, f"{count} events")
        self.expected = count
        return list(self.events)

    def wait_ended(self, timeout: float = 5.0) -> BaseException | None:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the subscription did not end"
        return self.error

    def stop(self) -> None:
        self.subscription.stop()
        self.wait_ended()


def eventually(check: Callable[[], bool], timeout: float = 5.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def new_events(count: int, event_type: str = "Tested", metadata: bytes = b"") -> list[NewEvent]:
    return [
        NewEvent(type=event_type, data=json.dumps({"n": n}).encode(), metadata=metadata)
        for n in range(count)
    ]


@pytest.fixture
def emulator(esdb_fresh_emulator: EsdbEmulator) -> EsdbEmulator:
    return esdb_fresh_emulator


@pytest.fixture
def client(emulator: EsdbEmulator) -> Iterator[EventStoreDBClient]:
    esdb_client = EventStoreDBClient(emulator.uri)
    yield esdb_client
    esdb_client.close()


@pytest.fixture
def stream() -> str:
    return f"orders-{uuid.uuid4()}"


def append(client: EventStoreDBClient, stream: str, new: list[NewEvent]) -> list[NewEvent]:
    client.append_to_stream(stream, current_version=StreamState.ANY, events=new)
    return new


def read_stream_group(
    client: EventStoreDBClient, group: str, stream: str, policy: Policy = ack, **kwargs: Any
) -> Reader:
    return Reader(client.read_subscription_to_stream(group, stream, **FAST, **kwargs), policy)


def read_all_group(
    client: EventStoreDBClient, group: str, policy: Policy = ack, **kwargs: Any
) -> Reader:
    return Reader(client.read_subscription_to_all(group, **FAST, **kwargs), policy)


def assert_quiet(*readers: Reader) -> None:
    """Nothing more arrives: each reader holds exactly what it last waited for (or, if it never
    waited, what it holds now)."""
    counts = [len(r.events) if r.expected is None else r.expected for r in readers]
    time.sleep(QUIET_SECONDS)
    assert [len(r.events) for r in readers] == counts


def assert_dropped(error: BaseException | None) -> None:
    """What esdbclient raises for the server's PersistentSubscriptionDropped (CANCELLED)."""
    assert type(error) is GrpcError, error
    assert "was dropped" in str(error)


# -- create, errors ------------------------------------------------------------------------


def test_create_twice_is_already_exists_and_unknown_groups_are_not_found(
    client: EventStoreDBClient, stream: str
) -> None:
    client.create_subscription_to_all("g")
    client.create_subscription_to_stream("g", stream)  # same name, other source: other group
    with pytest.raises(AlreadyExists):
        client.create_subscription_to_all("g")
    with pytest.raises(AlreadyExists):
        client.create_subscription_to_stream("g", stream)
    with pytest.raises(NotFound):
        client.get_subscription_info("nope")
    with pytest.raises(NotFound):
        client.update_subscription_to_stream("nope", stream, max_retry_count=1)
    with pytest.raises(NotFound):
        client.delete_subscription("nope", stream)
    with pytest.raises(NotFound):
        client.replay_parked_events("nope")
    with pytest.raises(NotFound):
        client.read_subscription_to_stream("g", "other-stream")
    with pytest.raises(InternalError, match="Invalid Start From position"):
        client.create_subscription_to_all("beyond", commit_position=10**12)
    assert len(client.list_subscriptions()) == 2


def test_all_group_filters_by_event_type_or_stream_name(
    client: EventStoreDBClient, stream: str
) -> None:
    wanted = append(client, stream, new_events(3, "Wanted"))
    append(client, stream, new_events(2, "Other"))
    other_stream = append(client, f"other-{uuid.uuid4()}", new_events(2, "Wanted"))
    client.create_subscription_to_all("by-type", filter_include=["Wanted"])
    client.create_subscription_to_all(
        "by-stream", filter_include=[stream], filter_by_stream_name=True
    )
    by_type = read_all_group(client, "by-type")
    by_stream = read_all_group(client, "by-stream")
    assert [e.id for e in by_type.wait_for(5)] == [e.id for e in wanted + other_stream]
    assert len(by_stream.wait_for(5)) == 5
    assert {e.stream_name for e in by_stream.events} == {stream}
    assert all(e.retry_count == 0 for e in by_type.events)
    assert_quiet(by_type, by_stream)


def test_start_positions_are_inclusive_and_from_end_sees_only_later_events(
    client: EventStoreDBClient, stream: str
) -> None:
    old = append(client, stream, new_events(4))
    third = client.get_stream(stream)[2]
    client.create_subscription_to_stream("from-2", stream, stream_position=2)
    client.create_subscription_to_stream("from-end", stream, from_end=True)
    client.create_subscription_to_all("all-from-p", commit_position=third.commit_position)
    client.create_subscription_to_all("all-from-end", from_end=True)
    readers = {name: read_stream_group(client, name, stream) for name in ("from-2", "from-end")} | {
        name: read_all_group(client, name) for name in ("all-from-p", "all-from-end")
    }
    new = append(client, stream, new_events(1))
    expected = [e.id for e in old[2:] + new]
    assert [e.id for e in readers["from-2"].wait_for(3)] == expected
    assert [e.id for e in readers["all-from-p"].wait_for(3)] == expected
    assert readers["from-end"].wait_for(1)[0].id == new[0].id
    assert readers["all-from-end"].wait_for(1)[0].id == new[0].id
    assert_quiet(*readers.values())


def test_new_appends_reach_live_consumers_exactly_once_in_order(
    client: EventStoreDBClient, stream: str
) -> None:
    client.create_subscription_to_stream("g", stream)
    client.create_subscription_to_all("all", filter_include=[stream], filter_by_stream_name=True)
    first = append(client, stream, new_events(5))
    readers = [read_stream_group(client, "g", stream), read_all_group(client, "all")]
    readers[0].wait_for(5)

    def writer() -> None:
        for _ in range(15):
            append(client, stream, new_events(3))

    thread = threading.Thread(target=writer)
    thread.start()
    thread.join()
    written = [e.id for e in client.get_stream(stream)]
    assert written[:5] == [e.id for e in first]
    for reader in readers:
        assert [e.id for e in reader.wait_for(50)] == written
    assert_quiet(*readers)


# -- in-flight limits, ack, nack -----------------------------------------------------------------


def test_in_flight_messages_are_bounded_by_the_read_buffer_size(
    client: EventStoreDBClient, stream: str
) -> None:
    client.create_subscription_to_stream("g", stream)
    sent = append(client, stream, new_events(6))
    reader = read_stream_group(client, "g", stream, keep, event_buffer_size=3)
    assert [e.id for e in reader.wait_for(3)] == [e.id for e in sent[:3]]
    assert_quiet(reader)
    info = client.get_subscription_info("g", stream)
    assert (info.total_in_flight_messages, info.outstanding_messages_count) == (3, 3)
    reader.subscription.ack(reader.events[0])
    assert reader.wait_for(4)[3].id == sent[3].id
    assert_quiet(reader)


def test_nack_retry_and_unknown_redeliver_with_a_higher_retry_count(
    client: EventStoreDBClient, stream: str
) -> None:
    actions = iter(["retry", "unknown"])

    def policy(subscription: PersistentSubscription, event: RecordedEvent) -> None:
        action = next(actions, None) if event.stream_position == 0 else None
        if action is None:
            subscription.ack(event)
        else:
            subscription.nack(event, action=action)  # type: ignore[arg-type]

    client.create_subscription_to_stream("g", stream)
    append(client, stream, new_events(2))
    reader = read_stream_group(client, "g", stream, policy)
    got = reader.wait_for(4)
    assert [(e.stream_position, e.retry_count) for e in got] == [(0, 0), (1, 0), (0, 1), (0, 2)]
    assert_quiet(reader)


def test_nack_skip_drops_the_event_and_nack_park_parks_it(
    client: EventStoreDBClient, stream: str
) -> None:
    def policy(subscription: PersistentSubscription, event: RecordedEvent) -> None:
        action = {0: "skip", 1: "park"}.get(event.stream_position)
        if action is None:
            subscription.ack(event)
        else:
            subscription.nack(event, action=action)  # type: ignore[arg-type]

    client.create_subscription_to_stream("g", stream)
    append(client, stream, new_events(3))
    reader = read_stream_group(client, "g", stream, policy)
    assert [e.stream_position for e in reader.wait_for(3)] == [0, 1, 2]
    assert_quiet(reader)
    eventually(lambda: client.get_subscription_info("g", stream).parked_message_count == 1)
    [parked] = client.get_stream(f"$persistentsubscription-{stream}::g-parked")
    assert (parked.type, parked.data) == ("$>", f"1@{stream}".encode())
    assert json.loads(parked.metadata)["Reason"].startswith("Client explicitly NAK'ed")


def test_nack_stop_ends_that_consumer_and_its_other_messages_go_to_the_others(
    client: EventStoreDBClient, stream: str
) -> None:
    def stop_on_first(subscription: PersistentSubscription, event: RecordedEvent) -> None:
        if event.stream_position == 0:
            subscription.nack(event, action="stop")

    client.create_subscription_to_stream("g", stream)
    first = read_stream_group(client, "g", stream, stop_on_first, event_buffer_size=2)
    second = read_stream_group(client, "g", stream)
    sent = append(client, stream, new_events(4))
    assert_dropped(first.wait_ended())
    assert [e.id for e in first.events] == [e.id for e in sent[:2]]
    # DispatchToSingle: 2 and 3 went to `second` once `first` was full; 1 follows when
    # `first` is gone; 0, nacked with stop, is dropped as the server drops it.
    got = second.wait_for(3)
    assert [(e.id, e.retry_count) for e in got] == [
        (sent[2].id, 0),
        (sent[3].id, 0),
        (sent[1].id, 1),
    ]
    assert_quiet(second)


def test_unacked_events_time_out_are_retried_then_parked_after_max_retry_count(
    client: EventStoreDBClient, stream: str
) -> None:
    client.create_subscription_to_stream("g", stream, message_timeout=0.3, max_retry_count=2)
    [sent] = append(client, stream, new_events(1))
    reader = read_stream_group(client, "g", stream, keep)
    got = reader.wait_for(3, timeout=3)
    assert [(e.id, e.retry_count) for e in got] == [(sent.id, 0), (sent.id, 1), (sent.id, 2)]
    eventually(lambda: client.get_subscription_info("g", stream).parked_message_count == 1)
    assert len(reader.events) == 3
    info = client.get_subscription_info("g", stream)
    assert (info.total_in_flight_messages, info.retry_buffer_count) == (0, 0)
    [parked] = client.get_stream(f"$persistentsubscription-{stream}::g-parked")
    assert json.loads(parked.metadata)["Reason"] == "Reached retry count of 2"


def test_a_leaving_consumer_s_in_flight_events_are_redelivered_to_the_others(
    client: EventStoreDBClient, stream: str
) -> None:
    client.create_subscription_to_stream("g", stream)
    leaving = read_stream_group(client, "g", stream, keep)
    staying = read_stream_group(client, "g", stream)
    sent = append(client, stream, new_events(3))
    leaving.wait_for(3)
    assert staying.events == []  # DispatchToSingle: all to the first while it has room
    leaving.stop()
    got = staying.wait_for(3)
    assert [(e.id, e.retry_count) for e in got] == [(e.id, 1) for e in sent]


# -- consumer strategies ---------------------------------------------------------------------


def test_round_robin_alternates_between_consumers(client: EventStoreDBClient, stream: str) -> None:
    client.create_subscription_to_stream("g", stream, consumer_strategy="RoundRobin")
    first, second = (read_stream_group(client, "g", stream) for _ in range(2))
    sent = append(client, stream, new_events(6))
    assert [e.id for e in first.wait_for(3)] == [e.id for e in sent[0::2]]
    assert [e.id for e in second.wait_for(3)] == [e.id for e in sent[1::2]]
    assert_quiet(first, second)


def test_dispatch_to_single_fills_one_consumer_before_the_next(
    client: EventStoreDBClient, stream: str
) -> None:
    client.create_subscription_to_stream("g", stream, consumer_strategy="DispatchToSingle")
    first = read_stream_group(client, "g", stream, keep, event_buffer_size=3)
    second = read_stream_group(client, "g", stream, keep, event_buffer_size=10)
    sent = append(client, stream, new_events(5))
    assert [e.id for e in first.wait_for(3)] == [e.id for e in sent[:3]]
    assert [e.id for e in second.wait_for(2)] == [e.id for e in sent[3:]]
    assert_quiet(first, second)


def _streams_seen(reader: Reader) -> set[str]:
    return {e.stream_name for e in reader.events}


def test_pinned_keeps_each_stream_on_one_consumer_and_hands_it_over_when_it_leaves(
    client: EventStoreDBClient,
) -> None:
    prefix = f"pinned-{uuid.uuid4().hex[:8]}-"
    streams = [f"{prefix}{n}" for n in range(6)]
    client.create_subscription_to_all(
        "g", filter_include=[f"{prefix}.*"], filter_by_stream_name=True, consumer_strategy="Pinned"
    )
    leaving = read_all_group(client, "g", keep)
    staying = read_all_group(client, "g")
    for _ in range(3):
        for name in streams:
            append(client, name, new_events(1))
    eventually(lambda: len(leaving.events) + len(staying.events) == 18)
    assert _streams_seen(leaving) and _streams_seen(staying)
    assert not _streams_seen(leaving) & _streams_seen(staying)
    for reader in (leaving, staying):
        for name in _streams_seen(reader):
            assert [e.stream_position for e in reader.events if e.stream_name == name] == [0, 1, 2]
    handed_over = _streams_seen(leaving)
    leaving.stop()
    # Its unacked events are retried to the consumer that stays, and its streams follow.
    eventually(lambda: len(staying.events) == 18)
    retried = staying.events[-3 * len(handed_over) :]
    assert {(e.stream_name, e.retry_count) for e in retried} == {(n, 1) for n in handed_over}
    for name in streams:
        append(client, name, new_events(1))
    eventually(lambda: len(staying.events) == 24)
    assert {e.stream_name for e in staying.events[-6:]} == set(streams)


def test_pinned_by_correlation_keeps_each_correlation_id_on_one_consumer(
    client: EventStoreDBClient,
) -> None:
    prefix = f"corr-{uuid.uuid4().hex[:8]}-"
    client.create_subscription_to_all(
        "g",
        filter_include=[f"{prefix}.*"],
        filter_by_stream_name=True,
        consumer_strategy="PinnedByCorrelation",
    )
    readers = [read_all_group(client, "g") for _ in range(2)]
    # Streams 0-3 carry c0, 4-7 c1: pinning by stream would give each consumer both.
    for n in range(8):
        metadata = json.dumps({"$correlationId": f"c{n // 4}"}).encode()
        append(client, f"{prefix}{n}", new_events(1, metadata=metadata))
    eventually(lambda: sum(len(r.events) for r in readers) == 8)

    def correlations(reader: Reader) -> set[str]:
        return {json.loads(e.metadata)["$correlationId"] for e in reader.events}

    assert [correlations(r) for r in readers] in ([{"c0"}, {"c1"}], [{"c1"}, {"c0"}])
    assert all(len({e.stream_name for e in r.events}) == 4 for r in readers)


def test_a_reader_beyond_max_subscriber_count_is_refused(
    client: EventStoreDBClient, stream: str
) -> None:
    client.create_subscription_to_stream("g", stream, max_subscriber_count=1)
    first = read_stream_group(client, "g", stream)
    with pytest.raises(MaximumSubscriptionsReached):
        client.read_subscription_to_stream("g", stream)
    first.stop()

    def can_read() -> bool:
        try:
            client.read_subscription_to_stream("g", stream, **FAST).stop()
        except MaximumSubscriptionsReached:
            return False
        return True

    eventually(can_read, what="the slot to be freed")


# -- info, list, checkpoints -------------------------------------------------------------------


def test_info_and_list_report_groups_settings_and_progress(
    client: EventStoreDBClient, stream: str
) -> None:
    append(client, stream, new_events(3))
    client.create_subscription_to_all("all", filter_include=["Tested"], from_end=True)
    client.create_subscription_to_stream(
        "g",
        stream,
        consumer_strategy="RoundRobin",
        message_timeout=12.5,
        max_retry_count=4,
        checkpoint_after=3.0,
        min_checkpoint_count=2,
        max_checkpoint_count=20,
        max_subscriber_count=3,
        live_buffer_size=40,
        read_batch_size=30,
        history_buffer_size=60,
        extra_statistics=True,
    )
    reader = read_stream_group(client, "g", stream, keep)
    reader.wait_for(3)
    info = client.get_subscription_info("g", stream)
    assert (info.event_source, info.group_name, info.status) == (stream, "g", "Live")
    assert (info.consumer_strategy, info.start_from, info.max_subscriber_count) == (
        "RoundRobin",
        "0",
        3,
    )
    assert (info.message_timeout, info.max_retry_count, info.checkpoint_after) == (12.5, 4, 3.0)
    assert (info.min_checkpoint_count, info.max_checkpoint_count) == (2, 20)
    assert (info.live_buffer_size, info.read_batch_size, info.history_buffer_size) == (40, 30, 60)
    assert (info.extra_statistics, info.resolve_links) == (True, False)
    assert (info.total_items, info.total_in_flight_messages, info.outstanding_messages_count) == (
        3,
        3,
        3,
    )
    assert (info.last_known_event_position, info.last_checkpointed_event_position) == ("2", "")
    assert info.parked_message_count == 0
    all_info = client.get_subscription_info("all")
    assert (all_info.event_source, all_info.start_from, all_info.consumer_strategy) == (
        "$all",
        "C:-1/P:-1",
        "DispatchToSingle",
    )
    assert [(i.event_source, i.group_name) for i in client.list_subscriptions()] == [
        ("$all", "all"),
        (stream, "g"),
    ]
    assert [i.group_name for i in client.list_subscriptions_to_stream(stream)] == ["g"]
    assert client.list_subscriptions_to_stream("no-such-stream") == []


def test_acks_are_checkpointed_after_max_checkpoint_count_never_past_an_unacked_event(
    client: EventStoreDBClient, stream: str
) -> None:
    unacked = {1}

    def policy(subscription: PersistentSubscription, event: RecordedEvent) -> None:
        if event.stream_position not in unacked:
            subscription.ack(event)

    client.create_subscription_to_stream(
        "g", stream, min_checkpoint_count=3, max_checkpoint_count=3, checkpoint_after=60
    )
    reader = read_stream_group(client, "g", stream, policy)
    append(client, stream, new_events(5))
    reader.wait_for(5)

    def checkpoint() -> str:
        return client.get_subscription_info("g", stream).last_checkpointed_event_position

    time.sleep(QUIET_SECONDS)
    assert checkpoint() == ""  # only event 0 is done below the unacked event 1
    reader.subscription.ack(reader.events[1])
    eventually(lambda: checkpoint() == "4")
    written = client.get_stream(f"$persistentsubscription-{stream}::g-checkpoint")
    assert [(e.type, json.loads(e.data)) for e in written] == [("$SubscriptionCheckpoint", "4")]


def test_acks_are_checkpointed_on_the_clock_after_checkpoint_after(
    client: EventStoreDBClient,
) -> None:
    client.create_subscription_to_all(
        "g", filter_include=["Clocked"], min_checkpoint_count=1, checkpoint_after=0.2
    )
    reader = read_all_group(client, "g")
    stream = f"clocked-{uuid.uuid4()}"
    append(client, stream, new_events(2, "Clocked"))
    reader.wait_for(2)
    last = client.get_stream(stream)[-1]
    expected = f"C:{last.commit_position}/P:{last.commit_position}"
    eventually(
        lambda: client.get_subscription_info("g").last_checkpointed_event_position == expected
    )


# -- update, delete, replay parked -------------------------------------------------------------


def test_update_changes_settings_drops_readers_and_resumes_from_the_checkpoint(
    client: EventStoreDBClient, stream: str
) -> None:
    def ack_first_two(subscription: PersistentSubscription, event: RecordedEvent) -> None:
        if event.stream_position < 2:
            subscription.ack(event)

    client.create_subscription_to_stream("g", stream, max_checkpoint_count=1)
    sent = append(client, stream, new_events(4))
    before = read_stream_group(client, "g", stream, ack_first_two)
    before.wait_for(4)
    info = client.get_subscription_info

    eventually(lambda: info("g", stream).last_checkpointed_event_position == "1")
    client.update_subscription_to_stream("g", stream, message_timeout=5.0, max_retry_count=7)
    assert_dropped(before.wait_ended())
    updated = info("g", stream)
    assert (updated.message_timeout, updated.max_retry_count) == (5.0, 7)
    assert updated.max_checkpoint_count == 1  # settings not named in the update are kept
    after = read_stream_group(client, "g", stream)
    assert [(e.id, e.retry_count) for e in after.wait_for(2)] == [(e.id, 0) for e in sent[2:]]
    assert_quiet(after)


def test_updating_an_all_group_keeps_its_filter_and_applies_a_new_start(
    client: EventStoreDBClient, stream: str
) -> None:
    client.create_subscription_to_all("g", filter_include=["Kept"])
    append(client, stream, new_events(2, "Kept"))  # no reader, no checkpoint yet
    client.update_subscription_to_all("g", from_end=True, max_retry_count=3)
    info = client.get_subscription_info("g")
    assert (info.start_from, info.max_retry_count) == ("C:-1/P:-1", 3)
    reader = read_all_group(client, "g")
    append(client, stream, new_events(1, "Other"))
    [later] = append(client, stream, new_events(1, "Kept"))
    assert [e.id for e in reader.wait_for(1)] == [later.id]
    assert_quiet(reader)


def test_delete_drops_readers_and_a_group_created_again_starts_afresh(
    client: EventStoreDBClient, stream: str
) -> None:
    client.create_subscription_to_stream("g", stream, max_checkpoint_count=1)
    append(client, stream, new_events(2))
    reader = read_stream_group(client, "g", stream)
    reader.wait_for(2)
    client.delete_subscription("g", stream)
    assert_dropped(reader.wait_ended())
    with pytest.raises(NotFound):
        client.get_subscription_info("g", stream)
    with pytest.raises(NotFound):
        client.read_subscription_to_stream("g", stream)
    assert client.list_subscriptions() == []
    client.create_subscription_to_stream("g", stream)
    assert len(read_stream_group(client, "g", stream).wait_for(2)) == 2


def test_replay_parked_redelivers_parked_events_as_resolved_links(
    client: EventStoreDBClient, stream: str
) -> None:
    def park_once(subscription: PersistentSubscription, event: RecordedEvent) -> None:
        if event.link is not None:
            subscription.ack(event)
        elif event.stream_position in (0, 2):
            subscription.nack(event, action="park")
        else:
            subscription.ack(event)

    client.create_subscription_to_stream("g", stream)
    sent = append(client, stream, new_events(3))
    reader = read_stream_group(client, "g", stream, park_once)
    reader.wait_for(3)
    info = client.get_subscription_info
    eventually(lambda: info("g", stream).parked_message_count == 2)
    assert_quiet(reader)
    links = client.get_stream(f"$persistentsubscription-{stream}::g-parked")
    client.replay_parked_events("g", stream)
    # The reader records an event before its policy runs: read what it received, not the
    # policy's list, which may lag by the last event.
    replayed = reader.wait_for(5)[3:]
    assert [e.id for e in replayed] == [sent[0].id, sent[2].id]
    assert all(e.link is not None for e in replayed)
    assert [e.link.id for e in replayed if e.link] == [link.id for link in links]
    assert all(e.link is not None and e.ack_id == e.link.id and e.retry_count == 0
               for e in replayed)
    assert info("g", stream).parked_message_count == 0
    eventually(lambda: info("g", stream).outstanding_messages_count == 0, what="acks of replays")
    assert_quiet(reader)


def test_resolved_links_are_delivered_as_their_targets_and_acked_by_link_id(
    client: EventStoreDBClient, stream: str
) -> None:
    [target] = append(client, stream, new_events(1))
    links = f"links-{uuid.uuid4()}"
    link = NewEvent(type="$>", data=f"0@{stream}".encode(), content_type="application/octet-stream")
    append(client, links, [link])
    client.create_subscription_to_stream("g", links, resolve_links=True)
    reader = read_stream_group(client, "g", links)
    [event] = reader.wait_for(1)
    assert (event.id, event.link and event.link.id, event.ack_id) == (target.id, link.id, link.id)
    eventually(lambda: client.get_subscription_info("g", links).outstanding_messages_count == 0)


def test_cut_subscriptions_cuts_persistent_reads_and_their_events_go_out_again(
    client: EventStoreDBClient, emulator: EsdbEmulator, stream: str
) -> None:
    client.create_subscription_to_stream("g", stream)
    [sent] = append(client, stream, new_events(1))
    reader = read_stream_group(client, "g", stream, keep)
    reader.wait_for(1)
    assert emulator.cut_subscriptions() == 1
    assert isinstance(reader.wait_ended(), ServiceUnavailable)
    [again] = read_stream_group(client, "g", stream).wait_for(1)
    assert (again.id, again.retry_count) == (sent.id, 1)
