"""Turns and status: R1–R4, and what R21 records on steps."""

from __future__ import annotations

import pytest

from terret import (
    MAX_STEPS,
    Actor,
    AgentDefinition,
    Reply,
    RuntimeConfig,
    ScriptedProvider,
    Usage,
    call,
)
from terret.domain.errors import (
    ConfigurationError,
    MaxStepsExceeded,
    ProviderError,
    SessionOwned,
    TurnAlreadyRunning,
    TurnOpenInLog,
)
from terret.domain.events import REASON_MAX
from terret.runtime import Refusal, StepClaim
from tests.runtime.conftest import MakeRuntime
from tests.runtime.kit import (
    Kit,
    LogBuilder,
    agent_of,
    calls,
    final,
    held_turn,
    names,
    only,
    read_log,
    status_of,
    turn_in_background,
    wait_parked,
    wait_until,
)


def test_r1_status_idle_running_waiting_approval_running_idle(make_runtime: MakeRuntime,
                                                              store, gates) -> None:
    model_gate, final_gate = gates(), gates()
    provider = ScriptedProvider([
        calls(("deploy", {"env": "prod"}), gate=model_gate),
        final(gate=final_gate),
    ])
    rt = make_runtime(provider)
    sid = rt.create_session()
    agent = rt.spawn_agent(sid)
    assert agent.status == "idle"
    rt.catch_up_views()
    assert status_of(rt, sid) == "idle"

    job = turn_in_background(rt, sid, "ship it")
    wait_until(lambda: len(provider.requests) == 1, what="the first model request")
    assert agent.status == "running"
    rt.catch_up_views()
    assert status_of(rt, sid) == "running"

    model_gate.set()
    wait_parked(rt, sid)
    assert agent.status == "waiting_approval"
    rt.catch_up_views()
    assert status_of(rt, sid) == "waiting_approval"

    rt.approve(sid, rt.pending(sid)[0], by=Actor(actor="user"))
    wait_until(lambda: len(provider.requests) == 2, what="the second model request")
    assert agent.status == "running"
    final_gate.set()
    assert job.join().status == "completed"
    assert agent.status == "idle"
    rt.catch_up_views()
    assert status_of(rt, sid) == "idle"


def test_r1_a_parked_agent_refuses_a_new_turn_like_a_running_one(make_runtime: MakeRuntime,
                                                                 store, gates) -> None:
    model_gate = gates()
    provider = ScriptedProvider([
        calls(("noop", {}), gate=model_gate),
        calls(("deploy", {"env": "prod"})),
        final(),
    ])
    rt = make_runtime(provider)
    sid = rt.create_session()
    job = turn_in_background(rt, sid, "go")
    wait_until(lambda: provider.requests, what="the model request")
    with pytest.raises(TurnAlreadyRunning):  # running
        rt.run_turn(sid, "me too")
    model_gate.set()
    wait_parked(rt, sid)
    before = read_log(store, sid)
    with pytest.raises(TurnAlreadyRunning):  # parked: refused exactly the same way
        rt.run_turn(sid, "me too")
    with pytest.raises(TurnAlreadyRunning):
        rt.resume_turn(sid)
    assert read_log(store, sid) == before
    rt.approve(sid, rt.pending(sid)[0], by=Actor(actor="user"))
    assert job.join().status == "completed"


def test_r1_status_is_recorded_so_another_runtime_reads_it_from_the_log(
        make_runtime: MakeRuntime, store) -> None:
    rt = make_runtime([calls(("deploy", {"env": "prod"})), final()])
    sid = rt.create_session()
    job = turn_in_background(rt, sid, "go")
    wait_parked(rt, sid)
    observer = make_runtime()  # a fresh process's view of the same log
    observer.catch_up_views()
    status = observer.views.status(sid)
    assert status is not None and status.status == "waiting_approval"
    assert status.pending_approvals == 1 and status.turn_open
    rt.approve(sid, rt.pending(sid)[0], by=Actor(actor="user"))
    job.join()
    observer.catch_up_views()
    assert status_of(observer, sid) == "idle"


def test_r2_max_steps_the_26th_step_raises_and_the_turn_ends_failed(make_runtime: MakeRuntime,
                                                                    store) -> None:
    provider = ScriptedProvider(default=calls(("noop", {})))
    rt = make_runtime(provider)
    sid = rt.create_session()
    with pytest.raises(MaxStepsExceeded, match="26"):
        rt.run_turn(sid, "never stop")
    log = read_log(store, sid)
    assert MAX_STEPS == 25
    assert [e.data["step"] for e in only(log, "step/start")] == list(range(1, 26))
    assert len(provider.requests) == 25
    (end,) = only(log, "turn/end")
    assert end.data["status"] == "failed" and "26" in end.data["error"]
    assert log[-1].name in ("turn/end", "session/titled")
    assert not rt.resumable(sid)
    assert agent_of(rt, sid).status == "idle"


