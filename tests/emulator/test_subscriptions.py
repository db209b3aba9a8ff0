"""Catch-up subscriptions (wire notes §2.8-2.9, §3.4), via esdbclient."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from esdbclient import EventStoreDBClient, StreamState
from esdbclient.events import Checkpoint
from esdbclient.exceptions import GrpcDeadlineExceeded, StreamIsDeleted

from tests.support.esdb_emulator import EsdbEmulator

from .helpers import in_background, is_caught_up, is_checkpoint, new_event, take_until


def test_subscribe_to_all_confirms_then_catches_up_then_goes_live(
    client: EventStoreDBClient, stream_name: str, unique_type: Callable[[str], str]
) -> None:
    old, live = unique_type("Old"), unique_type("Live")
    client.append_to_stream(stream_name, current_version=StreamState.ANY, events=new_event(old))
    subscription = client.subscribe_to_all(filter_include=[old, live], include_caught_up=True)
    assert subscription.subscription_id
    items = take_until(subscription, is_caught_up)
    assert [i.type for i in items[:-1]] == [old]
    client.append_to_stream(stream_name, current_version=StreamState.ANY, events=new_event(live))
    assert next(subscription).type == live
    subscription.stop()


def test_default_filter_hides_system_events_and_no_filter_shows_them_first(
    client: EventStoreDBClient, stream_name: str
) -> None:
    client.append_to_stream(stream_name, current_version=StreamState.ANY, events=new_event())
    client.set_stream_metadata(stream_name, metadata={"x": 1})
    with client.subscribe_to_all(include_caught_up=True) as subscription:
        items = take_until(subscription, is_caught_up)
    assert all(not i.type.startswith("$") for i in items[:-1])
    with client.subscribe_to_all(filter_exclude=[]) as subscription:
        first = next(subscription)
    assert first.type.startswith("$")


def test_start_position_is_exclusive(
    client: EventStoreDBClient, stream_name: str, unique_type: Callable[[str], str]
) -> None:
    kind = unique_type("E")
    events = [new_event(kind) for _ in range(3)]
    client.append_to_stream(stream_name, current_version=StreamState.NO_STREAM, events=events)
    p0 = client.get_stream(stream_name)[0].commit_position
    with client.subscribe_to_all(
        commit_position=p0, filter_include=[kind], include_caught_up=True
    ) as subscription:
        items = take_until(subscription, is_caught_up)
    assert [i.id for i in items[:-1]] == [events[1].id, events[2].id]
    with client.subscribe_to_stream(stream_name, stream_position=0) as subscription:
        assert next(subscription).id == events[1].id


def test_from_end_sees_only_later_events(
    client: EventStoreDBClient, stream_name: str, unique_type: Callable[[str], str]
) -> None:
    kind = unique_type("E")
    client.append_to_stream(stream_name, current_version=StreamState.ANY, events=new_event(kind))
    with client.subscribe_to_all(
        from_end=True, filter_include=[kind], include_caught_up=True
    ) as subscription:
        assert is_caught_up(next(subscription))
        later = new_event(kind)
        client.append_to_stream(stream_name, current_version=StreamState.ANY, events=later)
        assert next(subscription).id == later.id


def test_no_gap_or_duplicate_across_the_switch_to_live(
    client: EventStoreDBClient, stream_name: str, unique_type: Callable[[str], str]
) -> None:
    kind = unique_type("E")
    total = 300
    events = [new_event(kind) for _ in range(total)]
    client.append_to_stream(stream_name, current_version=StreamState.ANY, events=events[:100])

    def write_rest() -> None:
        for event in events[100:]:
            client.append_to_stream(stream_name, current_version=StreamState.ANY, events=event)

    with client.subscribe_to_all(filter_include=[kind], include_caught_up=True) as subscription:
        writer = in_background(write_rest)
        received = []
        for item in subscription:
            if not is_caught_up(item):
                received.append(item.id)
            if len(received) == total:
                break
        writer.join()
    assert received == [e.id for e in events]


def test_checkpoints_during_catch_up_never_pass_the_last_event(
    client: EventStoreDBClient, stream_name: str
) -> None:
    client.append_to_stream(
        stream_name, current_version=StreamState.ANY, events=[new_event(), new_event()]
    )
    last_position = client.get_commit_position(filter_exclude=[])
    with client.subscribe_to_all(
        filter_exclude=[".*"],
        window_size=1,
        checkpoint_interval_multiplier=1,
        include_checkpoints=True,
        include_caught_up=True,
    ) as subscription:
        items = take_until(subscription, is_caught_up)
    checkpoints = [i for i in items if is_checkpoint(i)]
    assert checkpoints, "a filtered catch-up over >= 2 events must checkpoint"
    assert all(c.commit_position <= last_position for c in checkpoints)
    assert checkpoints[-1].commit_position < last_position  # none after the last page
    positions = [c.commit_position for c in checkpoints]
    assert positions == sorted(set(positions))


def test_live_checkpoints_follow_every_interval_of_events(
    client: EventStoreDBClient, stream_name: str, unique_type: Callable[[str], str]
) -> None:
    wanted, other = unique_type("Wanted"), unique_type("Other")
    with client.subscribe_to_all(
        from_end=True,
        filter_include=[wanted],
        window_size=2,
        checkpoint_interval_multiplier=2,
        include_checkpoints=True,
        include_caught_up=True,
    ) as subscription:
        assert is_caught_up(next(subscription))
        types = [other, other, other, wanted, other, other, other, other]
        for event_type in types:
            client.append_to_stream(
                stream_name, current_version=StreamState.ANY, events=new_event(event_type)
            )
        positions = [e.commit_position for e in client.get_stream(stream_name)]
        items = [next(subscription) for _ in range(3)]
    # Interval 4: a checkpoint at the 4th event (which matched, so it comes after it) and
    # at the 8th; every considered event counts, matching or not.
    assert items[0].type == wanted
    assert isinstance(items[1], Checkpoint) and items[1].commit_position == positions[3]
    assert isinstance(items[2], Checkpoint) and items[2].commit_position == positions[7]


def test_resuming_from_a_checkpoint_skips_only_considered_events(
    client: EventStoreDBClient, stream_name: str, unique_type: Callable[[str], str]
) -> None:
    kind = unique_type("E")
    with client.subscribe_to_all(
        from_end=True,
        filter_include=[kind],
        window_size=1,
        checkpoint_interval_multiplier=1,
        include_checkpoints=True,
        include_caught_up=True,
    ) as subscription:
        assert is_caught_up(next(subscription))
        first = new_event(kind)
        client.append_to_stream(stream_name, current_version=StreamState.ANY, events=first)
        assert next(subscription).id == first.id
        checkpoint = next(subscription)
        assert isinstance(checkpoint, Checkpoint)
    second = new_event(kind)
    client.append_to_stream(stream_name, current_version=StreamState.ANY, events=second)
    with client.subscribe_to_all(
        commit_position=checkpoint.commit_position, filter_include=[kind]
    ) as subscription:
        assert next(subscription).id == second.id


def test_filter_by_stream_name(client: EventStoreDBClient, stream_name: str) -> None:
    client.append_to_stream(f"{stream_name}-a", current_version=StreamState.ANY, events=new_event())
    client.append_to_stream(
        f"other-{stream_name}", current_version=StreamState.ANY, events=new_event()
    )
    with client.subscribe_to_all(
        filter_include=[f"{stream_name}.*"], filter_by_stream_name=True, include_caught_up=True
    ) as subscription:
        items = take_until(subscription, is_caught_up)
    assert [i.stream_name for i in items[:-1]] == [f"{stream_name}-a"]


def test_stream_subscription_catch_up_live_and_missing_stream(
    client: EventStoreDBClient, stream_name: str
) -> None:
    with client.subscribe_to_stream(stream_name, include_caught_up=True) as subscription:
        assert is_caught_up(next(subscription))  # a missing stream is treated as empty
        event = new_event()
        client.append_to_stream(stream_name, current_version=StreamState.ANY, events=event)
        assert next(subscription).id == event.id
    with client.subscribe_to_stream(stream_name, from_end=True, include_caught_up=True) as sub:
        assert is_caught_up(next(sub))
        later = new_event()
        client.append_to_stream(stream_name, current_version=StreamState.ANY, events=later)
        received = next(sub)
        assert (received.id, received.stream_position) == (later.id, 1)


def test_tombstone_ends_a_stream_subscription(client: EventStoreDBClient, stream_name: str) -> None:
    client.append_to_stream(stream_name, current_version=StreamState.ANY, events=new_event())
    subscription = client.subscribe_to_stream(stream_name, include_caught_up=True)
    take_until(subscription, is_caught_up)
    client.tombstone_stream(stream_name, current_version=StreamState.ANY)
    with pytest.raises(StreamIsDeleted):
        next(subscription)
    with pytest.raises(StreamIsDeleted):
        list(client.subscribe_to_stream(stream_name))


def test_subscription_deadline_ends_iteration(client: EventStoreDBClient) -> None:
    started = time.monotonic()
    with pytest.raises(GrpcDeadlineExceeded):
        subscription = client.subscribe_to_all(from_end=True, timeout=0.5)
        next(subscription)
    assert time.monotonic() - started < 5


def test_stopped_subscriptions_release_their_workers(
    esdb_fresh_emulator: EsdbEmulator,
) -> None:
    client = EventStoreDBClient(esdb_fresh_emulator.uri)
    try:
        subscriptions = [client.subscribe_to_all(from_end=True) for _ in range(10)]
        assert esdb_fresh_emulator.open_reads == 10
        for subscription in subscriptions:
            subscription.stop()
        deadline = time.monotonic() + 5
        while esdb_fresh_emulator.open_reads and time.monotonic() < deadline:
            time.sleep(0.05)
        assert esdb_fresh_emulator.open_reads == 0
    finally:
        client.close()


def test_bulk_catch_up_is_fast(esdb_fresh_emulator: EsdbEmulator) -> None:
    kind, count = "BulkSeeded", 10_000
    esdb_fresh_emulator.append_raw("bulk", (new_event(kind) for _ in range(count)))
    assert esdb_fresh_emulator.event_count == count + 1  # plus the seeded system event
    client = EventStoreDBClient(esdb_fresh_emulator.uri)
    began = time.monotonic()
    try:
        with client.subscribe_to_all(include_caught_up=True) as subscription:
            items = take_until(subscription, is_caught_up, limit=count + 1)
    finally:
        client.close()
    assert len(items) == count + 1 and all(i.type == kind for i in items[:-1])
    assert time.monotonic() - began < 20
