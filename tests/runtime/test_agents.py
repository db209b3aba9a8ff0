"""The agent registry (R22), the allow-list (R23), recorded lifecycle states (R25) and what
terminal transitions release (R26)."""

from __future__ import annotations

import logging
from uuid import uuid4

import pytest

from terret import (
    Actor,
    AgentDefinition,
    CallContext,
    Reply,
    RuntimeConfig,
    ScriptedProvider,
    Session,
    call,
)
from terret.domain.errors import (
    AgentBusy,
    AgentCapExceeded,
    AgentExists,
    InvalidPayload,
    LostOwnership,
    MaxStepsExceeded,
    ProviderError,
    SessionClosed,
    ToolCallNotOwed,
)
from terret.runtime import Veto
from tests.runtime.conftest import MakeRuntime, OpenedStore
from tests.runtime.kit import (
    Background,
    Kit,
    LogBuilder,
    agent_of,
    calls,
    drain_upkeep,
    final,
    held_turn,
    names,
    only,
    other_process,
    read_log,
    turn_in_background,
    wait_parked,
    wait_until,
)

OPERATOR = Actor(actor="operator", id="ops")


# --- R22 the registry -------------------------------------------------------------------------


def test_r22_spawn_refuses_an_id_collision_and_a_second_agent_for_a_session(
        make_runtime: MakeRuntime, store) -> None:
    rt = make_runtime()
    s1, s2 = rt.create_session(), rt.create_session()
    agent = rt.spawn_agent(s1, agent_id="a-1")
    with pytest.raises(AgentExists):
        rt.spawn_agent(s2, agent_id="a-1")
    with pytest.raises(AgentExists):
        rt.spawn_agent(s1, agent_id="a-2")
    assert rt.agent_for_session(s1) is agent and agent.id == "a-1"
    assert rt.agent_for_session(s2) is None
    assert [a.id for a in rt.agents] == ["a-1"]
    assert names(read_log(store, s1)).count("agent/attached") == 1
    assert "agent/attached" not in names(read_log(store, s2))


def test_r22_the_registry_is_capped_at_max_agents(make_runtime: MakeRuntime, store) -> None:
    assert RuntimeConfig().max_agents == 128
    rt = make_runtime(config=RuntimeConfig(max_agents=2))
    sessions = [rt.create_session() for _ in range(3)]
    first = rt.spawn_agent(sessions[0])
    rt.spawn_agent(sessions[1])
    with pytest.raises(AgentCapExceeded):
        rt.spawn_agent(sessions[2])
    with pytest.raises(AgentCapExceeded):
        rt.run_turn(sessions[2], "implicit spawn is capped too")
    assert "agent/attached" not in names(read_log(store, sessions[2]))
    rt.dispose_agent(first.id)
    assert rt.run_turn(sessions[2], "a slot is free").status == "completed"


def test_r22_only_an_idle_agent_is_disposed_and_its_listeners_go_with_it(
        make_runtime: MakeRuntime, store, gates) -> None:
    gate = gates()
    provider = ScriptedProvider([calls(("deploy", {"env": "prod"}), gate=gate), final()])
    rt = make_runtime(provider)
    baseline = rt.runner.listener_count
    sid = rt.create_session()
    agent = rt.spawn_agent(sid)
    assert rt.runner.listener_count > baseline
    job = turn_in_background(rt, sid, "go")
    wait_until(lambda: provider.requests, what="the model request")
    with pytest.raises(AgentBusy):  # running
        rt.dispose_agent(agent.id)
    gate.set()
    wait_parked(rt, sid)
    with pytest.raises(AgentBusy):  # parked
        rt.dispose_agent(agent.id)
    rt.approve(sid, rt.pending(sid)[0], by=OPERATOR)
    job.join()
    rt.dispose_agent(agent.id, reason="done for today")
    assert rt.runner.listener_count == baseline
    assert rt.agent_for_session(sid) is None and rt.agents == []
    (detached,) = only(read_log(store, sid), "agent/detached")
    assert detached.data["agent_id"] == agent.id and detached.data["reason"] == "done for today"
    # its listeners went with it (listener_count above); the session lives on, and a new
    # agent takes it up after a policy change
    rt.set_policy(sid, [], by=OPERATOR)
    provider.script(final())
    assert rt.run_turn(sid, "a new agent reads the log").status == "completed"
    assert rt.agent_for_session(sid) is not agent