@pytest.mark.parametrize("where", ["runtime", "agent"])
def test_r2_the_step_cap_is_configurable(make_runtime: MakeRuntime, kit: Kit, store,
                                         where: str) -> None:
    provider = ScriptedProvider(default=calls(("noop", {})))
    if where == "runtime":
        rt = make_runtime(provider, config=RuntimeConfig(max_steps=3))
    else:
        rt = make_runtime(provider, definition=AgentDefinition(tools=kit.tools, allow=["*"],
                                                               max_steps=3))
    sid = rt.create_session()
    with pytest.raises(MaxStepsExceeded):
        rt.run_turn(sid, "loop")
    log = read_log(store, sid)
    assert len(only(log, "step/start")) == 3
    assert only(log, "turn/end")[0].data["status"] == "failed"


def test_r3_a_turn_closes_completed(make_runtime: MakeRuntime, store) -> None:
    rt = make_runtime([calls(("noop", {})), final("all done")])
    sid = rt.create_session()
    result = rt.run_turn(sid, "hello")
    assert (result.status, result.text, result.turn) == ("completed", "all done", 1)
    log = read_log(store, sid)
    assert names(log)[2:] [:10] == [
        "turn/start", "user/message", "step/start", "assistant/message", "tool/result",
        "step/end", "step/start", "assistant/message", "step/end", "turn/end",
    ]
    assert only(log, "turn/end")[0].data == {"turn": 1, "status": "completed"}
    assert not rt.resumable(sid)


def test_r3_a_turn_closes_cancelled(make_runtime: MakeRuntime, store, gates) -> None:
    held = held_turn(make_runtime, gates, "hello")
    rt, sid, job = held.rt, held.sid, held.job
    rt.cancel(sid, by=Actor(actor="user", id="u1"), reason="changed my mind")
    result = job.join()
    assert result.status == "cancelled"
    (end,) = only(read_log(store, sid), "turn/end")
    assert end.data["status"] == "cancelled"
    assert end.data["by"] == {"actor": "user", "id": "u1"}
    assert end.data["reason"] == "changed my mind"
    assert not rt.resumable(sid)


def test_r3_a_turn_closes_rejected_by_a_pre_step_hook(make_runtime: MakeRuntime, store) -> None:
    claims: list[StepClaim] = []

    def supervisor(claim: StepClaim) -> Refusal | None:
        claims.append(claim)
        return Refusal("supervisor", "maintenance window") if claim.step == 2 else None

    provider = ScriptedProvider([calls(("noop", {})), final()])
    rt = make_runtime(provider, pre_step=[supervisor])
    sid = rt.create_session()
    result = rt.run_turn(sid, "hello")
    assert result.status == "rejected"
    log = read_log(store, sid)
    assert len(only(log, "step/start")) == 1  # the refused step never started
    (end,) = only(log, "turn/end")
    assert end.data["by"] == {"actor": "supervisor"}
    assert end.data["reason"] == "maintenance window"
    assert [c.step for c in claims] == [1, 2]
    assert claims[0].model == "scripted:default" and claims[0].turn == 1
    assert len(provider.requests) == 1


def test_r3_a_refusal_names_its_component_by_id_and_a_foreign_actor_kind_is_refused(
        make_runtime: MakeRuntime, store) -> None:
    """``Refusal("policy-bot", …)`` failed every turn with a pydantic ValidationError (the
    log's actor kinds are fixed); now it is a ``ConfigurationError`` where it is made, and
    ``id`` names the component in ``turn/end``'s ``by``."""
    with pytest.raises(ConfigurationError, match="'policy-bot' is not one of"):
        Refusal("policy-bot", "no")
    rt = make_runtime([final()], pre_step=[
        lambda claim: Refusal("system", "outside business hours", id="hours-guard")])
    sid = rt.create_session()
    assert rt.run_turn(sid, "hello").status == "rejected"
    (end,) = only(read_log(store, sid), "turn/end")
    assert end.data["by"] == {"actor": "system", "id": "hours-guard"}


