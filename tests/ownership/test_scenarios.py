"""One session, one executor (R28, R29), tried as a user would: ``terret serve`` workers as real
processes on one store, a tool that takes seconds and records every execution in a side file.
Each scenario runs on the SQLite store and on the EventStoreDB adapter (emulator)."""

from __future__ import annotations

import signal
import time
from collections import Counter
from uuid import UUID

import pytest

from terret import Actor
from tests.ownership.conftest import Pool, Worker, wait_until


def _owners(pool: Pool, sid: object) -> list[int]:
    """The pids of the successive owners, as the log records them."""
    return [data["pid"] for name, data in pool.log(sid) if name == "agent/attached"]  # type: ignore[arg-type]


def _starts(pool: Pool, call_id: str) -> list[int]:
    return [pid for what, c, pid in pool.executions() if what == "start" and c == call_id]


def _check_closed_once(pool: Pool, sid: object) -> None:
    names = pool.names(sid)  # type: ignore[arg-type]
    assert names.count("turn/start") == 1 and names.count("turn/end") == 1, names
    (end,) = [d for n, d in pool.log(sid) if n == "turn/end"]  # type: ignore[arg-type]
    assert end["status"] == "completed", end


def test_rolling_deploy_hands_the_turn_off_and_no_tool_runs_twice(pool: Pool) -> None:
    a = pool.serve("a", OWNERSHIP_TOOL_SECONDS="3")
    sid = pool.new_session()
    pool.runtime().inject(sid, "deploy", wake=True)
    wait_until(lambda: _starts(pool, "c-1"), "the tool to start in a", pool.stderr)
    b = pool.serve("b", OWNERSHIP_TOOL_SECONDS="3")  # the new release starts beside it
    time.sleep(1.0)
    assert _owners(pool, sid) == [a.pid]  # b leaves a session a live worker owns alone
    a.signal(signal.SIGTERM)  # a finishes the step it is in, then lets the session go
    assert a.wait(30) == 0, pool.stderr()
    log = pool.wait_for(sid, "turn/end")
    _check_closed_once(pool, sid)
    assert _owners(pool, sid) == [a.pid, b.pid]
    detached = [d for n, d in log if n == "agent/detached"]
    assert detached[0]["reason"] == "shutdown" and detached[0]["pid"] == a.pid
    assert "by" not in detached[0]  # released, not forced
    assert Counter(_starts(pool, "c-1")) == {a.pid: 1}  # it ran once, in a, and only there


def test_two_workers_and_one_wake_start_one_turn(pool: Pool) -> None:
    a = pool.serve("a", OWNERSHIP_TOOL_SECONDS="0.5")
    b = pool.serve("b", OWNERSHIP_TOOL_SECONDS="0.5")
    sessions = [pool.new_session() for _ in range(6)]
    for sid in sessions:
        pool.runtime().inject(sid, "go", wake=True)
    for sid in sessions:
        pool.wait_for(sid, "turn/end")
        _check_closed_once(pool, sid)
        assert len(_owners(pool, sid)) == 1
    starts = [pid for what, _, pid in pool.executions() if what == "start"]
    assert len(starts) == len(sessions)  # one execution per session, none twice
    assert set(starts) <= {a.pid, b.pid}


def _kill_the_owner_mid_tool(pool: Pool, *serve_args: str) -> tuple[Worker, Worker, UUID]:
    """Two workers, a woken turn whose tool takes seconds; its owner SIGKILLed mid-tool: the
    owner, the survivor and the session."""
    workers = {w.pid: w for w in (pool.serve("a", *serve_args, OWNERSHIP_TOOL_SECONDS="3"),
                                  pool.serve("b", *serve_args, OWNERSHIP_TOOL_SECONDS="3"))}
    sid = pool.new_session()
    pool.runtime().inject(sid, "go", wake=True)
    (first,) = wait_until(lambda: _starts(pool, "c-1"), "the tool to start", pool.stderr)
    owner = workers.pop(first)
    (survivor,) = workers.values()
    owner.signal(signal.SIGKILL)
    owner.wait(10)
    return owner, survivor, sid


