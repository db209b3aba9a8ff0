"""The EventStoreDB adapter under injected faults (wire emulator only; skipped when
``TERRET_ESDB_URI`` points at a real server): transient unavailability is retried, dropped
subscriptions resume with no gap and no duplicate, "not leader" answers are followed to the
leader, and a fault that persists becomes ``StoreUnavailable`` within the configured bound
instead of a hang."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any
from uuid import uuid4

import grpc
import pytest
from esdbclient import EventStoreDBClient, NewEvent
from esdbclient import StreamState as EsdbStreamState

from terret.adapters.stores.eventstoredb import EventStoreDBStore
from terret.domain.errors import StoreUnavailable
from terret.domain.store import CaughtUp, StoredRecord, StreamState
from terret.testing.store_contract import SIGNAL, Collector, expect, new_stream, record, records
from tests.support.esdb_emulator import EsdbEmulator

BOUND = 1.5
"""``retry_timeout`` of the stores in this module: how long a fault may persist."""

SLACK = 2.0
"""What a persistent fault may take beyond ``BOUND`` (one attempt's deadline, backoff jitter)."""

APPENDS = ["Append", "BatchAppend"]
"""One event goes by the Append RPC, several by BatchAppend."""


@pytest.fixture
def emulator(esdb_faults: EsdbEmulator) -> EsdbEmulator:
    return esdb_faults


@pytest.fixture
def store(emulator: EsdbEmulator) -> Iterator[EventStoreDBStore]:
    store = EventStoreDBStore(
        emulator.uri, retry_timeout=BOUND, call_timeout=1.0, idle_checkpoint_after=0.1
    )
    yield store
    store.close()


def _unavailable(emulator: EsdbEmulator, n: int, *methods: str) -> None:
    emulator.fail_next(n, grpc.StatusCode.UNAVAILABLE, list(methods) or None)


def _positions_strictly_increase(items: list[Any]) -> None:
    last = 0
    for item in items:
        if isinstance(item, StoredRecord):
            assert item.position > last, (item, last)
            last = item.position
        else:
            assert item.position >= last, (item, last)


# --- appends and reads -----------------------------------------------------------------------


def test_unavailable_appends_are_retried_and_written_once(
    store: EventStoreDBStore, emulator: EsdbEmulator
) -> None:
    stream = new_stream()
    # esdbclient's own decorators retry once and reconnect once; more failures than that
    # reach the adapter's loop.
    _unavailable(emulator, 6, "BatchAppend")
    batch = records(3)
    result = store.append(stream, batch, StreamState.NO_STREAM)
    stored = store.read_stream(stream)
    assert [r.event_id for r in stored] == [r.event_id for r in batch]
    assert result.version == 3 and result.position == stored[-1].position


def test_a_retry_after_a_lost_reply_does_not_duplicate(
    store: EventStoreDBStore, emulator: EsdbEmulator
) -> None:
    """R7: the first attempt was committed but its reply was lost; the retry carries the same
    event ids at the same expected version and gets the original result."""
    stream = new_stream()
    store.append(stream, records(1), StreamState.NO_STREAM)
    batch = records(2)
    raw = EventStoreDBClient(emulator.uri)
    try:
        committed = raw.append_to_stream(
            stream,
            current_version=0,
            events=[
                NewEvent(type=r.wire_name, data=r.data, metadata=r.metadata, id=r.event_id)
                for r in batch
            ],
        )
    finally:
        raw.close()
    _unavailable(emulator, 4, "BatchAppend")
    retried = store.append(stream, batch, 1)
    assert retried.position == committed and retried.version == 3
    assert [r.event_id for r in store.read_stream(stream)][1:] == [r.event_id for r in batch]


def test_unavailable_reads_are_retried(store: EventStoreDBStore, emulator: EsdbEmulator) -> None:
    start = store.head_position()
    stream = new_stream()
    store.append(stream, records(4), StreamState.NO_STREAM)
    _unavailable(emulator, 5, "Read")
    assert [r.seq for r in store.read_stream(stream)] == [1, 2, 3, 4]
    _unavailable(emulator, 5, "Read")
    assert store.stream_version(stream) == 4
    _unavailable(emulator, 5, "Read")
    assert [r.seq for r in store.read_all(after=start) if r.stream == stream] == [1, 2, 3, 4]
    _unavailable(emulator, 5, "Read")
    assert store.head_position() >= store.read_stream(stream)[-1].position


@pytest.mark.parametrize(
    "code", [grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.ABORTED, grpc.StatusCode.INTERNAL]
)
def test_other_transient_codes_are_retried(
    store: EventStoreDBStore, emulator: EsdbEmulator, code: grpc.StatusCode
) -> None:
    stream = new_stream()
    emulator.fail_next(3, code, APPENDS)
    store.append(stream, records(1), StreamState.NO_STREAM)
    emulator.fail_next(3, code, ["Read"])
    assert store.stream_version(stream) == 1


def test_unavailable_deletes_snapshots_and_metadata_are_retried(
    store: EventStoreDBStore, emulator: EsdbEmulator
) -> None:
    stream = new_stream()
    store.append(stream, records(2), StreamState.NO_STREAM)
    _unavailable(emulator, 4)
    store.write_snapshot(stream, 2, b"s")
    _unavailable(emulator, 4)
    assert store.read_snapshot(stream) == (2, b"s")
    _unavailable(emulator, 4, "Append")
    store.set_max_age(stream, 60)
    _unavailable(emulator, 4, "Tombstone")
    store.delete_stream(stream)
    assert store.read_stream(stream) == []


# --- persistent faults -----------------------------------------------------------------------


@pytest.mark.parametrize("methods", [APPENDS, None])
def test_a_persistent_fault_is_store_unavailable_within_the_bound(
    store: EventStoreDBStore, emulator: EsdbEmulator, methods: list[str] | None
) -> None:
    _unavailable(emulator, 100_000, *(methods or []))
    began = time.monotonic()
    with pytest.raises(StoreUnavailable) as info:
        store.append(new_stream(), records(1), StreamState.NO_STREAM)
    elapsed = time.monotonic() - began
    assert BOUND * 0.5 <= elapsed < BOUND + SLACK, elapsed
    assert "append to session-" in str(info.value)
    assert "attempt" in str(info.value)
    emulator.reset_faults()
    store.append(new_stream(), records(1), StreamState.NO_STREAM)  # and it recovers


def test_permanent_refusals_are_not_retried(
    store: EventStoreDBStore, emulator: EsdbEmulator
) -> None:
    emulator.fail_next(100, grpc.StatusCode.PERMISSION_DENIED, APPENDS)
    began = time.monotonic()
    with pytest.raises(StoreUnavailable) as info:
        store.append(new_stream(), records(1), StreamState.NO_STREAM)
    assert time.monotonic() - began < BOUND  # esdbclient retries once; the adapter does not
    assert "PERMISSION_DENIED" in str(info.value)


def test_a_server_that_is_gone_is_store_unavailable_within_the_bound() -> None:
    dead = EsdbEmulator().start()
    uri = dead.uri
    dead.stop()
    store = EventStoreDBStore(uri, retry_timeout=BOUND, call_timeout=1.0)
    try:
        for operation in (
            lambda: store.append(new_stream(), records(1), StreamState.NO_STREAM),
            lambda: store.read_stream(new_stream()),
            store.head_position,
        ):
            began = time.monotonic()
            with pytest.raises(StoreUnavailable):
                operation()
            assert time.monotonic() - began < BOUND + SLACK
    finally:
        store.close()


def test_a_subscription_whose_server_stays_away_ends_with_store_unavailable(
    store: EventStoreDBStore, emulator: EsdbEmulator
) -> None:
    collector = Collector(store.subscribe(after=store.head_position(), wire_names=[SIGNAL]))
    try:
        collector.wait_caught_up()
        _unavailable(emulator, 100_000, "Read")
        began = time.monotonic()
        emulator.cut_subscriptions()
        with pytest.raises(StoreUnavailable) as info:
            collector.wait(lambda _: False, timeout=BOUND + SLACK + 5)
        assert time.monotonic() - began < BOUND + SLACK
        assert "subscription to $all" in str(info.value)
    finally:
        emulator.reset_faults()
        collector.subscription.stop()


# --- subscriptions ---------------------------------------------------------------------------


def test_a_cut_live_subscription_resumes_without_gap_or_duplicate(
    store: EventStoreDBStore, emulator: EsdbEmulator
) -> None:
    stream = new_stream()
    start = store.head_position()
    store.append(stream, records(10), StreamState.NO_STREAM)
    sub = store.subscribe(after=start, wire_names=[SIGNAL])
    collector = Collector(sub)
    total = 300
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            for i in range(10, total):
                store.append(stream, [record(SIGNAL, i)], i)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    try:
        collector.wait_caught_up()
        thread = threading.Thread(target=writer)
        thread.start()
        cuts = 0
        while thread.is_alive():
            cuts += emulator.cut_subscriptions()
            time.sleep(0.02)
        thread.join()
        assert not errors
        got = collector.wait_records([stream], total)
        assert [r.seq for r in got] == list(range(1, total + 1))
        assert got == store.read_stream(stream)
        assert cuts >= 1 and getattr(sub, "resubscriptions", 0) >= 1
    finally:
        collector.stop()
    _positions_strictly_increase(collector.snapshot())
    assert len([i for i in collector.snapshot() if isinstance(i, CaughtUp)]) == 1


def test_a_cut_during_catch_up_resumes_without_gap_or_duplicate(
    store: EventStoreDBStore, emulator: EsdbEmulator
) -> None:
    start = store.head_position()
    stream = new_stream()
    total = 6000
    for i in range(0, total, 500):
        store.append(stream, [record(SIGNAL, i + k) for k in range(500)], expect(i))
    sub = store.subscribe(after=start, wire_names=[SIGNAL])
    received: list[StoredRecord] = []
    cut_at = {500, 1500, 1501, 4000}
    try:
        for item in sub:
            if isinstance(item, StoredRecord) and item.stream == stream:
                received.append(item)
                if len(received) in cut_at:
                    # the reader is ahead of us: cut while it is mid-history
                    emulator.cut_subscriptions()
            if isinstance(item, CaughtUp):
                break
    finally:
        sub.stop()
    assert [r.seq for r in received] == list(range(1, total + 1))


def test_unavailable_resubscription_is_retried(
    store: EventStoreDBStore, emulator: EsdbEmulator
) -> None:
    stream = new_stream()
    sub = store.subscribe(after=store.head_position(), wire_names=[SIGNAL])
    collector = Collector(sub)
    try:
        collector.wait_caught_up()
        _unavailable(emulator, 5, "Read")  # the resubscription's first attempts fail
        emulator.cut_subscriptions()
        store.append(stream, records(3), StreamState.NO_STREAM)
        assert [r.seq for r in collector.wait_records([stream], 3)] == [1, 2, 3]
    finally:
        collector.stop()


def test_stop_is_prompt_while_a_subscription_backs_off(
    store: EventStoreDBStore, emulator: EsdbEmulator
) -> None:
    collector = Collector(store.subscribe(after=store.head_position(), wire_names=[SIGNAL]))
    try:
        collector.wait_caught_up()
        _unavailable(emulator, 100_000, "Read")
        emulator.cut_subscriptions()
        time.sleep(0.3)  # in the retry loop now
    finally:
        began = time.monotonic()
        collector.stop()
        emulator.reset_faults()
    assert time.monotonic() - began < 1.0


# --- "not leader" ----------------------------------------------------------------------------


@pytest.fixture
def leader() -> Iterator[EsdbEmulator]:
    """A second emulator that plays the cluster's leader."""
    with EsdbEmulator().start() as node:
        yield node


def test_not_leader_on_a_cluster_uri_reconnects_to_the_leader(
    emulator: EsdbEmulator, leader: EsdbEmulator
) -> None:
    # Gossip on the first node names itself; then it starts answering "not leader, ask B".
    store = EventStoreDBStore(emulator.cluster_uri, retry_timeout=BOUND, call_timeout=1.0)
    try:
        stream = new_stream()
        store.append(stream, records(1), StreamState.NO_STREAM)
        assert store.stream_version(stream) == 1
        emulator.not_leader(100_000, leader.host, leader.port)
        moved = new_stream()
        result = store.append(moved, records(2), StreamState.NO_STREAM)
        assert result.version == 2
        # the write landed on the leader, not on the node that refused it
        raw = EventStoreDBClient(leader.uri)
        try:
            assert [e.stream_position for e in raw.get_stream(moved)] == [0, 1]
        finally:
            raw.close()
        assert [r.seq for r in store.read_stream(moved)] == [1, 2]
    finally:
        emulator.reset_faults()
        store.close()


def test_not_leader_twice_in_a_row_is_still_followed(
    emulator: EsdbEmulator, leader: EsdbEmulator
) -> None:
    """esdbclient follows one redirect per call; a leader that moves again while it
    reconnects reaches the adapter, which follows the new hint itself."""
    store = EventStoreDBStore(emulator.cluster_uri, retry_timeout=BOUND, call_timeout=1.0)
    try:
        store.append(new_stream(), records(1), StreamState.NO_STREAM)
        emulator.not_leader(100_000, leader.host, leader.port)
        leader.not_leader(1, leader.host, leader.port, APPENDS)
        stream = new_stream()
        assert store.append(stream, records(1), StreamState.NO_STREAM).version == 1
    finally:
        emulator.reset_faults()
        leader.reset_faults()
        store.close()


def test_not_leader_on_a_single_node_uri_follows_the_hint(
    emulator: EsdbEmulator, leader: EsdbEmulator
) -> None:
    """esdbclient re-raises NodeIsNotLeader for a one-host ``esdb://`` URI; the adapter
    reconnects to the leader the node named."""
    store = EventStoreDBStore(emulator.uri, retry_timeout=BOUND, call_timeout=1.0)
    try:
        emulator.not_leader(100_000, leader.host, leader.port, APPENDS)
        stream = new_stream()
        assert store.append(stream, records(1), StreamState.NO_STREAM).version == 1
        raw = EventStoreDBClient(leader.uri)
        try:
            assert raw.get_current_version(stream) == 0
        finally:
            raw.close()
    finally:
        emulator.reset_faults()
        store.close()


def _pad_past(node: EsdbEmulator, other: EsdbEmulator) -> None:
    """Two emulators keep separate logs; a real cluster replicates one. Pad ``node``'s log so
    that its positions continue past ``other``'s, as a promoted follower's would."""
    target = other.store.event_count
    while node.store.event_count <= target:
        node.append_raw("padding", [NewEvent(type="padding", data=b"{}")] * 200)
    a, b = EventStoreDBClient(other.uri), EventStoreDBClient(node.uri)
    try:
        while b.get_commit_position(filter_exclude=[]) <= a.get_commit_position(filter_exclude=[]):
            node.append_raw("padding", [NewEvent(type="padding", data=b"x" * 1000)] * 200)
    finally:
        a.close()
        b.close()


def test_a_subscription_follows_a_leader_change(
    emulator: EsdbEmulator, leader: EsdbEmulator
) -> None:
    store = EventStoreDBStore(emulator.cluster_uri, retry_timeout=BOUND, call_timeout=1.0)
    try:
        collector = Collector(store.subscribe(after=0, wire_names=[SIGNAL]))
        try:
            collector.wait_caught_up()
            _pad_past(leader, emulator)
            emulator.not_leader(100_000, leader.host, leader.port)
            emulator.cut_subscriptions()  # the old leader drops its clients
            stream = new_stream()
            raw = EventStoreDBClient(leader.uri)
            try:
                raw.append_to_stream(
                    stream,
                    current_version=EsdbStreamState.NO_STREAM,
                    events=[NewEvent(type=SIGNAL, data=b"{}", id=uuid4())],
                )
            finally:
                raw.close()
            assert [r.seq for r in collector.wait_records([stream], 1)] == [1]
        finally:
            collector.stop()
    finally:
        emulator.reset_faults()
        store.close()


def test_a_subscription_told_not_leader_reconnects_and_resumes(
    store: EventStoreDBStore, emulator: EsdbEmulator
) -> None:
    """The named leader is the same node here (one log), so the events on both sides of the
    redirect can be checked for gaps and duplicates."""
    stream = new_stream()
    store.append(stream, records(5), StreamState.NO_STREAM)
    collector = Collector(store.subscribe(after=0, wire_names=[SIGNAL]))
    try:
        collector.wait_caught_up()
        emulator.not_leader(3, methods=["Read"])
        emulator.cut_subscriptions()
        store.append(stream, records(5), 5)
        got = collector.wait_records([stream], 10)
        assert [r.seq for r in got] == list(range(1, 11))
    finally:
        collector.stop()
    _positions_strictly_increase(collector.snapshot())


def test_discovery_failures_are_retried(emulator: EsdbEmulator) -> None:
    _unavailable(emulator, 3, "Gossip")
    store = EventStoreDBStore(emulator.discover_uri, retry_timeout=BOUND + 2, call_timeout=1.0)
    try:
        stream = new_stream()
        assert store.append(stream, records(1), StreamState.NO_STREAM).version == 1
    finally:
        store.close()


def test_discovery_that_keeps_failing_is_store_unavailable(emulator: EsdbEmulator) -> None:
    _unavailable(emulator, 100_000, "Gossip")
    store = EventStoreDBStore(emulator.cluster_uri, retry_timeout=BOUND, call_timeout=1.0)
    try:
        began = time.monotonic()
        with pytest.raises(StoreUnavailable) as info:
            store.stream_version(new_stream())
        assert time.monotonic() - began < BOUND + SLACK
        assert "DiscoveryFailed" in str(info.value)
    finally:
        emulator.reset_faults()
        store.close()


# --- servers before 23.10 --------------------------------------------------------------------


def test_a_server_that_never_says_caught_up_still_gets_there(
    store: EventStoreDBStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EventStoreDB 22.10 sends no "caught up" message; the idle probe finds that nothing is
    left to deliver up to the head, and says so."""
    client = store.connection.client()
    original = client.subscribe_to_all

    def without_caught_up(**kwargs: Any) -> Any:
        kwargs["include_caught_up"] = False
        return original(**kwargs)

    monkeypatch.setattr(client, "subscribe_to_all", without_caught_up)
    start = store.head_position()
    stream = new_stream()
    store.append(stream, records(3), StreamState.NO_STREAM)
    sub = store.subscribe(after=start, wire_names=[SIGNAL])
    collector = Collector(sub)
    try:
        caught_up = collector.wait_caught_up()
        items = collector.snapshot()
        before = items[: items.index(caught_up)]
        assert [i.seq for i in before if isinstance(i, StoredRecord) and i.stream == stream] == [
            1,
            2,
            3,
        ]
        assert caught_up.position >= store.read_stream(stream)[-1].position
        assert sub.buffered == 0  # caught up and idle: a batching consumer flushes now
        store.append(stream, records(2), 3)
        assert [r.seq for r in collector.wait_records([stream], 5)] == [1, 2, 3, 4, 5]
    finally:
        collector.stop()
    _positions_strictly_increase(collector.snapshot())
    assert len([i for i in collector.snapshot() if isinstance(i, CaughtUp)]) == 1


def test_buffered_counts_history_still_streaming_in(store: EventStoreDBStore) -> None:
    start = store.head_position()
    stream = new_stream()
    store.append(stream, records(5), StreamState.NO_STREAM)
    with store.subscribe(after=start, wire_names=[SIGNAL]) as sub:
        first = next(sub)
        assert isinstance(first, StoredRecord) and first.stream == stream
        assert getattr(sub, "buffered", 0) > 0  # more history on its way: keep batching
        for item in sub:
            if isinstance(item, CaughtUp):
                break
        assert getattr(sub, "buffered", 0) == 0