def test_r3_a_refusal_with_a_reason_no_append_could_hold_is_refused_where_made(
        make_runtime: MakeRuntime, store) -> None:
    """A hook's reason of megabytes made the turn's closing append too large for the store:
    ``run_turn`` raised ``PayloadTooLarge`` with the turn left open. Now the ``Refusal`` is
    refused where it is made; a hook that makes one fails its turn with that error."""
    Refusal("system", "x" * REASON_MAX)
    with pytest.raises(ConfigurationError, match=f"at most {REASON_MAX} characters"):
        Refusal("system", "x" * (REASON_MAX + 1))
    with pytest.raises(ConfigurationError, match="a reason is text"):
        Refusal("system", 123)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="a reason is text"):
        Refusal("system", None)  # type: ignore[arg-type]
    rt = make_runtime([final()], pre_step=[lambda claim: Refusal("system", "x" * 1_200_000)])
    sid = rt.create_session()
    with pytest.raises(ConfigurationError, match="Refusal reason"):
        rt.run_turn(sid, "hello")
    (end,) = only(read_log(store, sid), "turn/end")
    assert end.data["status"] == "failed" and "at most 2000" in end.data["error"]
    assert not rt.resumable(sid)


def test_r3_an_agent_definition_hook_can_reject_too(make_runtime: MakeRuntime, kit: Kit,
                                                   store) -> None:
    definition = AgentDefinition(tools=kit.tools, allow=["*"],
                                 pre_step=[lambda c: Refusal("operator", "frozen")])
    rt = make_runtime([final()], definition=definition)
    sid = rt.create_session()
    assert rt.run_turn(sid, "hello").status == "rejected"
    assert only(read_log(store, sid), "turn/end")[0].data["by"] == {"actor": "operator"}


def test_r3_a_turn_with_nothing_to_say_closes_empty(make_runtime: MakeRuntime, store) -> None:
    provider = ScriptedProvider([final()])
    rt = make_runtime(provider)
    sid = rt.create_session()
    assert rt.run_turn(sid, None).status == "empty"
    log = read_log(store, sid)
    assert not only(log, "step/start") and not provider.requests
    assert only(log, "turn/end")[0].data["status"] == "empty"
    assert not rt.resumable(sid)
    # Text of spaces only is no text either (it cost a model request, recorded as a message).
    for blank in ("", "   ", " \n\t "):
        assert rt.run_turn(sid, blank).status == "empty"
    assert not only(read_log(store, sid), "user/message") and not provider.requests


def test_r3_a_turn_closes_failed_when_an_exception_leaves_it(make_runtime: MakeRuntime,
                                                            store) -> None:
    provider = ScriptedProvider([Reply(raises=ProviderError("scripted", "upstream is down"))])
    rt = make_runtime(provider)
    sid = rt.create_session()
    with pytest.raises(ProviderError):
        rt.run_turn(sid, "hello")
    (end,) = only(read_log(store, sid), "turn/end")
    assert end.data["status"] == "failed"
    assert "upstream is down" in end.data["error"]
    assert not rt.resumable(sid)
    assert agent_of(rt, sid).status == "idle"
    provider.script(final("back"))
    assert rt.run_turn(sid, "again").status == "completed"  # the failure was terminal, not sticky


def test_r3_tool_argument_errors_and_handler_exceptions_are_results_not_turn_failures(
        make_runtime: MakeRuntime, kit: Kit, store) -> None:
    provider = ScriptedProvider([
        Reply(tool_calls=[call("count", {"n": "many"}), call("boom"), call("nosuch"),
                          call("count", {"n": 41})]),
        final("recovered"),
    ])
    rt = make_runtime(provider)
    sid = rt.create_session()
    assert rt.run_turn(sid, "try things").status == "completed"
    results = only(read_log(store, sid), "tool/result")
    assert [(r.data["name"], r.data["is_error"]) for r in results] == [
        ("count", True), ("boom", True), ("nosuch", True), ("count", False)]
    assert "invalid arguments for count" in results[0].data["content"]
    assert "n" in results[0].data["content"]
    assert "RuntimeError: the disk is on fire" in results[1].data["content"]
    assert "unknown tool" in results[2].data["content"]
    assert results[3].data["content"] == "42"
    assert kit.ran == [("boom", {}), ("count", {"n": 41})]  # invalid calls never ran
    seen = provider.requests[1].messages
    assert [m.is_error for m in seen if m.role == "tool"] == [True, True, True, False]


def test_r4_run_turn_on_an_open_turn_in_the_log_raises_and_appends_nothing(
        make_runtime: MakeRuntime, store) -> None:
    rt = make_runtime([final()])
    sid = rt.create_session()
    LogBuilder(store, sid).do(lambda s: s.start_turn(text="a turn a dead process left open"))
    fresh = make_runtime([final()])  # the next process
    fresh.spawn_agent(sid)
    before = read_log(store, sid)
    with pytest.raises(TurnOpenInLog):
        fresh.run_turn(sid, "new question")
    assert read_log(store, sid) == before
    assert fresh.resumable(sid)
    assert agent_of(fresh, sid).status == "idle"