def test_failover_after_the_owner_is_killed_resumes_the_turn(pool: Pool) -> None:
    owner, survivor, sid = _kill_the_owner_mid_tool(pool)
    log = pool.wait_for(sid, "turn/end", timeout=30)
    _check_closed_once(pool, sid)
    assert _owners(pool, sid) == [owner.pid, survivor.pid]
    (forced,) = [d for n, d in log if n == "agent/detached"]
    assert forced["pid"] == owner.pid and forced["by"]["actor"] == "supervisor"
    assert "expired" in forced["reason"]
    # At least once for the call the dead worker was executing: once more, by the survivor.
    assert Counter(_starts(pool, "c-1")) == {owner.pid: 1, survivor.pid: 1}


def test_runtime_owner_tells_a_running_turn_from_a_stalled_one(pool: Pool) -> None:
    """``resumable`` reads the log alone; ``owner`` adds whether the worker named is alive —
    what a web app shows as "working on it" versus "stalled, resume it"."""
    operator = pool.runtime()
    sid = pool.new_session()
    assert operator.owner(sid) is None  # never claimed
    worker = pool.serve("a", OWNERSHIP_TOOL_SECONDS="30")
    operator.inject(sid, "go", wake=True)
    wait_until(lambda: _starts(pool, "c-1"), "the tool to start", pool.stderr)
    running = operator.owner(sid)
    assert running is not None and running.live and running.pid == worker.pid
    assert running.worker and operator.resumable(sid)
    worker.signal(signal.SIGKILL)
    worker.wait(10)
    stalled = operator.owner(sid)  # on this host a dead process is seen at once
    assert stalled is not None and not stalled.live
    assert (stalled.worker, stalled.pid) == (running.worker, running.pid)
    assert operator.resumable(sid)
    survivor = pool.serve("b", OWNERSHIP_TOOL_SECONDS="0")
    pool.wait_for(sid, "turn/end")
    serving = operator.owner(sid)  # serve keeps the idle session: the next wake is its
    assert serving is not None and serving.live and serving.pid == survivor.pid
    survivor.signal(signal.SIGTERM)
    assert survivor.wait(30) == 0
    assert operator.owner(sid) is None  # a graceful stop lets it go
    assert _owners(pool, sid) == [worker.pid, survivor.pid]


def test_serve_compacts_at_start_what_a_stopped_worker_left_over_budget(pool: Pool) -> None:
    """A turn ended over the compaction budget by a worker that stopped before compacting (here
    one without the budget; a restart of the budgeted one is the same) is compacted when
    budgeted workers start — once, though two start side by side."""
    first = pool.serve("a", OWNERSHIP_TOOL_SECONDS="0", OWNERSHIP_USAGE="1")
    sid = pool.new_session()
    pool.runtime().inject(sid, "go", wake=True)
    pool.wait_for(sid, "turn/end")
    first.signal(signal.SIGTERM)
    assert first.wait(30) == 0
    assert "session/compacted" not in pool.names(sid)
    budgeted = {"OWNERSHIP_TOOL_SECONDS": "0", "OWNERSHIP_COMPACT_BUDGET": "50"}
    # A pool member follows only its own sessions (docs/runtime.md): the catch-up needs the
    # views of every session, as on SQLite.
    every_session = ("--no-group",) if pool.kind == "esdb" else ()
    pool.serve("b", *every_session, **budgeted)
    pool.serve("c", *every_session, **budgeted)
    pool.wait_for(sid, "session/compacted")
    time.sleep(2.0)  # the other worker's catch-up has run by now: it must not compact again
    assert pool.names(sid).count("session/compacted") == 1, pool.names(sid)


