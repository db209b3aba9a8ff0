"""Append and load figures for the SQLite store.

(a) ``append_vs_raw_sqlite``: single-event commands through the ``Session`` aggregate and the
    ``SessionRepository`` (``session.set_model(...)`` then ``repo.save(session)``: one event, one
    durable transaction) against a raw ``sqlite3`` insert of a row of the same shape with the
    same durability (WAL, ``synchronous=FULL``) into a table with ``UNIQUE(stream, version)``.
    Short rounds alternate between the two; the figure is the median over rounds of raw time /
    Terret time per append in adjacent rounds (1.0 = as fast as raw SQLite; higher is better).
(b) ``load_100k_session_ms``: ``SessionRepository.get`` of a session with 100,000 events, i.e.
    everything needed before its next command: read the snapshot, replay the tail since it,
    ready to validate. The tail is 199 events, the most the repository leaves behind a
    snapshot with ``snapshot_every=200`` — the worst case of the steady state. Each load uses
    a newly opened store (a process that has just started).

The two figures are printed last, in this order. Usage: ``python bench/append.py [--dir DIR]
[--rounds N] [--per-round N]``; the database files go to a temporary directory under DIR
(default: the system's temporary directory), which is removed afterwards.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sqlite3
import statistics
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from terret.adapters.stores.sqlite import SQLiteStore
from terret.domain.codec import encode
from terret.domain.events import (
    AssistantMessage,
    StepEnded,
    StepStarted,
    ToolCallData,
    ToolResult,
    TurnEnded,
    TurnStarted,
    UsageData,
    UserMessage,
)
from terret.domain.repository import SessionRepository
from terret.domain.session import Session
from terret.domain.store import NewRecord, session_stream

SPECS = [f"openrouter:vendor/model-{i}" for i in range(16)]
TARGET_RATIO = 0.6
TARGET_LOAD_MS = 50.0
SESSION_EVENTS = 100_000
SNAPSHOT_EVERY = 200
TAIL = SNAPSHOT_EVERY - 1


# --- (a) appends -------------------------------------------------------------------------


class RawSQLite:
    """The baseline: one INSERT per transaction, WAL, synchronous=FULL."""

    def __init__(self, path: Path) -> None:
        self.conn = sqlite3.connect(path, isolation_level=None)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=FULL")
        self.conn.execute(
            "CREATE TABLE events (position INTEGER PRIMARY KEY, stream TEXT NOT NULL,"
            " version INTEGER NOT NULL, event_id BLOB NOT NULL, type TEXT NOT NULL,"
            " data BLOB NOT NULL, metadata BLOB NOT NULL, recorded_at REAL NOT NULL,"
            " UNIQUE (stream, version))"
        )
        self.stream = f"session-{uuid.uuid4()}"
        self.version = 0

    def append_one(self, i: int) -> None:
        self.version += 1
        data = json.dumps({"role": "main", "spec": SPECS[i % len(SPECS)]}).encode()
        self.conn.execute("BEGIN")
        self.conn.execute(
            "INSERT INTO events (stream, version, event_id, type, data, metadata, recorded_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            (self.stream, self.version, uuid.uuid4().bytes, "model/set", data,
             b'{"schema_version":1}', time.time()),
        )
        self.conn.execute("COMMIT")

    def close(self) -> None:
        self.conn.close()


class TerretAppends:
    """The measured path: a command on the aggregate, then ``repo.save`` (one append)."""

    def __init__(self, path: Path) -> None:
        self.store = SQLiteStore(path, synchronous="FULL")
        self.repo = SessionRepository(self.store, snapshot_every=SNAPSHOT_EVERY)
        self.session = Session.start()
        self.repo.save(self.session)

    def append_one(self, i: int) -> None:
        self.session.set_model("main", SPECS[i % len(SPECS)])
        self.repo.save(self.session)

    def close(self) -> None:
        self.store.close()


def time_per_append(target: RawSQLite | TerretAppends, start: int, count: int) -> float:
    began = time.perf_counter()
    for i in range(start, start + count):
        target.append_one(i)
    return (time.perf_counter() - began) / count


def bench_appends(workdir: Path, rounds: int, per_round: int) -> float:
    """Short rounds, alternating which side goes first, so that both see the same disk: the
    figure is the median over rounds of (raw time / Terret time) in adjacent rounds."""
    raw = RawSQLite(workdir / "raw.db")
    terret = TerretAppends(workdir / "terret.db")
    try:
        time_per_append(raw, 0, 50)  # warm up both
        time_per_append(terret, 0, 50)
        raw_times: list[float] = []
        terret_times: list[float] = []
        for r in range(rounds):
            order = (raw, terret) if r % 2 == 0 else (terret, raw)
            for target in order:
                spent = time_per_append(target, 50 + r * per_round, per_round)
                (raw_times if target is raw else terret_times).append(spent)
        assert terret.store.stream_version(session_stream(terret.session.id)) == (
            1 + 50 + rounds * per_round
        )
    finally:
        raw.close()
        terret.close()
    raw_us = statistics.median(raw_times) * 1e6
    terret_us = statistics.median(terret_times) * 1e6
    ratios = [r / t for r, t in zip(raw_times, terret_times, strict=True)]
    print(f"raw sqlite3 insert (WAL, FULL): median {raw_us:8.1f} us/append "
          f"({1e6 / raw_us:7.0f}/s) over {rounds} rounds of {per_round}")
    print(f"Session + repo.save (SQLite):   median {terret_us:8.1f} us/append "
          f"({1e6 / terret_us:7.0f}/s)")
    print(f"ratio of the medians {raw_us / terret_us:.2f}; per-round ratios: quartiles "
          + ", ".join(f"{q:.2f}" for q in statistics.quantiles(ratios, n=4)))
    return statistics.median(ratios)


# --- (b) loading a long session ----------------------------------------------------------


def turn_records(turn: int) -> Iterator[NewRecord]:
    """One realistic turn: a user message, a step with a tool call, a final step."""
    yield encode(TurnStarted(turn=turn))
    yield encode(UserMessage(text=f"Turn {turn}: please look at the build logs " * 4))
    yield encode(StepStarted(turn=turn, step=1, model="openrouter:vendor/model"))
    yield encode(AssistantMessage(text="Let me read them.", tool_calls=[
        ToolCallData(id=f"call-{turn}", name="fs.read", args={"path": f"logs/{turn}.txt"}),
    ]))
    yield encode(ToolResult(call_id=f"call-{turn}", name="fs.read",
                            content="line of build output\n" * 40))
    yield encode(StepEnded(turn=turn, step=1,
                           usage=UsageData(prompt_tokens=1200 + turn, completion_tokens=40)))
    yield encode(StepStarted(turn=turn, step=2, model="openrouter:vendor/model"))
    yield encode(AssistantMessage(text="The build failed in the linker step. " * 5))
    yield encode(StepEnded(turn=turn, step=2,
                           usage=UsageData(prompt_tokens=1900 + turn, completion_tokens=90)))
    yield encode(TurnEnded(turn=turn, status="completed"))


def session_records(count: int) -> Iterator[NewRecord]:
    turn = 0
    produced = 0
    while True:
        turn += 1
        for record in turn_records(turn):
            if produced == count:
                return
            yield record
            produced += 1


def build_long_session(path: Path) -> uuid.UUID:
    """100,000 events appended in batches; a snapshot 199 events behind the head."""
    store = SQLiteStore(path, synchronous="OFF")  # building is not what is measured
    session = Session.start()
    repo = SessionRepository(store, snapshot_every=SNAPSHOT_EVERY)
    repo.save(session)
    stream = session_stream(session.id)
    began = time.perf_counter()
    version = 1
    batch: list[NewRecord] = []
    head = SESSION_EVENTS - 1 - TAIL
    for record in session_records(SESSION_EVENTS - 1):
        batch.append(record)
        if len(batch) == 5000 or version + len(batch) in (head + 1, SESSION_EVENTS):
            version = store.append(stream, batch, version).version
            batch = []
            if version == head + 1:
                replay_began = time.perf_counter()
                replayed = repo.get(session.id)  # no snapshot yet: replays, then writes one
                full_replay = time.perf_counter() - replay_began
                assert replayed.version == version
    assert not batch and version == SESSION_EVENTS
    snapshot = store.read_snapshot(stream)
    assert snapshot is not None and snapshot[0] == SESSION_EVENTS - TAIL
    store.close()
    print(f"built a {SESSION_EVENTS:,}-event session in {time.perf_counter() - began:.1f} s; "
          f"a load without any snapshot (full replay of {head + 1:,} events) took "
          f"{full_replay * 1000:.0f} ms")
    return session.id


def bench_load(workdir: Path, loads: int = 15) -> float:
    path = workdir / "long.db"
    session_id = build_long_session(path)
    cold: list[float] = []
    warm: list[float] = []
    warm_store = SQLiteStore(path)
    warm_repo = SessionRepository(warm_store, snapshot_every=SNAPSHOT_EVERY)
    try:
        for _ in range(loads):
            began = time.perf_counter()
            store = SQLiteStore(path)
            session = SessionRepository(store, snapshot_every=SNAPSHOT_EVERY).get(session_id)
            cold.append(time.perf_counter() - began)
            store.close()
            assert session.version == SESSION_EVENTS
            began = time.perf_counter()
            session = warm_repo.get(session_id)
            warm.append(time.perf_counter() - began)
            session.set_model("main", SPECS[0])  # ready for the next command
            assert len(session.pending_events) == 1
    finally:
        warm_store.close()
    cold_ms = statistics.median(cold) * 1000
    print(f"load of the {SESSION_EVENTS:,}-event session (snapshot + {TAIL} events): "
          f"median {cold_ms:.1f} ms with a newly opened store, "
          f"{statistics.median(warm) * 1000:.1f} ms on an open one ({loads} loads)")
    return cold_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=None, help="where to put the database files")
    parser.add_argument("--rounds", type=int, default=80)
    parser.add_argument("--per-round", type=int, default=50)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="terret-bench-", dir=args.dir))
    try:
        print(f"files in {workdir} (sqlite {sqlite3.sqlite_version})")
        ratio = bench_appends(workdir, args.rounds, args.per_round)
        load_ms = bench_load(workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"figure: append_vs_raw_sqlite = {ratio:.2f} x (target >= {TARGET_RATIO})")
    print(f"figure: load_100k_session_ms = {load_ms:.1f} ms (target <= {TARGET_LOAD_MS:.0f})")


if __name__ == "__main__":
    main()
