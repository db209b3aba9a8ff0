"""R22 at the agent cap: a long-lived process touches more sessions than ``max_agents``. The
agents it spawned on demand (a turn, a wake, serving) that sit idle are let go, the longest idle
first — its session released in the log (``agent/detached``) — so the process keeps serving;
agents mid-turn, parked, or spawned with ``spawn_agent`` are never let go, and only when every
agent is one of those is a new one refused (``AgentCapExceeded``)."""

from __future__ import annotations

import time
from uuid import UUID

import pytest

from terret import Actor, Reply, RuntimeConfig, ScriptedProvider
from terret.domain.errors import AgentCapExceeded, AgentLetGo
from terret.runtime import ModelRequest
from tests.runtime.conftest import MakeRuntime, OpenedStore
from tests.runtime.kit import (
    calls,
    final,
    names,
    only,
    other_process,
    read_log,
    turn_in_background,
    wait_for_event,
    wait_parked,
    wait_until,
)

OPERATOR = Actor(actor="operator", id="ops")
CAP = RuntimeConfig(max_agents=2)


def _let_go(store: object, sid: UUID) -> list[str]:
    return [e.data["reason"] for e in only(read_log(store, sid), "agent/detached")]


def test_r22_at_the_cap_the_longest_idle_agent_is_let_go_and_its_session_released(
        make_runtime: MakeRuntime, store) -> None:
    rt = make_runtime(config=CAP)
    sessions = [rt.create_session() for _ in range(4)]
    for sid in sessions[:2]:
        assert rt.run_turn(sid, "hello").status == "completed"
    rt.run_turn(sessions[0], "again")  # the second is now the longest idle
    assert rt.run_turn(sessions[2], "a third session").status == "completed"
    assert {a.session_id for a in rt.agents} == {sessions[0], sessions[2]}
    assert _let_go(store, sessions[1]) == ["idle: the agent cap (2) was reached"]
    # Released: its last ownership event is the detach (a title, written off the turn's thread,
    # may land after it).
    owned = [n for n in names(read_log(store, sessions[1])) if n.startswith("agent/")]
    assert owned[-1] == "agent/detached"
    assert _let_go(store, sessions[0]) == []
    # The session let go is served again on its next turn (a new agent, a new epoch).
    assert rt.run_turn(sessions[1], "back").status == "completed"
    assert len(only(read_log(store, sessions[1]), "agent/attached")) == 2
    assert len(rt.agents) == 2 and rt.agent_for_session(sessions[1]) is not None
    assert rt.run_turn(sessions[3], "a fourth").status == "completed"


def test_r22_a_parked_agent_and_one_from_spawn_agent_are_never_let_go(
        make_runtime: MakeRuntime, store) -> None:
    provider = ScriptedProvider(default=lambda r: (
        calls(("deploy", {"env": "prod"})) if r.messages[-1].text == "deploy" else final()))
    rt = make_runtime(provider, config=CAP)
    parked, pinned, third = (rt.create_session() for _ in range(3))
    job = turn_in_background(rt, parked, "deploy")
    wait_parked(rt, parked)
    mine = rt.spawn_agent(pinned)
    with pytest.raises(AgentCapExceeded, match="none of them idle"):
        rt.run_turn(third, "no room")
    assert "agent/attached" not in names(read_log(store, third))
    rt.approve(parked, rt.pending(parked)[0], by=OPERATOR)
    job.join()
    # The parked turn ended: its agent is idle now, and the one let go for the third session.
    assert rt.run_turn(third, "room now").status == "completed"
    assert _let_go(store, parked) and rt.agent_for_session(parked) is None
    assert rt.agent_for_session(pinned) is mine and _let_go(store, pinned) == []


def test_r22_an_agent_let_go_before_its_turn_began_runs_no_turn(
        make_runtime: MakeRuntime, store) -> None:
    rt = make_runtime(config=CAP)
    first, second, third = (rt.create_session() for _ in range(3))
    rt.run_turn(first, "hello")
    held = rt.agent_for(second)  # looked up; its turn not begun
    rt.agent_for(first)  # the first used since: the second is the longest idle
    rt.run_turn(third, "needs room")
    assert rt.agent_for_session(second) is None
    before = len(read_log(store, second))
    with pytest.raises(AgentLetGo):
        held.run_turn("too late")
    assert len(read_log(store, second)) == before  # nothing written
    assert rt.run_turn(second, "looked up again").status == "completed"