def test_a_worker_killed_in_its_upkeep_leaves_the_title_and_summary_to_a_survivor(
        pool: Pool) -> None:
    """The worker that ran a turn dies while its titler and summarizer work: a live worker
    does both once it sees the death — on EventStoreDB a pool member too, which follows only
    the sessions it serves and learns of this one from the dead worker's last beat (it did
    neither, for good)."""
    env = {"OWNERSHIP_TOOL_SECONDS": "0", "OWNERSHIP_USAGE": "1",
           "OWNERSHIP_COMPACT_BUDGET": "50", "OWNERSHIP_UPKEEP_SECONDS": "30"}
    first = pool.serve("a", **env)
    sid = pool.new_session()
    pool.runtime().inject(sid, "go", wake=True)
    pool.wait_for(sid, "turn/end")
    survivor = pool.serve("b", **{**env, "OWNERSHIP_UPKEEP_SECONDS": "0.2"})
    time.sleep(0.5)  # first is in its upkeep (30 s of it)
    assert "session/titled" not in pool.names(sid)
    first.signal(signal.SIGKILL)
    first.wait(10)
    log = pool.wait_for(sid, "session/compacted", timeout=30)
    log = pool.wait_for(sid, "session/titled", timeout=10)
    titles = [d for n, d in log if n == "session/titled"]
    summaries = [d for n, d in log if n == "session/compacted"]
    assert [t["title"] for t in titles] == [f"titled by {survivor.pid}"]
    assert len(summaries) == 1 and f"summarized by {survivor.pid}" in summaries[0]["summary"]
    assert _owners(pool, sid) == [first.pid]  # nothing was claimed for it: idle, it needs none


def test_a_session_closed_while_it_is_titled_is_not_titled_again_by_the_others(
        pool: Pool) -> None:
    """Closed while its owner's titler works: the title can never be recorded now (a closed
    session takes no title), so it stays undone for good — and every other worker, finding it
    undone in its turn, asked the titler again and paid for it. Only the request under way at
    the close is made (and paid for)."""
    titles = pool.tmp / "titles.txt"
    env = {"OWNERSHIP_TOOL_SECONDS": "0", "OWNERSHIP_UPKEEP_SECONDS": "1.5",
           "OWNERSHIP_TTL": "1", "OWNERSHIP_TITLES": str(titles)}
    # Every worker follows every session (on EventStoreDB too): each may do the upkeep.
    args = ("--no-group",) if pool.kind == "esdb" else ()
    workers = [pool.serve(name, *args, **env) for name in ("a", "b", "c")]
    sid = pool.new_session()
    operator = pool.runtime()
    operator.inject(sid, "go", wake=True)
    pool.wait_for(sid, "turn/end")
    wait_until(titles.exists, "the titler asked", pool.stderr)
    operator.close_session(sid, by=Actor(actor="operator"))
    time.sleep(10)  # the others' turns: two and four lease TTLs after the close, rechecked
    assert len(titles.read_text().split()) == 1, (titles.read_text(), pool.stderr())
    assert "session/titled" not in pool.names(sid)
    assert all(w.popen.poll() is None for w in workers)