def test_r22_a_disposal_whose_reason_the_log_cannot_hold_changes_nothing(
        make_runtime: MakeRuntime, store) -> None:
    """A reason of megabytes failed the release's append after the agent had left the
    process: the log still named it the owner, ``owner(sid)`` said it was live. Now the reason
    is checked first."""
    rt = make_runtime()
    sid = rt.create_session()
    agent = rt.spawn_agent(sid)
    before = read_log(store, sid)
    with pytest.raises(InvalidPayload, match="at most 2000 characters"):
        rt.dispose_agent(agent.id, reason="D" * 1_200_000)
    assert rt.agent_for_session(sid) is agent and rt.agents == [agent]
    assert read_log(store, sid) == before
    rt.dispose_agent(agent.id, reason="D" * 2000)
    assert rt.agent_for_session(sid) is None
    assert only(read_log(store, sid), "agent/detached")[0].data["reason"] == "D" * 2000


def test_a_task_watching_a_session_keeps_it_followed_when_its_agent_goes(
        make_runtime: MakeRuntime, store) -> None:
    """A pool member's upkeep of a dead worker's session follows its stream for the length of
    the task (``AgentHost.watching``): an agent of the session let go meanwhile unwatched it
    under the task, whose summary then read views that no longer followed the log."""
    from terret.domain.store import session_stream

    rt = make_runtime(start=False)
    rt.runner.scope_to()  # a pool member's views: only the sessions it serves
    rt.start()
    sid = rt.create_session()
    stream = session_stream(sid)
    assert not rt.runner.follows(stream)
    with rt.agent_host.watching(sid):
        assert rt.runner.follows(stream)
        agent = rt.spawn_agent(sid)  # a wake claims it meanwhile, then it is let go
        rt.dispose_agent(agent.id)
        assert rt.runner.follows(stream)  # kept for the task
    assert not rt.runner.follows(stream)  # and let go after it
    agent = rt.spawn_agent(sid)
    with rt.agent_host.watching(sid):
        pass
    assert rt.runner.follows(stream)  # an agent holding it keeps it followed
    rt.dispose_agent(agent.id)
    assert not rt.runner.follows(stream)


def test_r22_agent_for_session_is_the_index(make_runtime: MakeRuntime) -> None:
    rt = make_runtime()
    sids = [rt.create_session() for _ in range(4)]
    agents = {sid: rt.spawn_agent(sid) for sid in sids}
    assert all(rt.agent_for_session(sid) is agents[sid] for sid in sids)
    assert rt.agent_for_session(uuid4()) is None


# --- R23 the allow-list -----------------------------------------------------------------------


def test_r23_deny_by_default_and_a_veto_is_a_tool_result_error(make_runtime: MakeRuntime,
                                                               kit: Kit, store) -> None:
    rt = make_runtime([calls(("status", {"env": "prod"}), ("noop", {})), final("ok then")],
                      allow=[])
    sid = rt.create_session()
    result = rt.run_turn(sid, "go")
    assert (result.status, result.text) == ("completed", "ok then")  # the veto did not stop it
    assert kit.ran == []
    results = only(read_log(store, sid), "tool/result")
    assert all(r.data["is_error"] for r in results)
    assert results[0].data["content"] == (
        "vetoed: status is not allowed by the session's policy")


def test_r23_the_floor_governs_until_a_policy_update_which_wins_even_when_narrower(
        make_runtime: MakeRuntime, kit: Kit, store) -> None:
    rt = make_runtime(ScriptedProvider(default=calls(("status", {"env": "prod"}))),
                      config=RuntimeConfig(max_steps=1), allow=["stat*"])
    sid = rt.create_session()
    with pytest.raises(MaxStepsExceeded):  # one step per turn, then the cap
        rt.run_turn(sid, "floor allows status")
    rt.set_policy(sid, ["noop"], by=OPERATOR)
    with pytest.raises(MaxStepsExceeded):
        rt.run_turn(sid, "the update narrows it")
    results = only(read_log(store, sid), "tool/result")
    assert [r.data["is_error"] for r in results] == [False, True]


def test_r23_a_policy_update_takes_effect_on_the_very_next_call(make_runtime: MakeRuntime,
                                                                kit: Kit, store,
                                                                gates) -> None:
    gate = gates()
    provider = ScriptedProvider([
        calls(("status", {"env": "a"})),
        calls(("status", {"env": "b"}), gate=gate),
        final(),
    ])
    rt = make_runtime(provider, allow=["noop"])
    sid = rt.create_session()
    job = turn_in_background(rt, sid, "go")
    wait_until(lambda: len(provider.requests) == 2, what="the second step")
    rt.set_policy(sid, ["status"], by=OPERATOR)
    gate.set()  # the reply's call runs right after the update, in the same turn
    assert job.join().status == "completed"
    assert kit.ran == [("status", {"env": "b"})]
    results = only(read_log(store, sid), "tool/result")
    assert [r.data["is_error"] for r in results] == [True, False]