def test_r22_a_serving_worker_at_the_cap_keeps_waking_sessions_another_process_wakes(
        make_runtime: MakeRuntime, opened: OpenedStore) -> None:
    def model(request: ModelRequest) -> Reply:
        return final(f"re: {request.messages[-1].text}")

    server = make_runtime(ScriptedProvider(default=model), config=CAP, start=False)
    sessions = [server.create_session() for _ in range(5)]
    server.serve_start()
    for i, sid in enumerate(sessions):
        other_process(opened.uri, "inject", str(sid), f"wake {i}", "wake")
        log = wait_for_event(opened.store, sid, "turn/end")
        assert only(log, "turn/end")[0].data["status"] == "completed"
    assert len(server.agents) <= 2
    released = [sid for sid in sessions if _let_go(opened.store, sid)]
    assert len(released) >= 3
    # A session let go wakes again when another process asks.
    other_process(opened.uri, "inject", str(sessions[0]), "once more", "wake")
    wait_until(lambda: len(only(read_log(opened.store, sessions[0]), "turn/end")) == 2,
               what="the second woken turn")


def _deploy_model(request: ModelRequest) -> Reply:
    last = request.messages[-1]
    if last.role == "user" and last.text.startswith("deploy"):
        return calls(("deploy", {"env": "prod"}))
    return final(f"re: {last.text}")


def test_r22_a_serving_worker_at_the_cap_sets_the_longest_parked_turn_aside_for_its_verdict(
        make_runtime: MakeRuntime, opened: OpenedStore, kit) -> None:
    """Turns parked on a person for days held every agent of a serving worker, which then left
    every new wake queued: at the cap, the turn parked the longest is set aside — it stays open
    in the log, waiting on its approval, its session released — and when another process
    records the verdict, a worker resumes it and runs the call once."""
    server = make_runtime(ScriptedProvider(default=_deploy_model), config=CAP, start=False)
    first, second, third = (server.create_session() for _ in range(3))
    server.serve_start()
    for sid in (first, second):
        other_process(opened.uri, "inject", str(sid), "deploy it", "wake")
        wait_parked(server, sid)
    other_process(opened.uri, "inject", str(third), "hello", "wake")
    log = wait_for_event(opened.store, third, "turn/end")
    assert only(log, "turn/end")[0].data["status"] == "completed"
    assert _let_go(opened.store, first) == [
        "parked: set aside for its verdict, the agent cap (2) was reached"]
    assert _let_go(opened.store, second) == []
    aside = read_log(opened.store, first)
    server.catch_up_views(first)
    assert "turn/end" not in names(aside)
    assert server.views.status(first).status == "waiting_approval"
    assert server.agent_for_session(first) is None
    # Left in the log: no worker claims it back while it waits on its verdict.
    before = len(read_log(opened.store, first))
    other_process(opened.uri, "inject", str(third), "and again", "wake")
    wait_until(lambda: len(only(read_log(opened.store, third), "turn/end")) == 2,
               what="the third session's second turn")
    assert len(read_log(opened.store, first)) == before
    # The verdict, from another process: a worker resumes the turn and runs the call once.
    other_process(opened.uri, "approve", str(first), server.pending(first)[0])
    log = wait_for_event(opened.store, first, "turn/end")
    assert only(log, "turn/end")[0].data["status"] == "completed"
    assert len(only(log, "tool/result")) == 1 and len(only(log, "approval/requested")) == 1
    other_process(opened.uri, "approve", str(second), server.pending(second)[0])
    log = wait_for_event(opened.store, second, "turn/end")
    assert only(log, "turn/end")[0].data["status"] == "completed"
    assert kit.ran == [("deploy", {"env": "prod"})] * 2


def test_r22_a_turn_a_caller_waits_on_is_never_set_aside(
        make_runtime: MakeRuntime, opened: OpenedStore) -> None:
    """Only a serving wake's park may be set aside: a caller's ``run_turn`` waits on its own
    turn, which must not come back suspended because another session needed room."""
    rt = make_runtime(ScriptedProvider(default=_deploy_model), config=RuntimeConfig(
        max_agents=1))
    mine, other = rt.create_session(), rt.create_session()
    job = turn_in_background(rt, mine, "deploy now")
    wait_parked(rt, mine)
    with pytest.raises(AgentCapExceeded):
        rt.run_turn(other, "no room")
    other_process(opened.uri, "approve", str(mine), rt.pending(mine)[0])
    assert job.join().status == "completed"
    assert _let_go(opened.store, mine) == []