def test_a_wake_on_a_session_held_by_a_runtime_that_serves_nothing_is_run_by_serve(
        pool: Pool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A web app's request worker (a runtime never started) ran a turn and holds the session,
    live: serve left every wake of it to that worker, which never hears of one — `terret
    inject --wake` did nothing for as long as the web worker lived. Now serve moves the idle
    session over and runs the turn; the web worker's next run_turn moves it back."""
    from terret import Runtime
    from tests.ownership.app import app

    monkeypatch.setenv("OWNERSHIP_RUNS", str(pool.runs))
    monkeypatch.setenv("OWNERSHIP_TOOL_SECONDS", "0")
    served = app()
    web = Runtime(pool.store, resolver=served.resolver, agents=served.agents,
                  config=served.config)  # never started: it serves nothing
    try:
        worker = pool.serve("a", OWNERSHIP_TOOL_SECONDS="0")
        sid = pool.new_session()
        assert web.run_turn(sid, "from the web").status == "completed"
        owner = web.owner(sid)
        assert owner is not None and owner.live and owner.pid != worker.pid
        pool.runtime().inject(sid, "from the shell", wake=True)
        log = pool.wait_for(sid, "turn/end", count=2, timeout=30)
        ends = [d for n, d in log if n == "turn/end"]
        assert [e["status"] for e in ends] == ["completed", "completed"]
        assert _owners(pool, sid)[-1] == worker.pid  # serve ran the woken turn
        assert web.run_turn(sid, "from the web again").status == "completed"  # moved back
        assert pool.names(sid).count("turn/end") == 3
    finally:
        web.close(grace=0)


def test_a_frozen_owner_loses_the_session_and_writes_nothing_when_it_wakes(pool: Pool) -> None:
    workers = {w.pid: w for w in (pool.serve("a", OWNERSHIP_TOOL_SECONDS="2"),
                                  pool.serve("b", OWNERSHIP_TOOL_SECONDS="2"))}
    sid = pool.new_session()
    pool.runtime().inject(sid, "go", wake=True)
    (first,) = wait_until(lambda: _starts(pool, "c-1"), "the tool to start", pool.stderr)
    zombie = workers.pop(first)
    (survivor,) = workers.values()
    zombie.signal(signal.SIGSTOP)  # frozen mid-tool, its process alive: only the TTL tells
    frozen_at = time.monotonic()
    pool.wait_for(sid, "turn/end", timeout=30)
    took = time.monotonic() - frozen_at
    # Between-turn upkeep (the title) is not an owner's write: any process may do it once.
    pool.wait_for(sid, "session/titled")
    _check_closed_once(pool, sid)
    assert _owners(pool, sid) == [zombie.pid, survivor.pid]
    assert took >= 3.0 - 0.5  # not before the zombie's lease (TTL 3 s) ran out
    settled = pool.log(sid)
    zombie.signal(signal.SIGCONT)
    time.sleep(3.0)  # its tool call finishes; it must notice and let go
    assert pool.log(sid) == settled  # nothing written by the zombie
    assert zombie.popen.poll() is None  # alive and well, just not serving that session
    assert _starts(pool, "c-1") == [zombie.pid, survivor.pid]  # no new execution by it
    # It serves again: a new session can go to either worker.
    other = pool.new_session()
    pool.runtime().inject(other, "again", wake=True)
    pool.wait_for(other, "turn/end")
    _check_closed_once(pool, other)


def test_an_idle_session_log_does_not_grow_while_workers_beat(pool: Pool) -> None:
    a = pool.serve("a", OWNERSHIP_TOOL_SECONDS="0.2")
    pool.serve("b", OWNERSHIP_TOOL_SECONDS="0.2")
    sid = pool.new_session()
    pool.runtime().inject(sid, "go", wake=True)
    pool.wait_for(sid, "session/titled")  # the last write after the turn: its title
    settled = pool.log(sid)
    time.sleep(4.0)  # more than a TTL of beats (every 0.6 s) from both workers
    assert pool.log(sid) == settled
    registry = pool.store.workers()
    beats = registry.beats()
    assert {b.pid for b in beats} == {w.pid for w in pool.workers}  # one entry per worker
    owner = next(b for b in beats if b.pid == _owners(pool, sid)[0])
    assert owner.sessions == (str(sid),)  # what it serves, for operators
    a.signal(signal.SIGTERM)
    assert a.wait(30) == 0
    assert a.pid not in {b.pid for b in registry.beats()}  # a stopped worker leaves at once


def test_a_turn_past_the_grace_keeps_its_session_until_the_lease_expires(pool: Pool) -> None:
    """SIGTERM with a tool still running past ``--grace``: the worker exits without releasing
    the session (its turn did not reach a step boundary) and leaves its last beat in place, so
    another worker takes the turn over as after a crash (on one host at once: its pid is gone)
    — on SQLite through its views, in a pool through the beat."""
    a = pool.serve("a", "--grace", "0.2", OWNERSHIP_TOOL_SECONDS="4")
    b = pool.serve("b", OWNERSHIP_TOOL_SECONDS="0.05")
    sid = pool.new_session()
    pool.runtime().inject(sid, "go", wake=True)
    wait_until(lambda: _starts(pool, "c-1"), "the tool to start", pool.stderr)
    (first,) = _starts(pool, "c-1")
    owner, other = (a, b) if first == a.pid else (b, a)
    if owner is b:
        pytest.skip("the wake went to the worker with the short tool")
    owner.signal(signal.SIGTERM)
    assert owner.wait(30) == 0, pool.stderr()
    said = "".join(owner.err)
    assert f"session {sid}: its turn did not stop within the grace" in said, said
    assert "a tool call still running may then run again" in said
    assert "agent/detached" not in pool.names(sid)  # not released: its turn was mid-tool
    pool.wait_for(sid, "turn/end", timeout=30)
    assert _owners(pool, sid) == [a.pid, other.pid]


def test_failover_goes_on_when_the_status_view_halted_on_an_event_it_cannot_read(
        pool: Pool) -> None:
    """The serving scan found turns to resume in the status view: one event no reader can
    decode (another client's) halted it, and from there no worker took over a killed owner's
    turn, nor resumed it at start — silently. The survivor takes it over from the dead
    worker's last beat, and says once that the view is halted."""
    from uuid import uuid4

    from terret.domain.store import NewRecord, session_stream

    bad = pool.new_session()
    stream = session_stream(bad)
    pool.store.append(stream, [NewRecord(uuid4(), "session/titled", b'{"title": 12345}',
                                         b'{"schema_version":1}')],
                      pool.store.stream_version(stream))
    owner, survivor, sid = _kill_the_owner_mid_tool(pool, "--no-group")
    pool.wait_for(sid, "turn/end", timeout=30)
    _check_closed_once(pool, sid)
    assert _owners(pool, sid) == [owner.pid, survivor.pid]
    assert "the status view is halted at position" in "".join(survivor.err)


def test_workers_started_together_title_each_untitled_session_once(
        pool: Pool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Sessions whose turns a runtime that does no upkeep ran (a web worker never started)
    are untitled; two serves started at the same moment catch that up — and each, having seen
    none of the other's beats, counted itself first and asked the titler for the same
    sessions (paid twice). The catch-up waits one beat interval: each asks for its own."""
    import threading

    from terret import Runtime
    from tests.ownership.app import app

    monkeypatch.setenv("OWNERSHIP_RUNS", str(pool.runs))
    monkeypatch.setenv("OWNERSHIP_TOOL_SECONDS", "0")
    titles = pool.tmp / "titles.txt"
    made = app()
    runtime = Runtime(pool.store, resolver=made.resolver, agents=made.agents,
                      config=made.config)  # never started: it does no upkeep
    sessions = [runtime.create_session() for _ in range(6)]
    for sid in sessions:
        assert runtime.run_turn(sid, "hello").status == "completed"
    runtime.close()
    assert not any("session/titled" in pool.names(sid) for sid in sessions)
    env = {"OWNERSHIP_TOOL_SECONDS": "0", "OWNERSHIP_UPKEEP_SECONDS": "1",
           "OWNERSHIP_TITLES": str(titles)}
    args = ("--no-group",) if pool.kind == "esdb" else ()  # both follow every session
    starting = [threading.Thread(target=pool.serve, args=(name, *args), kwargs=env)
                for name in ("a", "b")]
    for thread in starting:
        thread.start()
    for thread in starting:
        thread.join()
    for sid in sessions:
        pool.wait_for(sid, "session/titled", timeout=30)
    time.sleep(2.0)  # a second request for one of them would have begun by now
    asked = titles.read_text().split()
    assert len(asked) == len(sessions), (asked, pool.stderr())