def test_run_turn_on_a_turn_another_live_worker_runs_is_session_owned(
        make_runtime: MakeRuntime, store, gates) -> None:
    """docs/runtime.md (one session, one executor): mid-turn, owned by another live worker,
    ``run_turn`` is ``SessionOwned`` — not ``TurnOpenInLog``, which says a process died in it
    and points at a resume that would be refused too."""
    held = held_turn(make_runtime, gates, "first")
    worker, sid, gate, job = held.rt, held.sid, held.gate, held.job
    other = make_runtime([final()])  # another worker, with a lease of its own
    before = read_log(store, sid)
    with pytest.raises(SessionOwned, match=f"in worker {worker.lease.worker}"):
        other.run_turn(sid, "second")
    with pytest.raises(SessionOwned):
        other.resume_turn(sid)
    assert read_log(store, sid) == before
    gate.set()
    assert job.join().status == "completed"
    assert other.run_turn(sid, "now").status == "completed"  # idle: moved to the caller


def test_r4_run_turn_on_an_agent_mid_turn_raises_turn_already_running(
        make_runtime: MakeRuntime, store, gates) -> None:
    gate = gates()
    provider = ScriptedProvider([final(gate=gate)])
    rt = make_runtime(provider)
    sid = rt.create_session()
    job = turn_in_background(rt, sid, "first")
    wait_until(lambda: provider.requests, what="the model request")
    before = read_log(store, sid)
    with pytest.raises(TurnAlreadyRunning) as raised:
        rt.run_turn(sid, "second")
    assert not isinstance(raised.value, TurnOpenInLog)
    assert read_log(store, sid) == before
    gate.set()
    assert job.join().status == "completed"
    assert len(only(read_log(store, sid), "turn/start")) == 1


def test_r21_step_start_records_the_model_and_the_reply_its_usage(make_runtime: MakeRuntime,
                                                                   store) -> None:
    """The usage of a model call is durable with its reply (``assistant/message`` v2, with the
    model that answered); the ``step/end`` carries none, so nothing is counted twice."""
    provider = ScriptedProvider([
        calls(("noop", {}), usage=Usage(100, 10, 0.5)),
        final(usage=Usage(150, 5, 0.25)),
        final(usage=Usage(7, 1, None)),
    ])
    rt = make_runtime(provider)
    sid = rt.create_session()
    rt.run_turn(sid, "one")
    rt.set_model(sid, "main", "scripted:bigger", by=Actor(actor="operator"))
    rt.run_turn(sid, "two")
    log = read_log(store, sid)
    assert [e.data["model"] for e in only(log, "step/start")] == [
        "scripted:default", "scripted:default", "scripted:bigger"]
    assert [r.model for r in provider.requests] == ["default", "default", "bigger"]
    replies = only(log, "assistant/message")
    assert [e.data.get("usage") for e in replies] == [
        {"prompt_tokens": 100, "completion_tokens": 10, "cost": 0.5},
        {"prompt_tokens": 150, "completion_tokens": 5, "cost": 0.25},
        {"prompt_tokens": 7, "completion_tokens": 1},
    ]
    assert [e.data["model"] for e in replies] == [
        "scripted:default", "scripted:default", "scripted:bigger"]
    assert [set(e.data) for e in only(log, "step/end")] == [{"turn", "step"}] * 3


def test_r17_every_request_shows_the_model_exactly_what_the_messages_projection_holds(
        make_runtime: MakeRuntime, store, gates) -> None:
    gate = gates()
    provider = ScriptedProvider([
        calls(("noop", {})),
        Reply(tool_calls=[call("status", {"env": "x"}), call("boom")], gate=gate),
        calls(("count", {"n": 1})),
        final("first done"),
        calls(("nosuch", {})),
        final("second done"),
    ])
    rt = make_runtime(provider)
    sid = rt.create_session()
    rt.inject(sid, "queued before the turn")
    job = turn_in_background(rt, sid, "go")
    wait_until(lambda: len(provider.requests) == 2, what="the second step")
    rt.inject(sid, "queued during the turn")
    gate.set()
    job.join()
    rt.run_turn(sid, "again")
    rt.catch_up_views()
    projected = rt.views.messages(sid)
    assert len(provider.requests) == 6
    for request in provider.requests:  # "model-visible means logged", in order, nothing more
        assert list(request.messages) == projected[:len(request.messages)]
    sizes = [len(r.messages) for r in provider.requests]
    assert sizes == sorted(set(sizes))
    assert [m.text for m in provider.requests[2].messages if m.role == "user"] == [
        "queued before the turn", "go", "queued during the turn"]
