"""Issue 14 with real ``terret serve`` workers: a tool that may not run twice is killed with
SIGKILL mid-handler; the worker that takes the turn over never re-runs it on its own, it parks
on it (in doubt) until an operator in another process decides — re-run it (once more, with the
same idempotency key) or record it as not re-run (the model sees an error result). Usage counts
every model call whose reply is in the log, once. On SQLite and the EventStoreDB emulator."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from typing import Any

import pytest

from terret import Actor
from tests.ownership.conftest import ROOT, Pool, wait_until

OPERATOR = Actor(actor="operator", id="ownership-tests")
ENV = {"OWNERSHIP_IDEMPOTENT": "0", "OWNERSHIP_USAGE": "1", "OWNERSHIP_TOOL_SECONDS": "30"}


def _starts(pool: Pool, call_id: str) -> list[int]:
    return [pid for what, c, pid in pool.executions() if what == "start" and c == call_id]


def _killed_mid_handler(pool: Pool) -> tuple[Any, Any, list[str]]:
    """Worker a runs ``work`` (it sleeps 30 s) and is killed inside it; worker b starts and
    takes the turn over. Returns the session, b, and the keys file's path."""
    keys = pool.tmp / "keys.txt"
    env = {**ENV, "OWNERSHIP_KEYS": str(keys)}
    a = pool.serve("a", **env)
    sid = pool.new_session()
    pool.runtime().inject(sid, "pay", wake=True)
    wait_until(lambda: _starts(pool, "c-1"), "the handler to start in a", pool.stderr)
    assert pool.names(sid)[-1] == "tool/started"  # durable before the handler ran
    a.signal(signal.SIGKILL)
    a.wait(10)
    b = pool.serve("b", **env)
    pool.wait_for(sid, "tool/in_doubt")
    return sid, b, [str(keys)]


def _check_usage(pool: Pool, sid: Any, replies: int) -> None:
    log = pool.log(sid)
    metered = [d for n, d in log if n == "assistant/message"]
    assert len(metered) == replies and all(d["usage"] == {
        "prompt_tokens": 100, "completion_tokens": 10, "cost": 0.01} for d in metered)
    usage = pool.runtime().usage(sid)
    assert {**usage, "cost": round(usage["cost"], 9)} == {
        "prompt_tokens": 100 * replies, "completion_tokens": 10 * replies,
        "cost": round(0.01 * replies, 9), "steps": replies}


@pytest.mark.timeout(180)
def test_a_call_in_doubt_after_sigkill_parks_and_reruns_on_an_operators_verdict(
        pool: Pool) -> None:
    sid, b, (keys,) = _killed_mid_handler(pool)
    rt = pool.runtime()
    wait_until(lambda: rt.in_doubt(sid) == ["c-1"], "the call in doubt", pool.stderr)
    rt.catch_up_views()
    status = rt.views.status(sid)
    assert status is not None and status.status == "waiting_in_doubt"
    assert len(_starts(pool, "c-1")) == 1  # b did not run it again on its own
    _check_usage(pool, sid, 1)  # the reply whose call was killed is counted
    rt.rerun(sid, "c-1", by=OPERATOR, reason="the bank shows no charge")
    pool.wait_for(sid, "tool/result", timeout=60)
    log = pool.wait_for(sid, "turn/end", timeout=60)
    assert _starts(pool, "c-1") == [pool.workers[0].pid, b.pid]  # once more, in b
    lines = open(keys).read().split()
    assert lines[0] == lines[2] == "c-1" and lines[1] == lines[3]  # the same key both times
    names = [n for n, _ in log]
    assert names.count("tool/started") == 2 and names.count("tool/in_doubt") == 1
    (verdict,) = [d for n, d in log if n == "tool/in_doubt_resolved"]
    assert verdict["verdict"] == "rerun" and verdict["by"]["id"] == "ownership-tests"
    _check_usage(pool, sid, 2)


@pytest.mark.timeout(180)
def test_a_call_in_doubt_after_sigkill_recorded_as_not_rerun_shows_the_model_an_error(
        pool: Pool) -> None:
    sid, _, _ = _killed_mid_handler(pool)
    rt = pool.runtime()
    wait_until(lambda: rt.in_doubt(sid) == ["c-1"], "the call in doubt", pool.stderr)
    rt.skip(sid, "c-1", by=OPERATOR, reason="charged already")
    log = pool.wait_for(sid, "turn/end", timeout=60)
    assert len(_starts(pool, "c-1")) == 1  # never ran again
    (result,) = [d for n, d in log if n == "tool/result"]
    assert result["is_error"] and "not run again" in result["content"]
    (end,) = [d for n, d in log if n == "turn/end"]
    assert end["status"] == "completed"
    _check_usage(pool, sid, 2)


def _cli(pool: Pool, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "terret", "--store", pool.uri,
                           "--views", str(pool.tmp / "views-cli.db"), *args],
                          cwd=ROOT, env=pool.env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.timeout(180)
def test_a_process_whose_app_lacks_the_owed_tool_refuses_the_turn_and_writes_nothing(
        pool: Pool) -> None:
    """Both apps define an agent named ``default``: the CLI's own app (no --app) must not take
    a turn that owes a call to ``work`` — it would answer "unknown tool", and a call an
    operator re-ran would silently never run. Refused in one line, nothing written; the
    app that defines the tool then parks it in doubt as usual."""
    keys = pool.tmp / "keys.txt"
    env = {**ENV, "OWNERSHIP_KEYS": str(keys), "OWNERSHIP_TTL": "1"}
    a = pool.serve("a", **env)
    sid = pool.new_session()
    pool.runtime().inject(sid, "pay", wake=True)
    wait_until(lambda: _starts(pool, "c-1"), "the handler to start in a", pool.stderr)
    a.signal(signal.SIGKILL)
    a.wait(10)
    early = _cli(pool, "in-doubt", "rerun", str(sid), "c-1")  # before any process took over
    assert early.returncode == 1 and "CallNotInDoubt" in early.stderr
    assert "not in doubt yet" in early.stderr and "terret resume" in early.stderr, early.stderr
    before = pool.names(sid)
    time.sleep(1.5)  # a's lease has expired: the turn is resumable by anyone
    resumed = _cli(pool, "resume", str(sid))
    assert resumed.returncode == 1, resumed
    (line,) = resumed.stderr.splitlines()
    assert line.startswith("Error: ConfigurationError: ") and "'work'" in line
    assert "--app" in line
    # A serving process without the app says so once and leaves the session alone.
    other = pool.serve("default-app", "--app", "terret.cli._app:default_app")
    wait_until(lambda: any(f"not serving session {sid}" in x for x in other.err),
               "the refusal", pool.stderr)
    assert pool.names(sid) == before
    b = pool.serve("b", **env)
    pool.wait_for(sid, "tool/in_doubt")
    assert b.popen.poll() is None and len(_starts(pool, "c-1")) == 1
