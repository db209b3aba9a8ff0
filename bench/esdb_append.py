"""What the EventStoreDB adapter costs on top of esdbclient, against one wire emulator
started in this process (``tests/support/esdb_emulator``; no EventStoreDB server is needed).

(a) ``esdb_append_overhead``: single-event appends of the same payload (a ``model/set`` event,
    JSON data and metadata, a fresh event id, the exact expected version) through
    ``EventStoreDBStore.append`` against raw ``EventStoreDBClient.append_to_stream`` with the
    same event and expected revision. Rounds alternate between the two; the figure is the
    median adapter time / median raw time per append (1.0 = no overhead; lower is better).
(b) ``esdb_catchup_vs_raw``: a catch-up subscription over 50,000 events (in 50 session
    streams) through ``EventStoreDBStore.subscribe`` — until all of them were yielded as
    ``StoredRecord`` — against a raw ``EventStoreDBClient.subscribe_to_all`` from the same
    position with the same kind of server-side filter, iterated until the same events were
    received. Alternating repetitions; the figure is median raw time / median adapter time
    (adapter throughput as a fraction of raw; higher is better).

The two figures are printed last, in this order. The emulator shares this process (and its
GIL) with the client being measured, on both sides alike, so absolute numbers are lower than
against a real server; the ratios are what the figures report.

    .venv/bin/python bench/esdb_append.py [--rounds 9] [--per-round 200] [--events 50000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from esdbclient import EventStoreDBClient, NewEvent  # noqa: E402
from esdbclient import StreamState as EsdbStreamState  # noqa: E402

from terret.adapters.stores.eventstoredb import EventStoreDBStore  # noqa: E402
from terret.domain.store import NewRecord, StoredRecord, StreamState  # noqa: E402
from tests.support.esdb_emulator import EsdbEmulator  # noqa: E402

TARGET_APPEND = 1.2
TARGET_CATCHUP = 0.8
METADATA = json.dumps(
    {"schema_version": 1, "correlation_id": str(uuid.uuid4()), "causation_id": None}
).encode()


def payload(i: int) -> bytes:
    return json.dumps({"role": "main", "spec": f"openrouter:vendor/model-{i % 16}"}).encode()


# --- (a) appends -----------------------------------------------------------------------------


class RawAppends:
    def __init__(self, uri: str) -> None:
        self.client = EventStoreDBClient(uri)
        self.stream = f"session-{uuid.uuid4()}"
        self.version = 0

    def append_one(self, i: int) -> None:
        current = self.version - 1 if self.version else EsdbStreamState.NO_STREAM
        self.client.append_to_stream(
            self.stream,
            current_version=current,
            events=NewEvent(type="model/set", data=payload(i), metadata=METADATA, id=uuid.uuid4()),
        )
        self.version += 1

    def close(self) -> None:
        self.client.close()


class AdapterAppends:
    def __init__(self, uri: str) -> None:
        self.store = EventStoreDBStore(uri)
        self.stream = f"session-{uuid.uuid4()}"
        self.version = 0

    def append_one(self, i: int) -> None:
        record = NewRecord(uuid.uuid4(), "model/set", payload(i), METADATA)
        expected = self.version or StreamState.NO_STREAM
        self.version = self.store.append(self.stream, [record], expected).version

    def close(self) -> None:
        self.store.close()


def time_per_append(target: RawAppends | AdapterAppends, start: int, count: int) -> float:
    began = time.perf_counter()
    for i in range(start, start + count):
        target.append_one(i)
    return (time.perf_counter() - began) / count


def bench_appends(uri: str, rounds: int, per_round: int) -> float:
    raw, adapter = RawAppends(uri), AdapterAppends(uri)
    try:
        time_per_append(raw, 0, 100)  # warm up both (channels, code paths)
        time_per_append(adapter, 0, 100)
        raw_times: list[float] = []
        adapter_times: list[float] = []
        for r in range(rounds):
            order = (raw, adapter) if r % 2 == 0 else (adapter, raw)
            for target in order:
                spent = time_per_append(target, 100 + r * per_round, per_round)
                (raw_times if target is raw else adapter_times).append(spent)
        assert adapter.store.stream_version(adapter.stream) == 100 + rounds * per_round
    finally:
        raw.close()
        adapter.close()
    raw_us = statistics.median(raw_times) * 1e6
    adapter_us = statistics.median(adapter_times) * 1e6
    print(
        f"raw append_to_stream:       median {raw_us:8.1f} us/append ({1e6 / raw_us:6.0f}/s)"
        f" over {rounds} rounds of {per_round}"
    )
    print(
        f"EventStoreDBStore.append:   median {adapter_us:8.1f} us/append "
        f"({1e6 / adapter_us:6.0f}/s)"
    )
    return adapter_us / raw_us


# --- (b) catch-up ----------------------------------------------------------------------------


def seed(emulator: EsdbEmulator, events: int, streams: int = 50) -> tuple[int, set[str]]:
    """``events`` Terret-shaped events in ``streams`` session streams, interleaved; returns the
    position before them and the stream names."""
    raw = EventStoreDBClient(emulator.uri)
    try:
        start = raw.get_commit_position(filter_exclude=[])
    finally:
        raw.close()
    names = [f"session-{uuid.uuid4()}" for _ in range(streams)]
    per_batch = 100
    for batch in range(events // per_batch):
        stream = names[batch % streams]
        emulator.append_raw(
            stream,
            [
                NewEvent(
                    type="model/set" if i % 2 else "user/message",
                    data=payload(i),
                    metadata=METADATA,
                    id=uuid.uuid4(),
                )
                for i in range(per_batch)
            ],
        )
    return start, set(names)


def raw_catch_up(uri: str, start: int, expected: int, names: set[str]) -> float:
    client = EventStoreDBClient(uri)
    try:
        began = time.perf_counter()
        seen = 0
        # The same kind of filter the adapter sends by default: every non-system event type.
        with client.subscribe_to_all(commit_position=start or None) as sub:
            for event in sub:
                if event.stream_name in names:
                    seen += 1
                    if seen == expected:
                        break
        return time.perf_counter() - began
    finally:
        client.close()


def adapter_catch_up(uri: str, start: int, expected: int, names: set[str]) -> float:
    store = EventStoreDBStore(uri)
    try:
        began = time.perf_counter()
        seen = 0
        with store.subscribe(after=start) as sub:
            for item in sub:
                if isinstance(item, StoredRecord) and item.stream in names:
                    seen += 1
                    if seen == expected:
                        break
        return time.perf_counter() - began
    finally:
        store.close()


def bench_catch_up(emulator: EsdbEmulator, events: int, reps: int) -> float:
    start, names = seed(emulator, events)
    raw_catch_up(emulator.uri, start, events, names)  # warm up both
    adapter_catch_up(emulator.uri, start, events, names)
    raw_times: list[float] = []
    adapter_times: list[float] = []
    for r in range(reps):
        if r % 2 == 0:
            raw_times.append(raw_catch_up(emulator.uri, start, events, names))
            adapter_times.append(adapter_catch_up(emulator.uri, start, events, names))
        else:
            adapter_times.append(adapter_catch_up(emulator.uri, start, events, names))
            raw_times.append(raw_catch_up(emulator.uri, start, events, names))
    raw_s, adapter_s = statistics.median(raw_times), statistics.median(adapter_times)
    print(
        f"raw subscribe_to_all:       median {raw_s * 1e3:8.1f} ms for {events} events "
        f"({events / raw_s:7.0f}/s) over {reps} repetitions"
    )
    print(
        f"EventStoreDBStore.subscribe: median {adapter_s * 1e3:7.1f} ms for {events} events "
        f"({events / adapter_s:7.0f}/s)"
    )
    return raw_s / adapter_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--per-round", type=int, default=200)
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    with EsdbEmulator().start() as emulator:
        append_ratio = bench_appends(emulator.uri, args.rounds, args.per_round)
        catchup_ratio = bench_catch_up(emulator, args.events, args.reps)
    print(f"figure: esdb_append_overhead = {append_ratio:.2f} x (target <= {TARGET_APPEND})")
    print(f"figure: esdb_catchup_vs_raw = {catchup_ratio:.2f} x (target >= {TARGET_CATCHUP})")


if __name__ == "__main__":
    main()