def test_r23_a_policy_update_from_another_process_reaches_the_next_call(
        make_runtime: MakeRuntime, opened: OpenedStore, kit: Kit, gates) -> None:
    gate = gates()
    provider = ScriptedProvider([calls(("status", {"env": "b"}), gate=gate), final()])
    rt = make_runtime(provider, allow=[])
    sid = rt.create_session()
    job = turn_in_background(rt, sid, "go")
    wait_until(lambda: provider.requests, what="the model request")
    other_process(opened.uri, "policy", str(sid), "status")
    gate.set()
    assert job.join().status == "completed"
    assert kit.ran == [("status", {"env": "b"})]


def test_r23_policies_are_per_session_and_survive_a_restart(make_runtime: MakeRuntime,
                                                            kit: Kit, store) -> None:
    script = [calls(("status", {"env": "x"}), ("noop", {})), final()] * 2
    rt = make_runtime(script, allow=["*"])
    s1, s2 = rt.create_session(), rt.create_session()
    rt.set_policy(s1, ["status"], by=OPERATOR)
    rt.set_policy(s2, ["noop"], by=OPERATOR)
    rt.close()
    fresh = make_runtime(script, allow=["*"])  # the next process rebuilds them from the log
    fresh.run_turn(s1, "go")
    fresh.run_turn(s2, "go")
    assert [r.data["is_error"] for r in only(read_log(store, s1), "tool/result")] == [
        False, True]
    assert [r.data["is_error"] for r in only(read_log(store, s2), "tool/result")] == [
        True, False]


def test_r23_an_unknown_session_fails_closed_and_is_never_cached(make_runtime: MakeRuntime,
                                                                 kit: Kit) -> None:
    rt = make_runtime()
    agent = rt.spawn_agent(rt.create_session())
    stranger = uuid4()
    ctx = CallContext(stranger, "c-1", "status", {"env": "x"}, 1)
    assert isinstance(agent.allowlist(kit.status, ctx), Veto)
    rt.create_session(session_id=stranger)  # now it exists: the deny-all did not stick
    rt.catch_up_views()
    assert agent.allowlist(kit.status, ctx) is None


