"""Chaos on one store (R28, R29): three ``terret serve`` workers, 30 sessions of multi-step
turns (tool calls, some asking for approval, given from this process), while the workers are
SIGKILLed and restarted, frozen (SIGSTOP past their lease) and continued, stopped with SIGTERM
and restarted. At the end every turn closed exactly once, no second ``turn/start``, every tool
result and model reply in a log written by the worker that owned the session at that point,
no tool execution twice except for a call whose executing worker was killed or frozen while it
ran (counted and printed), and every projection equal to a rebuild."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from typing import Any
from uuid import UUID

from terret import Actor
from tests.ownership.conftest import ROOT, Pool, Worker

SESSIONS = 30
CHAOS_SECONDS = 40.0
TTL = "2"
_OPERATOR = Actor(actor="operator", id="chaos")


def _serve(pool: Pool, n: int) -> Worker:
    return pool.serve(f"w{n}-{time.monotonic_ns()}", OWNERSHIP_TTL=TTL, OWNERSHIP_CALLS="2",
                      OWNERSHIP_TOOL_SECONDS="0.3")


def _approver(pool: Pool, sessions: list[UUID], stop: threading.Event) -> None:
    rt = pool.runtime()
    while not stop.is_set():
        for sid in sessions:
            for call_id in rt.pending(sid):
                try:
                    rt.approve(sid, call_id, by=_OPERATOR)
                except Exception:  # noqa: BLE001 - resolved meanwhile by a takeover's resume
                    pass
        stop.wait(0.2)


class _Chaos:
    """What was done to which pid, and when (monotonic), to judge duplicated executions."""

    def __init__(self) -> None:
        self.events: list[tuple[float, int, str]] = []

    def note(self, pid: int, what: str) -> None:
        self.events.append((time.monotonic(), pid, what))

    def disturbed(self, pid: int) -> bool:
        return any(p == pid and what in ("kill", "stop") for _, p, what in self.events)


def _run_chaos(pool: Pool, workers: list[Worker], chaos: _Chaos, rng: random.Random) -> None:
    deadline = time.monotonic() + CHAOS_SECONDS
    while time.monotonic() < deadline:
        time.sleep(rng.uniform(1.0, 3.0))
        i = rng.randrange(len(workers))
        victim = workers[i]
        action = rng.choice(["kill", "stop", "term"])
        chaos.note(victim.pid, action)
        if action == "kill":
            victim.signal(signal.SIGKILL)
            victim.wait(10)
            workers[i] = _serve(pool, i)
        elif action == "stop":
            victim.signal(signal.SIGSTOP)
            time.sleep(float(TTL) + rng.uniform(0.5, 1.5))
            victim.signal(signal.SIGCONT)
        else:
            victim.signal(signal.SIGTERM)
            assert victim.wait(60) == 0, pool.stderr()
            workers[i] = _serve(pool, i)


def _owner_at(log: list[tuple[str, dict[str, Any]]]) -> list[int | None]:
    owner: int | None = None
    out = []
    for name, data in log:
        if name == "agent/attached":
            owner = data["pid"]
        elif name == "agent/detached" and data.get("pid") == owner:
            owner = None
        out.append(owner)
    return out


def _check_log(pool: Pool, sid: UUID, turns: int, chaos: _Chaos) -> int:
    """The session's log after the chaos: every turn completed once, each call's result
    written once and by its owner; the number of calls that ran more than once (each only
    after the worker running it was killed or frozen)."""
    log = pool.log(sid)
    names = [n for n, _ in log]
    assert names.count("turn/start") == turns, (sid, names)
    ends = [d for n, d in log if n == "turn/end"]
    assert [e["turn"] for e in ends] == list(range(1, turns + 1)), (sid, names)
    assert {e["status"] for e in ends} == {"completed"}, (sid, ends)
    owners = _owner_at(log)
    for (name, data), owner in zip(log, owners, strict=True):
        # Nothing written by a worker after it lost its lease: every tool result and
        # reply names the pid that produced it, which must own the session there.
        text = data.get("content") if name == "tool/result" else data.get("text")
        if name in ("tool/result", "assistant/message") and " by " in (text or ""):
            assert int(str(text).rsplit(" ", 1)[1]) == owner, (sid, name, data, owner)
    results = Counter(d["call_id"] for n, d in log if n == "tool/result")
    assert set(results.values()) == {1}, (sid, results)
    starts: dict[str, list[int]] = defaultdict(list)
    for what, call_id, pid in pool.executions(sid):
        if what == "start":
            starts[call_id].append(pid)
    duplicated = 0
    for call_id, pids in starts.items():
        if len(pids) > 1:
            duplicated += len(pids) - 1
            # Only re-run after the worker executing it was killed or frozen meanwhile.
            assert all(chaos.disturbed(p) for p in pids[:-1]), (sid, call_id, pids, chaos)
    return duplicated


def test_chaos_three_workers_thirty_sessions(pool: Pool) -> None:
    rng = random.Random(20261201)
    workers = [_serve(pool, i) for i in range(3)]
    sessions = [pool.new_session() for _ in range(SESSIONS)]
    turns = {sid: 0 for sid in sessions}
    stop = threading.Event()
    approver = threading.Thread(target=_approver, args=(pool, sessions, stop), daemon=True)
    approver.start()
    chaos = _Chaos()
    rt = pool.runtime()
    for i, sid in enumerate(sessions):
        rt.inject(sid, "gated deploy" if i % 3 == 0 else "work please", wake=True)
        turns[sid] += 1
    chaos_thread = threading.Thread(target=_run_chaos, args=(pool, workers, chaos, rng),
                                    daemon=True)
    chaos_thread.start()
    # A second turn for some sessions while the chaos runs (once their first one closed).
    for sid in sessions[::4]:
        pool.wait_for(sid, "turn/end", timeout=120)
        rt.inject(sid, "and again", wake=True)
        turns[sid] += 1
    chaos_thread.join(CHAOS_SECONDS + 120)
    assert not chaos_thread.is_alive()
    for sid in sessions:
        pool.wait_for(sid, "turn/end", count=turns[sid], timeout=120)
    stop.set()

    duplicated = sum(_check_log(pool, sid, turns[sid], chaos) for sid in sessions)
    print(f"chaos on {pool.kind}: {len(chaos.events)} disturbances "
          f"{dict(Counter(w for _, _, w in chaos.events))}; {duplicated} re-run calls, each "
          "after its executing worker was killed or frozen")

    for worker in workers:
        worker.signal(signal.SIGTERM)
        assert worker.wait(60) == 0, pool.stderr()
    verify = subprocess.run(
        [sys.executable, "-m", "terret", "--store", pool.uri, "--views",
         str(pool.tmp / "verify-views.db"), "projections", "verify"],
        cwd=ROOT, env=pool.env, capture_output=True, text=True, timeout=300)
    assert verify.returncode == 0, verify.stdout + verify.stderr