def test_r22_a_turn_parked_on_its_budget_is_set_aside_and_resumed_when_a_budget_covers_it(
        make_runtime: MakeRuntime, opened: OpenedStore) -> None:
    """A budget waits on a person too: set aside at the cap, the turn stays parked in the log
    (a raise that does not cover its next step leaves it there, unclaimed), and one that does,
    from another process, gets it a worker again."""
    from terret import Usage

    def model(request: ModelRequest) -> Reply:
        last = request.messages[-1]
        if last.role == "user" and last.text == "spend":
            return calls(("noop", {}), usage=Usage(10, 1, 0.04))
        return final(f"re: {last.text}", usage=Usage(10, 1, 0.04))

    server = make_runtime(ScriptedProvider(default=model),
                          config=RuntimeConfig(max_agents=1, spend_cap=0.05), start=False)
    parked, other = server.create_session(), server.create_session()
    server.serve_start()
    other_process(opened.uri, "inject", str(parked), "spend", "wake")
    wait_until(lambda: "budget/exceeded" in names(read_log(opened.store, parked)),
               what="the park on the budget")
    other_process(opened.uri, "budget", str(other), "1.0")
    other_process(opened.uri, "inject", str(other), "hello", "wake")
    log = wait_for_event(opened.store, other, "turn/end")
    assert only(log, "turn/end")[0].data["status"] == "completed"
    assert _let_go(opened.store, parked) == [
        "parked: set aside for its verdict, the agent cap (1) was reached"]
    other_process(opened.uri, "budget", str(parked), "0.06")  # 0.04 + 0.04 > 0.06
    before = len(read_log(opened.store, parked))
    other_process(opened.uri, "inject", str(other), "again", "wake")
    wait_for_event(opened.store, other, "turn/end", count=2)
    time.sleep(2 * server.supervisor.scan_interval)  # two scans, at least
    assert len(read_log(opened.store, parked)) == before  # not claimed: still over
    other_process(opened.uri, "budget", str(parked), "1.0")
    log = wait_for_event(opened.store, parked, "turn/end")
    assert only(log, "turn/end")[0].data["status"] == "completed"
    assert len(only(log, "budget/exceeded")) == 1


def test_r22_wakes_queued_at_a_full_worker_take_the_freed_agent_one_at_a_time(
        make_runtime: MakeRuntime, opened: OpenedStore) -> None:
    """Wakes refused at the cap are tried again once an agent is free: each claim let go of the
    agent the claim before had just made for its wake, before that wake's turn began — claims
    and releases in the log, no turn — until one won. Each session is claimed once now."""
    server = make_runtime(ScriptedProvider(default=_deploy_model), start=False,
                          config=RuntimeConfig(max_agents=1, approval_max_wait=3600))
    parked = server.create_session()
    queued = [server.create_session() for _ in range(3)]
    server.serve_start()
    other_process(opened.uri, "inject", str(parked), "deploy it", "wake")
    wait_parked(server, parked)  # a deadline to keep: it holds the one agent
    for sid in queued:
        other_process(opened.uri, "inject", str(sid), "hello", "wake")
    time.sleep(2 * server.supervisor.scan_interval)
    other_process(opened.uri, "approve", str(parked), server.pending(parked)[0])
    for sid in queued:
        log = wait_for_event(opened.store, sid, "turn/end", timeout=30)
        assert only(log, "turn/end")[0].data["status"] == "completed"
        assert len(only(log, "agent/attached")) == 1, names(log)


def test_r22_a_second_wake_of_a_parked_session_leaves_its_park_free_to_be_set_aside(
        make_runtime: MakeRuntime, opened: OpenedStore) -> None:
    """A follow-up waking note to a session whose woken turn is parked ran a second wake that
    found the turn running — and its end cleared what the first wake had decided: the park
    was then never set aside, and the next wake at the cap was refused."""
    server = make_runtime(ScriptedProvider(default=_deploy_model),
                          config=RuntimeConfig(max_agents=1), start=False)
    parked, other = server.create_session(), server.create_session()
    server.serve_start()
    other_process(opened.uri, "inject", str(parked), "deploy it", "wake")
    wait_parked(server, parked)
    other_process(opened.uri, "inject", str(parked), "also this", "wake")
    time.sleep(2 * server.supervisor.scan_interval)  # the second wake has come and gone
    other_process(opened.uri, "inject", str(other), "hello", "wake")
    log = wait_for_event(opened.store, other, "turn/end", timeout=15)
    assert only(log, "turn/end")[0].data["status"] == "completed"
    assert _let_go(opened.store, parked) == [
        "parked: set aside for its verdict, the agent cap (1) was reached"]
