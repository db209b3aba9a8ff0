"""Benchmark: the turn loop's own cost.

Three figures:

* ``step_framework_ms`` — the framework time of one step: a scripted model (no model time), a
  no-op tool, the SQLite file store with ``synchronous=FULL`` (every append durable). Measured
  from the model's side: the time from one model reply to the next model request of the same
  turn, minus the time spent inside the tool. That interval is one whole step of framework
  work: append the assistant message, run the tools pipeline (arguments, pre-execute waterfall,
  allow-list, gate), append the tool result and ``step/end``, check cancellation and pre-step
  hooks, append ``step/start`` with the inbox, build what the model sees (the messages view, or
  the previous request plus the agent's own appends) and the request. Median over every step of
  every measured turn (turns of ten steps) on sessions with about 100 events of history.
* ``step_100k_vs_100`` — the same median on a session with 100,000 events of history behind a
  compaction, divided by the median at 100 events. Turns alternate between the kinds of
  session so that machine noise hits them alike; the like-for-like ratio (against sessions of
  100 events that are behind a compaction too) is printed beside it.
* ``parked_128_rss_mb`` — the resident memory (``VmRSS``) of a process serving 128 sessions
  whose turns are all parked on an approval, each session with 2,000 events of history; the
  same with 100 events is printed beside it (it must not grow with history). Views are kept in
  a file, as a serving process keeps them; each measurement runs in a fresh process.

    .venv/bin/python bench/loop.py [--turns 30] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any
from uuid import UUID

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pydantic import BaseModel  # noqa: E402

from terret import (  # noqa: E402
    Actor,
    AgentDefinition,
    CallContext,
    FixedSummarizer,
    Runtime,
    RuntimeConfig,
    Session,
    SessionRepository,
    ToolCall,
    Usage,
    tool,
)
from terret.adapters.stores import SQLiteStore  # noqa: E402
from terret.domain.events import ToolCallData, UsageData  # noqa: E402
from terret.runtime import ModelReply, ModelRequest, StaticResolver  # noqa: E402

STEPS_PER_TURN = 10
PARKED = 128


# --- the model and the tool ------------------------------------------------------------------


class TimedModel:
    """A scripted model: nine steps that call ``noop``, then an answer. It notes when each
    request arrives and each reply leaves, and keeps no request."""

    name = "scripted"

    def __init__(self) -> None:
        self.mark: list[tuple[float, float]] | None = None

    def complete(self, request: ModelRequest, **_: Any) -> ModelReply:
        arrived = time.perf_counter()
        messages = list(request.messages)
        start = max(i for i, m in enumerate(messages)
                    if m.role == "user" and m.text.startswith("go"))
        done = sum(1 for m in messages[start:] if m.role == "assistant")
        if done < STEPS_PER_TURN - 1:
            reply = ModelReply(tool_calls=(ToolCall(f"n-{done}", "noop", {}),),
                               usage=Usage(1000, 10, 0.0001))
        else:
            reply = ModelReply(text="done", usage=Usage(1000, 10, 0.0001))
        if self.mark is not None:
            self.mark.append((arrived, time.perf_counter()))
        return reply


class NoArgs(BaseModel):
    pass


TOOL_TIME: list[float] = []


@tool(args=NoArgs)
def noop(args: NoArgs, ctx: CallContext) -> str:
    """Does nothing."""
    started = time.perf_counter()
    TOOL_TIME.append(time.perf_counter() - started)
    return "ok"


@tool(args=NoArgs, approval="always")
def deploy(args: NoArgs, ctx: CallContext) -> str:
    """Needs a human."""
    return "deployed"


def definition() -> AgentDefinition:
    return AgentDefinition(tools=[noop, deploy], allow=["*"])


# --- history in bulk ----------------------------------------------------------------------------


def build_history(store: SQLiteStore, session_id: UUID | None, events: int) -> UUID:
    """Append about ``events`` events of realistic turns (ten events each: a user message, a
    step with a tool call and its result, a final step, usage on every step/end) through the
    aggregate, in large batches."""
    repository = SessionRepository(store)
    session = Session.start(session_id, roles={"main": "scripted:default"}, policy_floor=["*"])
    session.title("a session with history")
    usage = UsageData(prompt_tokens=900, completion_tokens=40, cost=0.0001)
    turn = 0
    while session.version + 10 <= events or turn == 0:
        turn += 1
        session.start_turn(text=f"question {turn}")
        session.start_step("scripted:default")
        session.record_assistant("", [ToolCallData(id=f"h-{turn}", name="noop", args={})])
        session.record_tool_result(f"h-{turn}", "noop", "ok")
        session.end_step(usage)
        session.start_step("scripted:default")
        session.record_assistant(f"answer {turn}")
        session.end_step(usage)
        session.end_turn("completed")
        if len(session.pending_events) >= 5000:
            repository.save(session)
    repository.save(session)
    return session.id


# --- step timing -------------------------------------------------------------------------------


def step_times(model: TimedModel, rt: Runtime, session_id: UUID) -> list[float]:
    """Run one measured turn; the framework time of each step after the first."""
    marks: list[tuple[float, float]] = []
    model.mark = marks
    TOOL_TIME.clear()
    result = rt.run_turn(session_id, "go: ten steps")
    model.mark = None
    assert result.status == "completed", result
    assert len(marks) == STEPS_PER_TURN, len(marks)
    gaps = [marks[i][0] - marks[i - 1][1] for i in range(1, len(marks))]
    return [gap - tool for gap, tool in zip(gaps, TOOL_TIME, strict=True)]


def measure_steps(directory: Path, turns: int, history: int) -> tuple[float, float, int]:
    store = SQLiteStore(directory / "steps.db")  # synchronous=FULL: every append is durable
    big = build_history(store, None, history)
    small_sessions = [build_history(store, None, 100) for _ in range(turns + 2)]
    twins = [build_history(store, None, 100) for _ in range(turns + 2)]
    model = TimedModel()
    summarizer = FixedSummarizer(limit=2000)
    rt = Runtime(store, resolver=StaticResolver({"scripted": model}), agents=[definition()],
                 summarizer=summarizer, config=RuntimeConfig(wait_timeout=120))
    caught = time.perf_counter()
    rt.start()
    rt.catch_up_views()
    caught = time.perf_counter() - caught
    rt.compact(big)  # the 100,000 events are now behind a compaction
    for twin in twins:  # 100 events behind a compaction too: the like-for-like comparison
        rt.compact(twin)
    small: list[float] = []
    large: list[float] = []
    alike: list[float] = []
    for i in range(turns + 2):
        s = step_times(model, rt, small_sessions[i])
        b = step_times(model, rt, big)
        t = step_times(model, rt, twins[i])
        rt.compact(big)  # keep what the model sees of the big session short
        if i >= 2:  # warm-up
            small.extend(s)
            large.extend(b)
            alike.extend(t)
    events = store.stream_version(f"session-{big}")
    rt.close()
    store.close()
    print(f"views caught up with {history:,} events of history in {caught:.1f} s")
    print(f"steps measured: {len(small)} at ~100 events, {len(large)} at {events:,} events "
          f"behind a compaction, {len(alike)} at ~100 events behind a compaction")
    for name, values in (("~100 events", small),
                         (f"{events:,} events behind a compaction", large),
                         ("~100 events behind a compaction", alike)):
        q = statistics.quantiles(values, n=4)
        print(f"  {name}: median {statistics.median(values) * 1000:.3f} ms, "
              f"quartiles {q[0] * 1000:.3f} / {q[2] * 1000:.3f} ms")
    print(f"like for like, both behind a compaction: {events:,} vs ~100 events = "
          f"{statistics.median(large) / statistics.median(alike):.2f} x")
    return statistics.median(small), statistics.median(large), events


# --- parked agents ------------------------------------------------------------------------------


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def build_parked(directory: Path, history: int) -> None:
    """Child process: 128 sessions with ``history`` events each, views caught up in a file."""
    store = SQLiteStore(directory / "parked.db", synchronous="OFF")
    sessions = [str(build_history(store, None, history)) for _ in range(PARKED)]
    rt = Runtime(store, resolver=StaticResolver(), views=str(directory / "views.db"))
    rt.runner.catch_up()
    rt.close()
    store.close()
    (directory / "sessions.json").write_text(json.dumps(sessions))


def measure_parked(directory: Path) -> None:
    """Child process: serve the 128 sessions, park every one on an approval, report RSS."""
    sessions = [UUID(s) for s in json.loads((directory / "sessions.json").read_text())]
    model = ParkingModel()
    store = SQLiteStore(directory / "parked.db")
    rt = Runtime(store, resolver=StaticResolver({"scripted": model}), agents=[definition()],
                 views=str(directory / "views.db"),
                 config=RuntimeConfig(max_agents=PARKED, wait_timeout=120)).start()
    before = rss_mb()
    for sid in sessions:
        agent = rt.spawn_agent(sid)
        agent.start_in_background(partial(agent.run_turn, "deploy it"))
    deadline = time.monotonic() + 300
    while sum(a.status == "waiting_approval" for a in rt.agents) < PARKED:
        if time.monotonic() > deadline:
            raise SystemExit("the turns did not all park")
        time.sleep(0.05)
    parked = rss_mb()
    print(json.dumps({"before": before, "parked": parked,
                      "threads": threading.active_count()}), flush=True)
    for sid in sessions:
        rt.cancel(sid, by=Actor(actor="operator"))
    rt.close()
    store.close()


class ParkingModel:
    name = "scripted"

    def complete(self, request: ModelRequest, **_: Any) -> ModelReply:
        return ModelReply(tool_calls=(ToolCall("d-1", "deploy", {}),))


def parked_rss(base: Path, history: int) -> dict[str, float]:
    directory = base / f"parked-{history}"
    directory.mkdir()
    me = [sys.executable, __file__, "--dir", str(directory)]
    subprocess.run([*me, "--build-parked", str(history)], check=True)
    out = subprocess.run([*me, "--measure-parked"], check=True, capture_output=True, text=True)
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("{")][-1]
    return json.loads(line)


# --- main ---------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=30)
    parser.add_argument("--history", type=int, default=100_000)
    parser.add_argument("--dir", default=None)
    parser.add_argument("--build-parked", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--measure-parked", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.build_parked is not None:
        build_parked(Path(args.dir), args.build_parked)
        return
    if args.measure_parked:
        measure_parked(Path(args.dir))
        return

    base = Path(tempfile.mkdtemp(prefix="terret-bench-loop-", dir=args.dir))
    try:
        small, large, events = measure_steps(base, args.turns, args.history)
        rss = {h: parked_rss(base, h) for h in (100, 2000)}
    finally:
        shutil.rmtree(base, ignore_errors=True)
    for history, figures in rss.items():
        print(f"128 parked agents, {history:,} events of history each: "
              f"{figures['parked']:.1f} MB resident ({figures['before']:.1f} MB before the "
              f"turns started, {figures['threads']} threads)")
    print(f"figure: step_framework_ms = {small * 1000:.3f} ms (target <= 2)")
    print(f"figure: step_100k_vs_100 = {large / small:.2f} x (target <= 1.2)")
    print(f"figure: parked_128_rss_mb = {rss[2000]['parked']:.1f} MB (target <= 150)")


if __name__ == "__main__":
    main()
