"""Helpers for the lifecycle lane: sessions, the log's invariants, processes."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any
from uuid import UUID

from terret import Runtime, StaticResolver
from terret.domain.store import EventStore
from tests.runtime.kit import REPO, Ev, only, read_log


def new_session(store: EventStore) -> UUID:
    rt = Runtime(store, resolver=StaticResolver())
    try:
        return rt.create_session()
    finally:
        rt.close()


def python_module(module: str, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-m", module, *args], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_line(proc: subprocess.Popen[str], expected: str, timeout: float = 30.0) -> None:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.05)
        if ready:
            line = proc.stdout.readline()
            if line.strip() == expected:
                return
            if not line and proc.poll() is not None:
                break
    stderr = proc.stderr.read() if proc.poll() is not None and proc.stderr else ""
    raise AssertionError(f"the child never printed {expected!r}: {stderr}")


def kill9_after(proc: subprocess.Popen[str], line: str) -> None:
    """Wait for the child to print ``line``, then SIGKILL it (no cleanup runs in it)."""
    try:
        wait_for_line(proc, line)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(30) == -signal.SIGKILL
        for pipe in (proc.stdout, proc.stderr):
            assert pipe is not None
            pipe.close()


def check_invariants(log: list[Ev]) -> None:
    """What every log must hold however its processes died: one turn/start per turn, at most
    one turn/end per turn, every tool call answered by exactly one tool/result, every event id
    unique."""
    starts = Counter(e.data["turn"] for e in only(log, "turn/start"))
    ends = Counter(e.data["turn"] for e in only(log, "turn/end"))
    assert all(n == 1 for n in starts.values()), f"turn/start per turn: {starts}"
    assert all(n <= 1 for n in ends.values()), f"turn/end per turn: {ends}"
    assert set(ends) <= set(starts)
    called = [c["id"] for e in only(log, "assistant/message") for c in e.data["tool_calls"]]
    answered = Counter(e.data["call_id"] for e in only(log, "tool/result"))
    assert Counter(called) == answered, f"calls {called} vs results {answered}"
    ids = [e.event_id for e in log]
    assert len(set(ids)) == len(ids), "an event was written twice"
    assert [e.seq for e in log] == list(range(1, len(log) + 1))


def read_report(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


__all__ = ["check_invariants", "kill9_after", "new_session", "python_module", "read_log",
           "read_report", "wait_for_line"]
