"""The EventStoreDB consumer group (``terret.adapters.stores._esdb_group``): a persistent
subscription to ``$all``, Pinned, filtered on wire names, joined through the store's connection.

Every test has an emulator of its own (groups are server state) and every member a store of its
own (as the workers of a pool are processes of their own). Members iterate in threads
(``Member``): the group's iterator blocks.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
from esdbclient import EventStoreDBClient

from terret.adapters.stores._esdb_group import EsdbConsumerGroup, EsdbGroupMessage, GroupOptions
from terret.adapters.stores.eventstoredb import EventStoreDBStore
from terret.domain.errors import StoreUnavailable
from terret.domain.store import StoredRecord, StreamState
from terret.testing.store_contract import new_stream, record
from tests.support.esdb_emulator import EsdbEmulator

FAST = GroupOptions(max_ack_delay=0.02, stopping_grace=0.02)
"""Settlements sent within 20 ms, and a short grace on stop, so that tests stay short."""
QUIET_SECONDS = 0.3

Policy = Callable[[EsdbGroupMessage], None]


def ack(message: EsdbGroupMessage) -> None:
    message.ack()


def keep(message: EsdbGroupMessage) -> None:
    """Settle nothing: the event stays with this member."""


def eventually(check: Callable[[], bool], timeout: float = 5.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


class Member:
    """One member of a group, iterating in a thread and recording what it was given."""

    def __init__(self, group: EsdbConsumerGroup, policy: Policy = ack) -> None:
        self.group = group
        self.policy = policy
        self.messages: list[EsdbGroupMessage] = []
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for message in self.group:
                assert isinstance(message, EsdbGroupMessage)
                self.messages.append(message)
                self.policy(message)
        except Exception as error:  # noqa: BLE001 - recorded for the test to assert on
            self.error = error

    @property
    def records(self) -> list[StoredRecord]:
        return [m.record for m in self.messages]

    def streams(self) -> set[str]:
        return {r.stream for r in self.records}

    def wait_joined(self) -> Member:
        eventually(lambda: self.group.joined or self.error is not None, what="the join")
        assert self.error is None, self.error
        return self

    def wait_for(self, count: int, timeout: float = 5.0) -> list[StoredRecord]:
        eventually(lambda: len(self.messages) >= count or self.error is not None, timeout,
                   f"{count} events")
        assert self.error is None, self.error
        return self.records

    def wait_ended(self, timeout: float = 5.0) -> BaseException | None:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the iteration did not end"
        return self.error

    def stop(self) -> None:
        self.group.stop()
        self.wait_ended()


@pytest.fixture
def emulator(esdb_fresh_emulator: EsdbEmulator) -> EsdbEmulator:
    return esdb_fresh_emulator


@pytest.fixture
def client(emulator: EsdbEmulator) -> Iterator[EventStoreDBClient]:
    raw = EventStoreDBClient(emulator.uri)
    yield raw
    raw.close()


@pytest.fixture
def stores(emulator: EsdbEmulator) -> Iterator[Callable[[], EventStoreDBStore]]:
    opened: list[EventStoreDBStore] = []

    def open_store() -> EventStoreDBStore:
        store = EventStoreDBStore(emulator.uri, retry_timeout=3.0, call_timeout=1.0,
                                  backoff_max=0.2)
        opened.append(store)
        return store

    yield open_store
    for store in opened:
        store.close()


@pytest.fixture
def store(stores: Callable[[], EventStoreDBStore]) -> EventStoreDBStore:
    return stores()


@pytest.fixture
def wake() -> str:
    """The wire name the groups of a test read (unique, so no other test's events match)."""
    return f"test-{uuid.uuid4().hex[:8]}/wake"


def group_of(store: EventStoreDBStore, wire_names: list[str], name: str = "pool",
             give_up_after: float | None = None) -> EsdbConsumerGroup:
    """A member's group, built as the store builds it, with ``FAST`` settlements."""
    return EsdbConsumerGroup(store.connection, store.log, name, wire_names, FAST,
                             give_up_after=give_up_after)


def append_round(store: EventStoreDBStore, streams: list[str], wire_name: str, n: int
                 ) -> list[uuid.UUID]:
    """One event of ``wire_name`` in each stream; their ids."""
    ids = []
    for stream in streams:
        new = record(wire_name, n)
        store.append(stream, [new], StreamState.ANY)
        ids.append(new.event_id)
    return ids


def assert_quiet(*members: Member) -> None:
    counts = [len(m.messages) for m in members]
    time.sleep(QUIET_SECONDS)
    assert [len(m.messages) for m in members] == counts


# --- sharing ---------------------------------------------------------------------------------


def test_two_members_share_the_streams_each_event_to_one_and_a_stream_to_the_same(
    stores: Callable[[], EventStoreDBStore], wake: str
) -> None:
    writer = stores()
    first = Member(group_of(stores(), [wake])).wait_joined()
    second = Member(group_of(stores(), [wake])).wait_joined()
    streams = [new_stream() for _ in range(30)]
    try:
        sent = append_round(writer, streams, wake, 0)
        eventually(lambda: len(first.messages) + len(second.messages) == 30)
        owner = {r.stream: first for r in first.records} | {r.stream: second for r in
                                                            second.records}
        assert first.streams() and second.streams()
        assert not first.streams() & second.streams()
        # In the other order: a strategy that takes turns would now swap the streams.
        sent += append_round(writer, streams[::-1], wake, 1)
        eventually(lambda: len(first.messages) + len(second.messages) == 60)
        assert_quiet(first, second)
        got = [r.event_id for r in first.records + second.records]
        assert sorted(got) == sorted(sent)  # every event once, to one member
        for member in (first, second):
            assert all(owner[r.stream] is member for r in member.records)
            assert all(m.retry_count == 0 for m in member.messages)
    finally:
        first.stop()
        second.stop()


def test_a_member_that_stops_hands_its_streams_to_the_one_that_stays(
    stores: Callable[[], EventStoreDBStore], wake: str
) -> None:
    writer = stores()
    leaving = Member(group_of(stores(), [wake])).wait_joined()
    staying = Member(group_of(stores(), [wake])).wait_joined()
    streams = [new_stream() for _ in range(30)]
    try:
        append_round(writer, streams, wake, 0)
        eventually(lambda: len(leaving.messages) + len(staying.messages) == 30)
        handed_over, before = leaving.streams(), len(staying.messages)
        assert handed_over
        leaving.stop()
        later = append_round(writer, streams, wake, 1)
        staying.wait_for(before + 30)
        assert [r.event_id for r in staying.records[before:]] == later  # all, in log order
        assert_quiet(leaving, staying)
        assert len(leaving.messages) == 30 - before  # nothing more after it left
    finally:
        leaving.stop()
        staying.stop()


# --- settling --------------------------------------------------------------------------------


def test_retry_gives_the_event_again_and_settling_twice_does_nothing(
    store: EventStoreDBStore, client: EventStoreDBClient, wake: str
) -> None:
    def retry_first(message: EsdbGroupMessage) -> None:
        if message.retry_count == 0:
            message.retry("not now")
            message.retry("twice")  # ignored: settled already
            message.ack()  # ignored too: it must not settle the redelivery
        # the redelivery is kept, unsettled

    def outstanding() -> int:
        return client.get_subscription_info("pool").outstanding_messages_count

    stream = new_stream()
    [sent] = append_round(store, [stream], wake, 0)
    member = Member(group_of(store, [wake]), retry_first)
    try:
        member.wait_for(2)
        assert [(m.record.event_id, m.retry_count) for m in member.messages] == [
            (sent, 0), (sent, 1)]
        assert_quiet(member)
        assert outstanding() == 1
        member.messages[1].ack()
        member.messages[1].ack()
        eventually(lambda: outstanding() == 0, what="the ack")
        assert_quiet(member)
        assert member.error is None
    finally:
        member.stop()


def test_an_unsettled_event_goes_to_another_member_once_its_member_stops(
    stores: Callable[[], EventStoreDBStore], wake: str
) -> None:
    writer = stores()
    holding = Member(group_of(stores(), [wake]), keep).wait_joined()
    stream = new_stream()
    [sent] = append_round(writer, [stream], wake, 0)
    holding.wait_for(1)
    other = Member(group_of(stores(), [wake])).wait_joined()
    try:
        assert_quiet(other)
        assert other.messages == []  # the stream stays with the member holding its event
        holding.stop()
        [again] = other.wait_for(1)
        assert again.event_id == sent
        assert other.messages[0].retry_count == 1
    finally:
        other.stop()


# --- the group on the server -----------------------------------------------------------------


def test_an_event_appended_before_any_member_joined_is_delivered_when_one_joins(
    store: EventStoreDBStore, client: EventStoreDBClient, wake: str
) -> None:
    stream = new_stream()
    early = append_round(store, [stream], wake, 0)
    assert client.list_subscriptions() == []  # no group yet: nobody read these
    member = Member(group_of(store, [wake]))
    try:
        assert [r.event_id for r in member.wait_for(1)] == early
        later = append_round(store, [stream], wake, 1)
        assert [r.event_id for r in member.wait_for(2)] == early + later
        info = client.get_subscription_info("pool")
        assert (info.event_source, info.consumer_strategy, info.start_from) == (
            "$all", "Pinned", "C:0/P:0")
        assert (info.resolve_links, info.max_subscriber_count) == (False, 0)
        assert (info.message_timeout, info.max_retry_count) == (30.0, 10)
    finally:
        member.stop()


def test_creating_the_group_again_or_twice_at_once_is_harmless(
    stores: Callable[[], EventStoreDBStore], client: EventStoreDBClient, wake: str
) -> None:
    writer = stores()
    groups = [group_of(stores(), [wake]) for _ in range(6)]
    racers = [threading.Thread(target=g.ensure) for g in groups[:3]]
    for racer in racers:
        racer.start()
    for racer in racers:
        racer.join()
    groups[3].ensure()
    groups[3].ensure()
    assert [(i.group_name, i.consumer_strategy) for i in client.list_subscriptions()] == [
        ("pool", "Pinned")]
    # Six members (esdbclient's default limit is five), the last two creating it once more.
    members = [Member(g).wait_joined() for g in groups]
    try:
        sent = append_round(writer, [new_stream() for _ in range(20)], wake, 0)
        eventually(lambda: sum(len(m.messages) for m in members) == 20)
        assert_quiet(*members)
        assert sorted(r.event_id for m in members for r in m.records) == sorted(sent)
        assert all(m.messages for m in members)  # a share for each
    finally:
        for member in members:
            member.stop()


def test_an_existing_group_with_other_settings_is_updated_to_the_group_s(
    store: EventStoreDBStore, client: EventStoreDBClient, wake: str
) -> None:
    client.create_subscription_to_all("pool", filter_include=[wake], message_timeout=5.0)
    before = client.get_subscription_info("pool")
    assert (before.consumer_strategy, before.max_subscriber_count) == ("DispatchToSingle", 5)
    group_of(store, [wake]).ensure()
    after = client.get_subscription_info("pool")
    assert (after.consumer_strategy, after.max_subscriber_count) == ("Pinned", 0)
    assert (after.message_timeout, after.max_retry_count, after.resolve_links) == (
        30.0, 10, False)


def test_events_of_other_wire_names_are_never_delivered(
    store: EventStoreDBStore, client: EventStoreDBClient, wake: str
) -> None:
    # A group another version created without a filter: what the server sends beyond the
    # wire names asked for is acked and passed over.
    client.create_subscription_to_all("wide", consumer_strategy="Pinned", max_subscriber_count=0)
    stream = new_stream()
    other = wake.replace("/wake", "/other")
    store.append(stream, [record(other, 0), record(wake.upper(), 1), record(wake + "x", 2)],
                 StreamState.NO_STREAM)
    store.write_snapshot(stream, 3, b"state")
    [wanted] = append_round(store, [stream], wake, 3)
    members = [Member(group_of(store, [wake], name)) for name in ("pool", "wide")]
    try:
        for member in members:
            assert [r.event_id for r in member.wait_for(1)] == [wanted]
        append_round(store, [stream], other, 4)
        assert_quiet(*members)
        # The group's own filter: the server sent only the event asked for.
        assert client.get_subscription_info("pool").total_items == 1
        eventually(lambda: client.get_subscription_info("wide").outstanding_messages_count == 0,
                   what="the passed-over events to be acked")
    finally:
        for member in members:
            member.stop()


def test_events_of_deleted_streams_are_passed_over(store: EventStoreDBStore, wake: str) -> None:
    gone, kept = new_stream(), new_stream()
    append_round(store, [gone], wake, 0)
    [wanted] = append_round(store, [kept], wake, 0)
    store.delete_stream(gone)
    member = Member(group_of(store, [wake]))
    try:
        assert [r.event_id for r in member.wait_for(1)] == [wanted]
        assert_quiet(member)
    finally:
        member.stop()


# --- stopping and failures -------------------------------------------------------------------


def test_stop_ends_a_blocked_iteration_within_a_second_and_leaves_the_group(
    stores: Callable[[], EventStoreDBStore], wake: str
) -> None:
    # The settings the store uses (not FAST): stop() sends what is left and waits its grace.
    store = stores()
    leaving = Member(EsdbConsumerGroup(store.connection, store.log, "pool", [wake])).wait_joined()
    time.sleep(0.2)  # blocked in the read now
    began = time.monotonic()
    leaving.group.stop()
    assert leaving.wait_ended(timeout=1.0) is None
    assert time.monotonic() - began < 1.0
    assert not leaving.group.joined
    assert next(leaving.group, None) is None  # stays ended
    # Left: the one that joins now is given every stream.
    writer = stores()
    staying = Member(group_of(stores(), [wake])).wait_joined()
    try:
        sent = append_round(writer, [new_stream() for _ in range(10)], wake, 0)
        assert [r.event_id for r in staying.wait_for(10)] == sent
        assert leaving.messages == []
    finally:
        staying.stop()


def test_a_cut_read_is_joined_again_and_the_unsettled_event_comes_again(
    store: EventStoreDBStore, emulator: EsdbEmulator, wake: str
) -> None:
    def keep_first(message: EsdbGroupMessage) -> None:
        if message.retry_count:
            message.ack()

    stream = new_stream()
    [sent] = append_round(store, [stream], wake, 0)
    member = Member(group_of(store, [wake]), keep_first)
    try:
        member.wait_for(1)
        assert emulator.cut_subscriptions() >= 1
        again = member.wait_for(2)[1]
        assert again.event_id == sent
        assert member.group.rejoins >= 1
        member.messages[0].ack()  # through the read that is gone: nothing, no error
        later = append_round(store, [stream], wake, 1)
        assert [r.event_id for r in member.wait_for(3)[2:]] == later
    finally:
        member.stop()


def test_a_restarted_server_is_joined_again_and_the_unsettled_event_comes_again(
    store: EventStoreDBStore, emulator: EsdbEmulator, client: EventStoreDBClient, wake: str
) -> None:
    def keep_second(message: EsdbGroupMessage) -> None:
        if message.record.seq != 2 or message.retry_count:
            message.ack()

    stream = new_stream()
    first = append_round(store, [stream], wake, 0)
    member = Member(group_of(store, [wake]), keep_second)
    try:
        assert [r.event_id for r in member.wait_for(1)] == first
        unsettled = append_round(store, [stream], wake, 1)
        member.wait_for(2)
        eventually(lambda: client.get_subscription_info("pool").outstanding_messages_count == 1,
                   what="the first event's ack")
        port = emulator.port
        emulator.stop()
        time.sleep(0.5)  # the member backs off meanwhile
        emulator.start(port=port)
        later = append_round(store, [stream], wake, 2)
        again = member.wait_for(4, timeout=10)[2:]
        assert [r.event_id for r in again] == unsettled + later
        assert member.group.rejoins >= 1
        assert_quiet(member)
    finally:
        member.stop()


def test_a_deleted_group_is_created_again(
    store: EventStoreDBStore, client: EventStoreDBClient, wake: str
) -> None:
    stream = new_stream()
    member = Member(group_of(store, [wake])).wait_joined()
    try:
        first = append_round(store, [stream], wake, 0)
        member.wait_for(1)
        client.delete_subscription("pool")
        eventually(lambda: member.group.rejoins >= 1, what="the member to join again")
        eventually(lambda: len(client.list_subscriptions()) == 1, what="the group again")
        later = append_round(store, [stream], wake, 1)
        # Created again from the start of the log: the first event comes again too.
        assert [r.event_id for r in member.wait_for(3)[1:]] == first + later
    finally:
        member.stop()


def test_a_server_that_stays_away_ends_the_iteration_with_store_unavailable_if_bounded(
    store: EventStoreDBStore, emulator: EsdbEmulator, wake: str
) -> None:
    member = Member(group_of(store, [wake], give_up_after=0.5)).wait_joined()
    emulator.stop()
    assert isinstance(member.wait_ended(timeout=5.0), StoreUnavailable)
    assert "consumer group 'pool'" in str(member.error)
