"""The store contract on the EventStoreDB adapter — against the wire emulator, or against the
real server named by ``TERRET_ESDB_URI`` — plus what only this adapter does: the wire
mapping (event type, metadata, ids, positions), snapshots and deletion records kept out of
``$all`` readers, and retention metadata."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest
from esdbclient import EventStoreDBClient, NewEvent
from esdbclient import StreamState as EsdbStreamState

from terret.adapters.stores import eventstoredb
from terret.adapters.stores._esdb import DELETION_EVENT_TYPE
from terret.adapters.stores._esdb_subscription import EsdbSubscription, stream_filter
from terret.adapters.stores.eventstoredb import (
    DELETIONS_STREAM,
    SNAPSHOT_PREFIX,
    EventStoreDBStore,
)
from terret.adapters.stores.uri import open_store
from terret.domain.errors import StreamDeleted
from terret.domain.store import Checkpoint, EventStore, StoredRecord, StreamState
from terret.testing.store_contract import (
    NOISE,
    SIGNAL,
    TIMEOUT,
    Collector,
    Opener,
    StoreContract,
    expect,
    new_stream,
    record,
    records,
)
from tests.support.esdb_emulator import EsdbEmulator


class TestEventStoreDBStore(StoreContract):
    uri: str
    head_reader = "log.read_head"  # what the subscription calls when it finds nothing new

    @pytest.fixture(autouse=True)
    def _uri(self, esdb_uri: str) -> None:
        self.uri = esdb_uri

    def create_store(self) -> EventStore:
        # Idle checkpoints every 50 ms instead of 500: the contract's head-race case needs
        # dozens of idle head reads within its timeout.
        return EventStoreDBStore(self.uri, idle_checkpoint_after=0.05)

    def other_process_opener(self) -> Opener:
        return functools.partial(EventStoreDBStore, self.uri)

    def other_store_opener(self, request: pytest.FixtureRequest) -> Opener:
        emulator = request.getfixturevalue("esdb_fresh_emulator")  # skipped on a real server
        return functools.partial(EventStoreDBStore, emulator.uri)

    # --- EventStoreDB only --------------------------------------------------------------------

    @pytest.fixture
    def raw(self) -> Iterator[EventStoreDBClient]:
        client = EventStoreDBClient(self.uri)
        yield client
        client.close()

    def test_a_program_that_never_closes_its_store_exits(self, tmp_path: Any) -> None:
        """The README's examples never close the store: at exit the adapter closes what is
        left open (its subscriptions and gRPC channel) while the program's threads still run.
        Left to the garbage collector, the channel's close could wait for ever on a lock a
        frozen daemon thread held."""
        script = tmp_path / "left_open.py"
        script.write_text(
            "import sys, terret\n"
            "from terret.adapters.stores import eventstoredb\n"
            "store = terret.open_store(sys.argv[1])\n"
            "sub = store.open_subscription()\n"
            "assert store in eventstoredb._OPEN\n"
            "eventstoredb._close_open_stores()\n"
            "assert store not in eventstoredb._OPEN and store.connection._closed\n"
            "again = terret.open_store(sys.argv[1])\n"
            "again.open_subscription(); again.head_position()\n"
            "print('left open')\n")
        done = subprocess.run([sys.executable, str(script), self.uri], capture_output=True,
                              text=True, timeout=60, cwd=Path(__file__).resolve().parents[2])
        assert done.returncode == 0, done.stderr
        assert done.stdout == "left open\n"

    def test_opened_from_an_esdb_uri(self) -> None:
        store = open_store(self.uri)
        try:
            assert isinstance(store, EventStoreDBStore)
            assert store.describe().startswith("eventstoredb esdb")
        finally:
            store.close()

    def test_wire_mapping(self, store: EventStore, raw: EventStoreDBClient) -> None:
        stream = new_stream()
        batch = [record(SIGNAL, 0), record("contract/other", 1)]
        result = store.append(stream, batch, StreamState.NO_STREAM)
        events = raw.get_stream(stream)
        assert [e.type for e in events] == [SIGNAL, "contract/other"]
        assert [e.id for e in events] == [r.event_id for r in batch]
        assert [e.data for e in events] == [r.data for r in batch]
        assert [e.metadata for e in events] == [r.metadata for r in batch]
        assert [e.stream_position for e in events] == [0, 1]  # revision = seq - 1
        assert {e.content_type for e in events} == {"application/json"}
        assert events[-1].commit_position == result.position
        # NO_STREAM is version 0; version v is revision v - 1
        assert raw.get_current_version(stream) == 1

    def test_snapshots_live_outside_the_filtered_log(
        self, store: EventStore, raw: EventStoreDBClient
    ) -> None:
        start = store.head_position()
        stream = new_stream()
        store.append(stream, records(1), StreamState.NO_STREAM)
        store.write_snapshot(stream, 1, b"\x00binary state")
        snapshot_stream = SNAPSHOT_PREFIX + stream
        metadata, _ = raw.get_stream_metadata(snapshot_stream)
        assert metadata.get("$maxCount") == 1
        found = [r for r in store.read_all(after=start, limit=1000)]
        assert [r.stream for r in found if r.stream in (stream, snapshot_stream)] == [stream]
        assert store.head_position() >= found[-1].position  # never a snapshot's position
        assert store.head_position() not in {
            e.commit_position for e in raw.get_stream(snapshot_stream)
        }

    def test_set_max_age_writes_stream_metadata(
        self, store: EventStore, raw: EventStoreDBClient
    ) -> None:
        stream = new_stream()
        store.append(stream, records(2), StreamState.NO_STREAM)
        raw.set_stream_metadata(stream, metadata={"owner": "ops"})
        store.set_max_age(stream, 3600)
        metadata, _ = raw.get_stream_metadata(stream)
        assert metadata == {"owner": "ops", "$maxAge": 3600}  # other keys are kept
        store.set_max_age(stream, 7200)
        assert raw.get_stream_metadata(stream)[0]["$maxAge"] == 7200
        assert [r.seq for r in store.read_stream(stream)] == [1, 2]  # not expired yet
        with pytest.raises(ValueError):
            store.set_max_age(stream, 0)

    def test_delete_tombstones_and_records_the_deletion(
        self, store: EventStore, raw: EventStoreDBClient
    ) -> None:
        stream = new_stream()
        store.append(stream, records(2), StreamState.NO_STREAM)
        store.delete_stream(stream)
        recorded = [json.loads(e.data)["stream"] for e in raw.get_stream(DELETIONS_STREAM)]
        assert stream in recorded
        for expected in (StreamState.NO_STREAM, StreamState.ANY, 2):
            with pytest.raises(StreamDeleted):
                store.append(stream, records(1), expected)
        store.delete_stream(stream)  # again: harmless

    def test_another_store_instance_learns_of_deletions(self, store: EventStore) -> None:
        start = store.head_position()
        doomed, kept = new_stream(), new_stream()
        store.append(doomed, records(2), StreamState.NO_STREAM)
        store.append(kept, records(1), StreamState.NO_STREAM)
        other = EventStoreDBStore(self.uri)
        try:
            collector = Collector(other.subscribe(after=start, wire_names=[SIGNAL]))
            try:
                collector.wait_caught_up()
                assert len(collector.records([doomed])) == 2
                store.delete_stream(doomed)
                # read_all in the other instance refreshes its view of deletions
                assert {r.stream for r in other.read_all(after=start)} & {doomed} == set()
                store.append(kept, records(1), 1)
                collector.wait_records([kept], 2)
            finally:
                collector.stop()
            # a new subscription there no longer delivers the deleted stream's history
            late = Collector(other.subscribe(after=start, wire_names=[SIGNAL]))
            try:
                late.wait_caught_up()
                assert late.records([doomed]) == []
                assert [r.seq for r in late.records([kept])] == [1, 2]
            finally:
                late.stop()
        finally:
            other.close()

    def test_events_of_unknown_types_are_delivered_by_default(
        self, store: EventStore, raw: EventStoreDBClient
    ) -> None:
        start = store.head_position()
        stream = new_stream()
        raw.append_to_stream(
            stream,
            current_version=EsdbStreamState.NO_STREAM,
            events=[NewEvent(type="future/event", data=b"{}")],
        )
        found = [r for r in store.read_all(after=start) if r.stream == stream]
        assert [r.wire_name for r in found] == ["future/event"]
        catalogue_only = EventStoreDBStore(self.uri, catalogue_only=True)
        try:
            assert [r for r in catalogue_only.read_all(after=start) if r.stream == stream] == []
        finally:
            catalogue_only.close()

    def test_caught_up_and_idle_checkpoints_never_pass_an_undelivered_event(
        self, store: EventStore
    ) -> None:
        stream = new_stream()
        collector = Collector(store.subscribe(after=store.head_position(), wire_names=[SIGNAL]))
        try:
            collector.wait_caught_up()
            for i in range(5):
                store.append(stream, [record("contract/noise", i)], expect(2 * i))
                store.append(stream, [record(SIGNAL, i)], 2 * i + 1)
            got = collector.wait_records([stream], 5)
            assert [r.seq for r in got] == [2, 4, 6, 8, 10]
        finally:
            collector.stop()
        last_record = 0
        for item in collector.snapshot():
            if isinstance(item, StoredRecord):
                assert item.position > last_record
                last_record = item.position
            else:
                assert item.position >= last_record

    def test_retry_of_an_any_append_reports_the_original_version(self, store: EventStore) -> None:
        stream = new_stream()
        store.append(stream, records(1), StreamState.NO_STREAM)
        batch = records(2)
        first = store.append(stream, batch, StreamState.ANY)
        store.append(stream, records(1), StreamState.ANY)
        assert store.append(stream, batch, StreamState.ANY) == first
        assert first.version == 3

    # --- subscriptions to some streams ------------------------------------------------------

    def test_the_stream_filter_selects_exact_names_on_the_server(
        self, store: EventStore, raw: EventStoreDBClient
    ) -> None:
        """What the server itself selects with a subscription's stream filter (its regex, as
        the server runs it): the names, metacharacters and all, and the deletions stream."""
        start = store.head_position()
        base = f"contract-{uuid4().hex}"
        dotted, special = f"{base}-a.b", f"{base}-(x|y) *+?[z]{{2}}^$\\#"
        decoys = [f"{base}-aXb", f"{base}-a.b-more", f"more-{base}-a.b", f"{base}-a",
                  f"{base}-(x|y)", f"{base}-y zz^$\\#"]
        many = [new_stream() for _ in range(2000)]
        for stream in [*decoys, dotted, special, many[-1]]:
            store.append(stream, records(1), StreamState.NO_STREAM)
        store.delete_stream(decoys[0])  # a deletion record after start
        for names, expected in (([dotted, special], {dotted, special}),
                                ([*many, dotted], {many[-1], dotted})):
            found = {e.stream_name for e in raw.read_all(
                commit_position=start, **stream_filter(names))}
            assert found - {DELETIONS_STREAM} == expected
            assert DELETIONS_STREAM in found

    def test_a_page_larger_than_a_request_is_read_in_several_requests(
        self, store: EventStore, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A request's deadline is the same whatever its size: a rebuild's page (40,000
        events) from a busy server outran it in one request. A page is now read in requests of
        at most ``READ_CHUNK`` events, and comes back whole and in order."""
        monkeypatch.setattr(eventstoredb, "READ_CHUNK", 7)
        calls: list[tuple[str, dict[str, Any]]] = []
        monkeypatch.setattr(EventStoreDBClient, "read_all", _spy("read_all", calls))
        start = store.head_position()
        stream = new_stream()
        store.append(stream, records(30), StreamState.NO_STREAM)
        page = store.read_all(after=start, limit=25)
        assert [r.seq for r in page] == list(range(1, 26))
        assert [r.stream for r in page] == [stream] * 25
        asked = [kw["limit"] for method, kw in calls if method == "read_all"]
        assert len(asked) >= 4 and max(asked) <= 7, asked
        assert [r.seq for r in store.read_all(after=page[-1].position, limit=100)] == [
            26, 27, 28, 29, 30]

    def test_a_stream_subscription_asks_the_server_for_its_streams_every_time(
        self, store: EventStore, esdb_faults: EsdbEmulator, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Server-side: the subscription, every resubscription (here after a cut) and every
        idle probe filter on the stream names; nothing of another stream is delivered."""
        calls: list[tuple[str, dict[str, Any]]] = []
        for method in ("subscribe_to_all", "read_all"):
            monkeypatch.setattr(EventStoreDBClient, method, _spy(method, calls))
        start = store.head_position()
        watched, other = new_stream(), new_stream()
        store.append(other, records(2), StreamState.NO_STREAM)
        sub = store.open_subscription(after=start, streams=[watched])
        assert isinstance(sub, EsdbSubscription)
        collector = Collector(sub)
        try:
            collector.wait_caught_up()
            assert esdb_faults.cut_subscriptions() >= 1
            store.append(watched, records(1), StreamState.NO_STREAM)
            assert [r.seq for r in collector.wait_records([watched], 1)] == [1]
            assert sub.resubscriptions >= 1
            # live and idle: only a probe can checkpoint past another stream's event
            store.append(other, records(1), 2)
            last = store.read_stream(other, backwards=True, limit=1)[0].position
            assert collector.wait(lambda items: any(
                isinstance(i, Checkpoint) and i.position >= last for i in items))
        finally:
            collector.stop()
        assert [i for i in collector.snapshot() if isinstance(i, StoredRecord)] == \
            collector.records([watched])
        subscribes = [kw for method, kw in calls if method == "subscribe_to_all"]
        probes = [kw for method, kw in calls if method == "read_all" and kw.get("limit") == 2]
        assert len(subscribes) >= 2 and probes
        for kwargs in subscribes + probes:
            assert {k: kwargs.get(k) for k in stream_filter([watched])} == \
                stream_filter([watched])

    def test_a_stream_subscription_learns_deletions_from_its_own_filter(
        self, store: EventStore
    ) -> None:
        """A subscription to some streams receives the deletion records (its filter lets the
        deletions stream through) and delivers none of them. Another store instance, with no
        idle probe (which would resubscribe, and so re-read the deletions): only its
        subscription can tell it of the deletion."""
        start = store.head_position()
        watched, doomed = new_stream(), new_stream()
        store.append(watched, records(1), StreamState.NO_STREAM)
        store.append(doomed, [record(NOISE, 0)], StreamState.NO_STREAM)
        other = EventStoreDBStore(self.uri, idle_checkpoint_after=0)
        try:
            collector = Collector(other.open_subscription(after=start, wire_names=[SIGNAL],
                                                          streams=[watched]))
            try:
                collector.wait_caught_up()
                assert doomed not in other.log.deleted_streams(refresh=False)
                store.delete_stream(doomed)
                deadline = time.monotonic() + TIMEOUT
                while doomed not in other.log.deleted_streams(refresh=False):
                    assert time.monotonic() < deadline, "the deletion record never arrived"
                    time.sleep(0.01)
                store.append(watched, records(1), 1)
                assert [r.seq for r in collector.wait_records([watched], 2)] == [1, 2]
            finally:
                collector.stop()
            delivered = [i for i in collector.snapshot() if isinstance(i, StoredRecord)]
            assert [(r.stream, r.wire_name) for r in delivered] == [(watched, SIGNAL)] * 2
            assert DELETION_EVENT_TYPE not in {r.wire_name for r in delivered}
        finally:
            other.close()


def _spy(method: str, calls: list[tuple[str, dict[str, Any]]]) -> Any:
    """``EventStoreDBClient.<method>``, noting the keyword arguments of every call."""
    real = getattr(EventStoreDBClient, method)

    def spy(self: EventStoreDBClient, *args: Any, **kwargs: Any) -> Any:
        calls.append((method, kwargs))
        return real(self, *args, **kwargs)

    return spy
