"""Projection figures.

(1) ``rebuild_events_per_s``: every default projection rebuilt from scratch over 100,000 events
    (100 sessions of 1,000 events, interleaved turn by turn; a realistic mix: turns of a user
    message, a step with a tool call and its result, a final step, usage on every ``step/end``;
    approvals requested and resolved, titles, compactions now and then). SQLite store → a new
    SQLite views file: a ``ProjectionRunner`` over ``default_projections()`` catching up from
    position 0. Printed beside it: the rate of a bare read-and-decode of the same events
    (``store.read_all`` pages and ``terret.domain.codec.decode``), the floor under any
    projection work.
(2) ``messages_read_100k_vs_1k``: ``Views.messages`` — what the loop reads for its next model
    request — for a session whose log holds 100,000 events with a compaction 1,000 events before
    its head, against a session of 1,000 events that was never compacted; medians over many
    reads, alternating. Both read the same number of messages (the big one's plus one summary).

The two figures are printed last, in this order. Usage: ``python bench/projections.py
[--dir DIR] [--reads N]``; the database files go to a temporary directory under DIR (default:
the system's temporary directory), which is removed afterwards.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from terret.adapters.stores.sqlite import SQLiteStore
from terret.domain.catalogue import EventPayload
from terret.domain.codec import decode, encode
from terret.domain.events import (
    Actor,
    ApprovalRequested,
    ApprovalResolved,
    AssistantMessage,
    SessionCompacted,
    SessionStarted,
    SessionTitled,
    StepEnded,
    StepStarted,
    ToolCallData,
    ToolResult,
    TurnEnded,
    TurnStarted,
    UsageData,
    UserMessage,
)
from terret.domain.store import NewRecord, StreamState, session_stream
from terret.projections import ProjectionRunner, Views, ViewStore, default_projections

TARGET_RATE = 50_000
TARGET_RATIO = 1.2
SESSIONS = 100
EVENTS_PER_SESSION = 1_000
BIG_SESSION = 100_000
SMALL_SESSION = 1_000
MODEL = "openrouter:vendor/model"
OPERATOR = Actor(actor="operator", id="ops")


def turn_payloads(turn: int) -> Iterator[EventPayload]:
    """One realistic turn (10 events; 12 with an approval every fifth turn)."""
    call = f"call-{turn}"
    yield TurnStarted(turn=turn)
    yield UserMessage(text=f"Turn {turn}: please look at the build logs and fix the failure.")
    yield StepStarted(turn=turn, step=1, model=MODEL)
    yield AssistantMessage(text="Let me read them.", tool_calls=[
        ToolCallData(id=call, name="fs.read", args={"path": f"logs/{turn}.txt"})])
    if turn % 5 == 0:
        yield ApprovalRequested(call_id=call, name="fs.read", args={"path": f"logs/{turn}.txt"})
        yield ApprovalResolved(call_id=call, verdict="approved", by=OPERATOR)
    yield ToolResult(call_id=call, name="fs.read", content="line of build output\n" * 20)
    yield StepEnded(turn=turn, step=1,
                    usage=UsageData(prompt_tokens=1200 + turn, completion_tokens=40, cost=0.002))
    yield StepStarted(turn=turn, step=2, model=MODEL)
    yield AssistantMessage(text="The build failed in the linker step; here is the fix.")
    yield StepEnded(turn=turn, step=2,
                    usage=UsageData(prompt_tokens=1900 + turn, completion_tokens=90, cost=0.003))
    yield TurnEnded(turn=turn, status="completed")


class SessionLog:
    """Produces a session's records turn by turn, with a title after the first turn and a
    compaction every ``compact_every`` turns (0: never)."""

    def __init__(self, compact_every: int = 30) -> None:
        self.id = uuid.uuid4()
        self.stream = session_stream(self.id)
        self.version = 0
        self.turn = 0
        self.compact_every = compact_every

    def start(self) -> list[NewRecord]:
        return self._encode([SessionStarted(agent="bench", roles={"main": MODEL})])

    def next_turn(self) -> list[NewRecord]:
        self.turn += 1
        payloads: list[EventPayload] = list(turn_payloads(self.turn))
        if self.turn == 1:
            payloads.append(SessionTitled(title="Fix the linker failure"))
        if self.compact_every and self.turn % self.compact_every == 0:
            payloads.append(self.compaction(len(payloads)))
        return self._encode(payloads)

    def compaction(self, before: int = 0) -> SessionCompacted:
        return SessionCompacted(upto_seq=self.version + before,
                                summary=f"Summary of turns 1-{self.turn}: the build was fixed.")

    def _encode(self, payloads: list[EventPayload]) -> list[NewRecord]:
        self.version += len(payloads)
        return [encode(p) for p in payloads]


def append(store: SQLiteStore, log: SessionLog, records: list[NewRecord]) -> None:
    expected = log.version - len(records)
    store.append(log.stream, records, expected if expected else StreamState.NO_STREAM)


def _limited(log: SessionLog, limit: int) -> list[NewRecord]:
    """The next turn, cut so that the session ends at exactly ``limit`` events."""
    before = log.version
    records = log.next_turn()
    keep = min(len(records), limit - before)
    log.version = before + keep
    return records[:keep]


def build_sessions(path: Path) -> int:
    store = SQLiteStore(path, synchronous="OFF")
    logs = [SessionLog() for _ in range(SESSIONS)]
    for log in logs:
        append(store, log, log.start())
    live = list(logs)
    while live:
        for log in list(live):
            records = _limited(log, EVENTS_PER_SESSION)
            if records:
                append(store, log, records)
            if log.version >= EVENTS_PER_SESSION:
                live.remove(log)
    head = store.head_position()
    store.close()
    return head


def read_and_decode(path: Path) -> tuple[int, float]:
    store = SQLiteStore(path)
    began = time.perf_counter()
    after = count = 0
    while True:
        page = store.read_all(after=after, limit=1000)
        if not page:
            break
        for record in page:
            decode(record)
        count += len(page)
        after = page[-1].position
    spent = time.perf_counter() - began
    store.close()
    return count, spent


def rebuild(path: Path, views_path: Path) -> tuple[int, float, ViewStore]:
    store = SQLiteStore(path)
    views = ViewStore(str(views_path))
    runner = ProjectionRunner(store, views, default_projections())
    began = time.perf_counter()
    head = runner.catch_up()
    spent = time.perf_counter() - began
    assert all(s.fault is None and s.position == head for s in runner.states())
    store.close()
    return head, spent, views


def bench_rebuild(workdir: Path) -> float:
    path = workdir / "events.db"
    began = time.perf_counter()
    head = build_sessions(path)
    print(f"built {head} events in {SESSIONS} sessions in {time.perf_counter() - began:.1f} s")
    assert head == SESSIONS * EVENTS_PER_SESSION
    read_and_decode(path)  # warm the page cache for both measurements
    count, bare = read_and_decode(path)
    assert count == head
    rates = []
    bare_rates = [count / bare]
    for attempt in range(3):
        views_path = workdir / f"views-{attempt}.db"
        done, spent, views = rebuild(path, views_path)
        views.close()
        rates.append(done / spent)
        _, bare = read_and_decode(path)
        bare_rates.append(count / bare)
    rate = statistics.median(rates)
    bare_rate = statistics.median(bare_rates)
    print(f"bare read_all + decode:          {bare_rate:9.0f} events/s "
          f"({1e6 / bare_rate:5.1f} us/event)")
    print(f"rebuild of {len(default_projections())} projections:        {rate:9.0f} events/s "
          f"({1e6 / rate:5.1f} us/event; runs: "
          + ", ".join(f"{r:.0f}" for r in rates) + ")")
    return rate


def build_one(path: Path, events: int, compact_tail: int | None) -> uuid.UUID:
    """One session of ``events`` events (its last turn left open, cut at the head); with
    ``compact_tail``, compactions every 30 turns and one at the first turn boundary at least
    ``compact_tail`` events before the head."""
    store = SQLiteStore(path, synchronous="OFF")
    log = SessionLog(compact_every=30 if compact_tail else 0)
    append(store, log, log.start())
    pending: list[NewRecord] = []
    written = log.version
    compact_at = None if compact_tail is None else events - compact_tail - 1
    compacted = compact_at is None
    while log.version < events:
        if not compacted and compact_at is not None and log.version >= compact_at:
            pending.append(encode(log.compaction()))
            log.version += 1
            log.compact_every = 0  # the last compaction: the next request reads what follows
            compacted = True
            continue
        pending.extend(_limited(log, events))
        if len(pending) >= 5000 or log.version >= events:
            store.append(log.stream, pending, written)
            pending, written = [], log.version
    assert store.stream_version(log.stream) == events
    store.close()
    return log.id


def bench_messages(workdir: Path, reads: int) -> float:
    path = workdir / "sessions.db"
    big = build_one(path, BIG_SESSION, compact_tail=SMALL_SESSION)
    small = build_one(path, SMALL_SESSION, compact_tail=None)
    store = SQLiteStore(path)
    view_store = ViewStore(str(workdir / "sessions-views.db"))
    ProjectionRunner(store, view_store, default_projections()).catch_up()
    views = Views(view_store)
    big_messages, small_messages = views.messages(big), views.messages(small)
    print(f"messages read: {len(big_messages)} for the {BIG_SESSION}-event session "
          f"(compacted {SMALL_SESSION} events before its head), {len(small_messages)} for the "
          f"{SMALL_SESSION}-event session")
    big_times: list[float] = []
    small_times: list[float] = []
    for i in range(reads):
        order = (big, small) if i % 2 == 0 else (small, big)
        for session in order:
            began = time.perf_counter()
            views.messages(session)
            (big_times if session == big else small_times).append(time.perf_counter() - began)
    view_store.close()
    store.close()
    big_ms = statistics.median(big_times) * 1e3
    small_ms = statistics.median(small_times) * 1e3
    print(f"Views.messages median: {big_ms:.3f} ms ({BIG_SESSION} events) vs "
          f"{small_ms:.3f} ms ({SMALL_SESSION} events) over {reads} reads each")
    return big_ms / small_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", default=None)
    parser.add_argument("--reads", type=int, default=400)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="terret-bench-projections-", dir=args.dir))
    try:
        rate = bench_rebuild(workdir)
        ratio = bench_messages(workdir, args.reads)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"figure: rebuild_events_per_s = {rate:.0f} events/s (target >= {TARGET_RATE})")
    print(f"figure: messages_read_100k_vs_1k = {ratio:.2f} x (target <= {TARGET_RATIO})")


if __name__ == "__main__":
    main()
