"""A pool of ``terret serve`` workers on EventStoreDB: the consumer group spreads the sessions,
and each member receives its own sessions' events only (docs/operations.md, "How sessions
spread")."""

from __future__ import annotations

import signal
import time
from uuid import UUID

import pytest

from terret.domain.store import session_stream
from tests.ownership.conftest import Pool, wait_until
from tests.ownership.test_scenarios import _check_closed_once, _owners

SESSIONS = 12


def _traced(pool: Pool) -> None:
    if pool.kind == "sqlite":
        pytest.skip("on SQLite every worker reads the one file: no group, no filter")
    if pool.emulator is None:
        pytest.skip("the delivery traces are the emulator's")


def _run_all(pool: Pool, count: int) -> dict[str, int]:
    """Wake ``count`` new sessions; once each has its turn and title, its owner's pid by
    stream (each was claimed once: nobody took one over)."""
    sessions = [pool.new_session() for _ in range(count)]
    for sid in sessions:
        pool.runtime().inject(sid, "go", wake=True)
    owner: dict[str, int] = {}
    for sid in sessions:
        pool.wait_for(sid, "session/titled")
        _check_closed_once(pool, sid)
        (pid,) = _owners(pool, sid)
        owner[session_stream(sid)] = pid
    return owner


def test_pool_members_receive_only_their_own_sessions_events(pool: Pool) -> None:
    _traced(pool)
    for name in "abc":
        pool.serve(name, OWNERSHIP_TOOL_SECONDS="0.05")
    owner = _run_all(pool, SESSIONS)
    assert len(set(owner.values())) >= 2, owner  # the group spread them
    assert pool.emulator is not None
    received = [t & owner.keys() for t in pool.emulator.traces()]
    received = [t for t in received if t]
    assert received, "no subscription received a session's events"
    for streams in received:
        # One reader's sessions all belong to one worker, and no reader had them all.
        assert len({owner[s] for s in streams}) == 1, (streams, owner)
        assert len(streams) < SESSIONS


def test_a_member_that_joins_takes_new_sessions_and_one_that_leaves_hands_its_own_off(
        pool: Pool) -> None:
    _traced(pool)
    a = pool.serve("a", OWNERSHIP_TOOL_SECONDS="0.05")
    first = _run_all(pool, 4)
    assert set(first.values()) == {a.pid}
    b = pool.serve("b", OWNERSHIP_TOOL_SECONDS="0.05")
    later = _run_all(pool, SESSIONS)
    assert b.pid in later.values(), later  # the newcomer got a share of the new sessions
    # b leaves (SIGTERM); a session of its own that wakes later is served by a.
    mine = [UUID(s.removeprefix("session-")) for s, pid in later.items() if pid == b.pid]
    b.signal(15)
    assert b.wait() == 0
    pool.runtime().inject(mine[0], "again", wake=True)
    pool.wait_for(mine[0], "turn/end", 2)
    assert _owners(pool, mine[0]) == [b.pid, a.pid]


def test_workers_outside_a_pool_read_every_session_and_still_run_each_turn_once(
        pool: Pool) -> None:
    """``--no-group``: no pool (on SQLite there is none anyway); each worker follows every
    session in its own views, and the fenced claim still gives each turn one executor."""
    workers = [pool.serve(name, "--no-group", OWNERSHIP_TOOL_SECONDS="0.05") for name in "ab"]
    for worker in workers:
        assert "; pool " not in "".join(worker.err), worker.err
    owner = _run_all(pool, 6)
    assert set(owner.values()) <= {w.pid for w in workers}
    if pool.emulator is not None:  # a reader that received every session: not a pool member
        assert any(owner.keys() <= t for t in pool.emulator.traces())


@pytest.mark.timeout(180)
def test_a_worker_of_another_app_never_holds_a_session_up(pool: Pool) -> None:
    """Two apps' workers on one store, each following every session (SQLite; ``--no-group``
    on EventStoreDB): a free session's preferred worker is chosen among those whose app defines
    its agent (their beats say which), so a wake is served at once — not after the two beat
    intervals (12 s here) a worker of the other app would make it wait, having refused it."""
    import time

    slow = {"OWNERSHIP_TTL": "30", "OWNERSHIP_TOOL_SECONDS": "0"}  # beats every 6 s
    ours = pool.serve("ours", "--no-group", **slow)
    other = pool.serve("other", "--no-group", OWNERSHIP_AGENT="someone-else", **slow)
    sessions = [pool.new_session() for _ in range(6)]
    for sid in sessions:
        began = time.monotonic()
        pool.runtime().inject(sid, "go", wake=True)
        pool.wait_for(sid, "turn/end", timeout=60)
        assert time.monotonic() - began < 10, pool.stderr()  # the slow path takes 12 s
    assert not any("not serving session" in line for line in other.err), other.err
    assert all(pool.log(sid)[2][1]["pid"] == ours.pid for sid in sessions)
    said = {b.pid: b.agents for b in pool.store.workers().beats()}
    assert said[ours.pid] == ("default",) and said[other.pid] == ("someone-else",)


def test_a_session_of_another_app_is_said_to_be_left_alone_once(pool: Pool) -> None:
    """``serve`` skips a session whose agent its app does not define with one warning. A pool
    member of a new group is given the log from its start — a turn's wake, its start, the
    verdicts and releases — and said it for each event that asks for a worker."""
    ours = pool.serve("ours", "--group", "ours", OWNERSHIP_TOOL_SECONDS="60")
    sid = pool.new_session()
    pool.runtime().inject(sid, "go", wake=True)
    wait_until(lambda: pool.executions(sid), "the tool to start", pool.stderr)
    ours.signal(signal.SIGKILL)  # the turn stays open, its worker gone
    ours.wait(30)
    for n in range(3):  # more events of the session that ask for a worker
        pool.runtime().inject(sid, f"and {n}", wake=True)
    other = pool.serve("other", "--group", "theirs", OWNERSHIP_AGENT="someone-else")
    wait_until(lambda: any(f"not serving session {sid}" in line for line in other.err),
               "the warning", lambda: "".join(other.err))
    time.sleep(2.0)  # the rest of the log's events for it, given to the member meanwhile
    said = [line for line in other.err if f"not serving session {sid}" in line]
    assert len(said) == 1, said