def test_r23_an_unreadable_session_fails_closed_with_a_warning(
        make_runtime: MakeRuntime, kit: Kit, store, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    rt = make_runtime([calls(("status", {"env": "x"})), final()], allow=["*"])
    sid = rt.create_session()

    def unreadable(session: object) -> list[str] | None:
        raise OSError("store unavailable")

    monkeypatch.setattr(rt.spawn_agent(sid).allowlist, "_read", unreadable)
    with caplog.at_level(logging.WARNING, logger="terret.allowlist"):
        assert rt.run_turn(sid, "go").status == "completed"
    assert kit.ran == []
    (result,) = only(read_log(store, sid), "tool/result")
    assert result.data["is_error"] and "cannot be read" in result.data["content"]
    assert any("cannot be read" in r.getMessage() for r in caplog.records)


# --- R25 recorded states, forced transitions --------------------------------------------------


def test_r25_states_are_recorded_and_forced_transitions_say_who_forced_them(
        make_runtime: MakeRuntime, store) -> None:
    from terret.runtime import Refusal

    refuse = {"on": False}
    rt = make_runtime(ScriptedProvider(default=final()), pre_step=[
        lambda c: Refusal("supervisor", "paused") if refuse["on"] else None])
    sid = rt.create_session()
    rt.run_turn(sid, "natural")
    refuse["on"] = True
    rt.run_turn(sid, "forced")
    refuse["on"] = False
    rt.close_session(sid, by=OPERATOR, reason="project over")
    log = read_log(store, sid)
    assert names(log)[:2] == ["session/started", "agent/attached"]
    attached = only(log, "agent/attached")[0].data
    assert attached["pid"] > 0 and attached["host"]
    natural, forced = only(log, "turn/end")
    assert "by" not in natural.data and natural.data["status"] == "completed"
    assert forced.data["by"] == {"actor": "supervisor"} and forced.data["status"] == "rejected"
    (closed,) = only(log, "session/closed")
    assert closed.data == {"reason": "project over", "by": {"actor": "operator", "id": "ops"}}
    assert names(log)[-1] == "agent/detached"  # finished releases the instance
    with pytest.raises(SessionClosed):
        rt.run_turn(sid, "after the end")
    with pytest.raises(SessionClosed):
        rt.inject(sid, "after the end")


# --- R26 release on every path; late tool results rejected ------------------------------------


def _script_for(path: str) -> list[Reply]:
    return {
        "completed": [final()],
        "failed": [Reply(raises=ProviderError("scripted", "boom"))],
        "max-steps": [calls(("noop", {}))] * 3,
        "cancelled": [calls(("deploy", {"env": "prod"})), final()],
    }[path]


@pytest.mark.parametrize("path", ["completed", "failed", "max-steps", "cancelled"])
def test_r26_every_terminal_path_leaves_the_agent_idle_and_disposable(
        make_runtime: MakeRuntime, store, path: str) -> None:
    rt = make_runtime(_script_for(path), config=RuntimeConfig(max_steps=2))
    baseline = rt.runner.listener_count
    sid = rt.create_session()
    job = turn_in_background(rt, sid, "go")
    if path == "cancelled":
        wait_parked(rt, sid)
        rt.cancel(sid, by=OPERATOR)
    if path in ("completed", "cancelled"):
        assert job.join().status == path
    else:
        with pytest.raises(ProviderError if path == "failed" else MaxStepsExceeded):
            job.join()
    (end,) = only(read_log(store, sid), "turn/end")
    assert end.data["status"] == ("failed" if path == "max-steps" else path)
    agent = agent_of(rt, sid)
    assert agent.status == "idle" and not agent.busy
    assert not rt.resumable(sid) and rt.pending(sid) == []
    rt.dispose_agent(agent.id)
    assert rt.runner.listener_count == baseline


def test_r26_lost_ownership_releases_the_agent_too(make_runtime: MakeRuntime, store,
                                                  gates) -> None:
    held = held_turn(make_runtime, gates)
    rt, sid, gate, job = held.rt, held.sid, held.gate, held.job
    LogBuilder(store, sid).do(lambda s: s.record_assistant("someone else"))
    gate.set()
    agent = agent_of(rt, sid)
    with pytest.raises(LostOwnership):
        job.join()
    # The agent that lost its session is gone from this process, its listeners with it; it
    # wrote nothing (no detach: the session is not its to release).
    assert rt.agent_for_session(sid) is None and agent not in rt.agents
    assert agent.status == "released" and not agent._listeners  # let go: AgentLetGo if held
    assert names(read_log(store, sid))[-1] == "assistant/message"


def test_r26_a_tool_result_for_a_closed_turn_is_rejected_not_written(
        make_runtime: MakeRuntime, kit: Kit, store) -> None:
    rt = make_runtime([calls(("slow", {}, "c-1")), final()])
    sid = rt.create_session()
    job = turn_in_background(rt, sid, "go")
    assert kit.entered.wait(10)
    # while the tool runs, another writer closes the turn
    LogBuilder(store, sid).do(lambda s: s.end_turn("cancelled", by=OPERATOR, reason="gone"))
    kit.release.set()
    with pytest.raises((LostOwnership, ToolCallNotOwed)):
        job.join()
    drain_upkeep(rt)  # the titler reacts to that turn/end too
    log = read_log(store, sid)
    (result,) = only(log, "tool/result")  # the closing writer answered the call ...
    assert result.data["is_error"] and "was not run" in result.data["content"]
    assert "finally" not in result.data["content"]  # ... the late result was not written
    assert [n for n in names(log) if n != "session/titled"][-2:] == ["tool/result", "turn/end"]
    assert len(only(log, "turn/end")) == 1
    with pytest.raises(ToolCallNotOwed):  # and through the aggregate directly
        LogBuilder(store, sid).do(lambda s: s.record_tool_result("c-1", "slow", "late"))
    assert read_log(store, sid) == log


def test_r26_closing_the_runtime_suspends_a_parked_turn_which_stays_resumable(
        make_runtime: MakeRuntime, kit: Kit, store) -> None:
    rt = make_runtime([calls(("deploy", {"env": "prod"}))])
    sid = rt.create_session()
    agent = rt.spawn_agent(sid)
    agent.start_in_background(lambda: agent.run_turn("go"))
    wait_parked(rt, sid)
    rt.close(grace=5)
    assert not agent.busy
    fresh = make_runtime([final("resumed")])
    assert fresh.resumable(sid) and fresh.pending(sid)
    resumed = Background(lambda: fresh.resume_turn(sid))
    (call_id,) = wait_parked(fresh, sid)
    fresh.approve(sid, call_id, by=OPERATOR)
    assert resumed.join().status == "completed"
    assert kit.ran == [("deploy", {"env": "prod"})]
    assert len(only(read_log(store, sid), "approval/requested")) == 1


def test_r26_tool_calls_in_a_turn_are_each_answered_once(make_runtime: MakeRuntime,
                                                        store) -> None:
    rt = make_runtime([Reply(tool_calls=[call("noop", {}, f"c-{i}") for i in range(5)]),
                       final()])
    sid = rt.create_session()
    rt.run_turn(sid, "go")
    results = only(read_log(store, sid), "tool/result")
    assert sorted(r.data["call_id"] for r in results) == [f"c-{i}" for i in range(5)]


def test_r22_a_definition_is_chosen_per_session(make_runtime: MakeRuntime, kit: Kit,
                                                store) -> None:
    rt = make_runtime([calls(("status", {"env": "x"})), final()] * 2)
    rt.define(AgentDefinition(name="reader", tools=[kit.status], allow=["status"]))
    sid = rt.create_session(agent="reader")
    rt.run_turn(sid, "go")
    assert agent_of(rt, sid).definition.name == "reader"
    assert only(read_log(store, sid), "session/started")[0].data["agent"] == "reader"


def test_r26_a_parked_turn_does_not_hold_its_requests_history(make_runtime: MakeRuntime,
                                                              store) -> None:
    """128 parked agents must not cost memory in proportion to their histories: once the model
    answered, the step keeps no reference to the messages it sent (bench/loop.py measures it)."""
    import gc

    from terret.runtime import ModelReply, ModelRequest

    class Forgetful:  # a provider that keeps nothing (ScriptedProvider keeps its requests)
        name = "scripted"

        def complete(self, request: ModelRequest, **_: object) -> ModelReply:
            done = any(m.role == "tool" for m in request.messages[-3:])
            if done:
                return ModelReply(text="done")
            return ModelReply(tool_calls=(ToolCall("c-d", "deploy", {"env": "prod"}),))

    from terret import StaticResolver, ToolCall
    from terret.runtime import Runtime

    rt = Runtime(store, resolver=StaticResolver({"scripted": Forgetful()}),
                 agents=[AgentDefinition(tools=Kit().tools, allow=["*"])]).start()
    try:
        sid = rt.create_session()
        history = LogBuilder(store, sid)  # an earlier turn: history the model is shown
        history.do(lambda s: s.start_turn(text="marker " * 50))
        history.do(lambda s: s.start_step("scripted:default"))

        def answer(s: Session) -> None:
            s.record_assistant("noted")
            s.end_step()
            s.end_turn("completed")

        history.do(answer)
        job = turn_in_background(rt, sid, "go")
        wait_parked(rt, sid)
        gc.collect()
        held = [o for o in gc.get_objects()
                if type(o).__name__ == "Message" and getattr(o, "text", "").startswith("marker")]
        assert held == []
        rt.approve(sid, "c-d", by=OPERATOR)
        assert job.join().status == "completed"
    finally:
        rt.close()


def test_an_agent_disposed_or_dropped_runs_no_turn_for_a_caller_still_holding_it(
        make_runtime: MakeRuntime, opened: OpenedStore) -> None:
    """A disposed agent (or one dropped when another process moved its session) still ran
    turns for a caller holding the object: outside the registry, it claimed the session
    (agent/attached), the runtime spawned a second agent for it at the next turn, and close()
    never released the orphan. ``AgentLetGo`` now, nothing written."""
    from terret.domain.errors import AgentLetGo

    rt = make_runtime()
    sid = rt.create_session()
    held = rt.spawn_agent(sid, agent_id="mine")
    rt.dispose_agent("mine")
    before = read_log(opened.store, sid)
    with pytest.raises(AgentLetGo, match="disposed"):
        held.run_turn("hello")
    assert read_log(opened.store, sid) == before and rt.agents == []

    moved = rt.spawn_agent(sid, agent_id="pinned")
    other_process(opened.uri, "turn", str(sid), "from elsewhere")  # the idle session moves
    wait_until(lambda: rt.agent_for_session(sid) is None, what="the moved agent dropped")
    before = read_log(opened.store, sid)
    with pytest.raises(AgentLetGo, match="moved to"):
        moved.run_turn("hello")
    assert read_log(opened.store, sid) == before
    assert rt.run_turn(sid, "back here").status == "completed"  # a new agent takes it back
