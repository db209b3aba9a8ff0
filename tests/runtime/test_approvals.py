"""Durable approvals (R8–R13) and the pre-execute waterfall they sit behind (R9)."""

from __future__ import annotations

import threading
from typing import Any
from uuid import UUID

import pytest
from hypothesis import given
from hypothesis import strategies as st

from terret import Actor, CallContext, Reply, ScriptedProvider, SessionRepository, Tool, call
from terret.domain.errors import ApprovalNotPending
from terret.domain.events import ToolCallData
from terret.runtime import ApprovalGate, Veto
from terret.runtime.approvals import ApprovalSignals
from terret.runtime.writer import SessionWriter
from tests.runtime.conftest import MakeRuntime, OpenedStore
from tests.runtime.kit import (
    DEADLINE,
    Background,
    Kit,
    LogBuilder,
    approve_all,
    calls,
    final,
    first_index,
    only,
    other_process,
    read_log,
    turn_in_background,
    wait_parked,
    wait_until,
)

USER = Actor(actor="user", id="alice")


def test_r8_approval_modes_never_policy_and_always(make_runtime: MakeRuntime, kit: Kit,
                                                   store) -> None:
    rt = make_runtime([
        Reply(tool_calls=[call("status", {"env": "a"}), call("inspect", {"env": "b"}),
                          call("migrate", {"env": "c"}), call("deploy", {"env": "d"})]),
        final(),
    ])
    sid = rt.create_session()
    result = approve_all(rt, sid, turn_in_background(rt, sid, "go"))
    assert result.status == "completed"
    log = read_log(store, sid)
    # never passes; policy asks only when mutating; always asks
    assert [e.data["name"] for e in only(log, "approval/requested")] == ["migrate", "deploy"]
    assert [name for name, _ in kit.ran] == ["status", "inspect", "migrate", "deploy"]
    assert not any(r.data["is_error"] for r in only(log, "tool/result"))


def test_r8_tool_definitions_default_to_never_and_not_mutating(kit: Kit) -> None:
    assert (kit.noop.approval, kit.noop.mutating, kit.noop.needs_approval()) == (
        "never", False, False)
    assert kit.migrate.needs_approval() and not kit.inspect.needs_approval()


def test_r9_the_waterfall_runs_parent_first_and_the_allow_list_settles_before_a_human(
        make_runtime: MakeRuntime, store) -> None:
    order: list[tuple[str, str]] = []

    def root(tool: Tool, ctx: CallContext) -> Veto | None:
        order.append(("root", tool.name))
        return None

    def agent_hook(tool: Tool, ctx: CallContext) -> Veto | None:
        order.append(("agent", tool.name))
        return None

    rt = make_runtime([
        Reply(tool_calls=[call("deploy", {"env": "prod"}), call("status", {"env": "prod"})]),
        final(),
    ], allow=["status"])
    rt.tool_context.pre_execute.append(root)
    sid = rt.create_session()
    rt.spawn_agent(sid).context.pre_execute.append(agent_hook)  # after the agent's allow-list
    assert rt.run_turn(sid, "go").status == "completed"
    # root first; the allow-list (the agent's first hook) vetoed deploy before agent_hook ran
    assert order == [("root", "deploy"), ("root", "status"), ("agent", "status")]
    log = read_log(store, sid)
    assert not only(log, "approval/requested")  # deploy (approval: always) was never asked
    deploy, status = only(log, "tool/result")
    assert deploy.data["is_error"] and "not allowed" in deploy.data["content"]
    assert not status.data["is_error"]


def test_r9_a_root_veto_wins_over_everything_after_it(make_runtime: MakeRuntime,
                                                      store) -> None:
    rt = make_runtime([calls(("deploy", {"env": "prod"})), final()], allow=[])
    rt.tool_context.pre_execute.append(lambda tool, ctx: Veto("root: change freeze"))
    sid = rt.create_session()
    rt.run_turn(sid, "go")
    (result,) = only(read_log(store, sid), "tool/result")
    assert result.data["content"] == "vetoed: root: change freeze"


def test_r10_parking_and_resolving_are_recorded_and_pending_lists_the_open_asks(
        make_runtime: MakeRuntime, kit: Kit, store) -> None:
    rt = make_runtime([
        Reply(tool_calls=[call("deploy", {"env": "prod"}, id="c-1"),
                          call("deploy", {"env": "eu"}, id="c-2")]),
        final(),
    ])
    sid = rt.create_session()
    job = turn_in_background(rt, sid, "go")
    assert wait_parked(rt, sid) == ["c-1"]
    rt.catch_up_views()
    assert [(p.call_id, p.name, p.args) for p in rt.views.pending(sid)] == [
        ("c-1", "deploy", {"env": "prod"})]
    rt.approve(sid, "c-1", by=USER, reason="looks right")
    wait_until(lambda: rt.pending(sid) == ["c-2"], what="the second ask")
    rt.deny(sid, "c-2", by=USER, reason="not on a Friday")
    assert job.join().status == "completed"
    assert rt.pending(sid) == []
    log = read_log(store, sid)
    assert [e.data for e in only(log, "approval/requested")] == [
        {"call_id": "c-1", "name": "deploy", "args": {"env": "prod"}},
        {"call_id": "c-2", "name": "deploy", "args": {"env": "eu"}},
    ]
    assert [e.data for e in only(log, "approval/resolved")] == [
        {"call_id": "c-1", "verdict": "approved", "reason": "looks right",
         "by": {"actor": "user", "id": "alice"}},
        {"call_id": "c-2", "verdict": "denied", "reason": "not on a Friday",
         "by": {"actor": "user", "id": "alice"}},
    ]
    ok, denied = only(log, "tool/result")
    assert ok.data["content"] == "deployed prod" and not ok.data["is_error"]
    assert denied.data["is_error"]
    assert denied.data["content"] == "deploy was denied by user: not on a Friday"
    assert kit.ran == [("deploy", {"env": "prod"})]
    # the request precedes its verdict, the verdict precedes the call's result
    assert (first_index(log, "approval/requested", call_id="c-1")
            < first_index(log, "approval/resolved", call_id="c-1")
            < first_index(log, "tool/result", call_id="c-1"))


@pytest.mark.parametrize("how", ["approve", "resolve-raw"])
def test_r10_a_verdict_from_another_process_resumes_the_parked_turn(
        make_runtime: MakeRuntime, opened: OpenedStore, kit: Kit, how: str) -> None:
    rt = make_runtime([calls(("deploy", {"env": "prod"})), final("shipped")])
    sid = rt.create_session()
    job = turn_in_background(rt, sid, "go")
    (call_id,) = wait_parked(rt, sid)
    other_process(opened.uri, how, str(sid), call_id)
    result = job.join()
    assert (result.status, result.text) == ("completed", "shipped")
    assert kit.ran == [("deploy", {"env": "prod"})]
    (verdict,) = only(read_log(opened.store, sid), "approval/resolved")
    assert verdict.data["by"] == {"actor": "operator", "id": "proc"}


def test_r10_a_denial_from_another_process_reaches_the_model(
        make_runtime: MakeRuntime, opened: OpenedStore, kit: Kit) -> None:
    provider = ScriptedProvider([calls(("deploy", {"env": "prod"})), final()])
    rt = make_runtime(provider)
    sid = rt.create_session()
    job = turn_in_background(rt, sid, "go")
    (call_id,) = wait_parked(rt, sid)
    other_process(opened.uri, "deny", str(sid), call_id, "prod is frozen")
    assert job.join().status == "completed"
    assert kit.ran == []
    tool_msg = [m for m in provider.requests[1].messages if m.role == "tool"]
    assert tool_msg[0].is_error and "prod is frozen" in tool_msg[0].text


def test_r10_a_parked_call_reads_the_session_once_to_decide_and_once_per_wake(
        make_runtime: MakeRuntime, kit: Kit, store, monkeypatch: pytest.MonkeyPatch) -> None:
    sid = make_runtime(start=False).create_session()
    b = LogBuilder(store, sid)
    b.do(lambda s: s.start_turn(text="go"))
    b.do(lambda s: s.start_step("scripted:default"))
    b.do(lambda s: s.record_assistant(
        "", [ToolCallData(id="c-1", name="deploy", args={"env": "prod"})]))
    writer, signals = SessionWriter(SessionRepository(store)), ApprovalSignals()
    reads: list[UUID] = []
    wakes: list[UUID] = []
    load, wait = writer.load, signals.wait

    def counted_load(session_id: UUID) -> Any:
        reads.append(session_id)
        return load(session_id)

    def counted_wait(session_id: UUID, seen: int, timeout: float) -> int:
        try:
            return wait(session_id, seen, timeout)
        finally:
            wakes.append(session_id)

    monkeypatch.setattr(writer, "load", counted_load)
    monkeypatch.setattr(signals, "wait", counted_wait)
    parked = threading.Event()
    gate = ApprovalGate(writer, signals, poll=60.0, on_park=parked.set)
    job = Background(lambda: gate(kit.deploy, CallContext(sid, "c-1", "deploy",
                                                           {"env": "prod"}, 1)))
    assert parked.wait(DEADLINE)
    for n in range(1, 4):  # wakes with nothing new in the log: the call parks again
        signals.signal(sid)
        wait_until(lambda n=n: len(wakes) >= n, what=f"wake {n}")
    assert not job.done
    b.do(lambda s: s.resolve_approval("c-1", "approved", by=USER))  # another writer's verdict
    signals.signal(sid)
    assert job.join() is None  # approved: the call runs
    assert len(wakes) >= 4
    assert len(reads) == 1 + len(wakes)  # one read before parking, then one per wake
    assert len(only(read_log(store, sid), "approval/requested")) == 1


def test_r11_only_a_pending_request_of_the_open_turn_can_be_resolved(
        make_runtime: MakeRuntime, store) -> None:
    rt = make_runtime([calls(("deploy", {"env": "prod"}, "c-1")), final()])
    sid = rt.create_session()
    with pytest.raises(ApprovalNotPending):  # no turn at all
        rt.approve(sid, "c-1", by=USER)
    job = turn_in_background(rt, sid, "go")
    wait_parked(rt, sid)
    before = read_log(store, sid)
    with pytest.raises(ApprovalNotPending):
        rt.approve(sid, "c-9", by=USER)  # never asked
    assert read_log(store, sid) == before
    rt.approve(sid, "c-1", by=USER)
    job.join()
    with pytest.raises(ApprovalNotPending):  # resolved, and its turn closed
        rt.deny(sid, "c-1", by=USER, reason="too late")


def test_r11_a_verdict_must_name_the_same_tool_and_arguments(make_runtime: MakeRuntime,
                                                            store) -> None:
    rt = make_runtime([calls(("deploy", {"env": "prod"}, "c-1")), final()])
    sid = rt.create_session()
    job = turn_in_background(rt, sid, "go")
    wait_parked(rt, sid)
    log = LogBuilder(store, sid)
    with pytest.raises(ApprovalNotPending):
        log.do(lambda s: s.resolve_approval("c-1", "approved", by=USER, name="deploy",
                                            args={"env": "staging"}))
    with pytest.raises(ApprovalNotPending):
        log.do(lambda s: s.resolve_approval("c-1", "approved", by=USER, name="migrate",
                                            args={"env": "prod"}))
    log.do(lambda s: s.resolve_approval("c-1", "approved", by=USER, name="deploy",
                                        args={"env": "prod"}))
    assert job.join().status == "completed"
    assert len(only(read_log(store, sid), "approval/resolved")) == 1


@pytest.mark.parametrize("verdict", ["approve", "deny"])
def test_r11_arguments_given_without_the_tool_name_bind_the_verdict_too(
        make_runtime: MakeRuntime, opened: OpenedStore, kit: Kit, verdict: str) -> None:
    """``approve(..., args=...)`` without ``name`` ignored the arguments: an approval of
    ``{"env": "staging"}`` ran the call pending with ``{"env": "prod"}`` (and any value, a
    string say, was taken). The arguments alone bind the verdict now; a value that is no JSON
    object is refused. Given from a runtime of its own (a web app's other worker)."""
    from terret.domain.errors import InvalidPayload

    rt = make_runtime([calls(("deploy", {"env": "prod"}, "c-1")), final("done")])
    sid = rt.create_session()
    job = turn_in_background(rt, sid, "go")
    wait_parked(rt, sid)
    other = make_runtime(start=False)
    decide = getattr(other, verdict)
    extra = {"reason": "not now"} if verdict == "deny" else {}
    before = read_log(opened.store, sid)
    with pytest.raises(ApprovalNotPending, match="different tool or arguments"):
        decide(sid, "c-1", by=USER, args={"env": "staging"}, **extra)
    for bad in ("prod", ["env", "prod"], {"env": {1, 2}}):
        with pytest.raises(InvalidPayload, match="args"):
            decide(sid, "c-1", by=USER, args=bad, **extra)
    with pytest.raises(InvalidPayload, match="name"):
        decide(sid, "c-1", by=USER, name=b"deploy", **extra)
    assert read_log(opened.store, sid) == before  # nothing written
    decide(sid, "c-1", by=USER, args={"env": "prod"}, **extra)
    assert job.join().status == "completed"
    assert kit.ran == ([("deploy", {"env": "prod"})] if verdict == "approve" else [])
    assert len(only(read_log(opened.store, sid), "approval/resolved")) == 1


def test_r11_a_call_id_reused_in_a_later_turn_is_asked_about_again(make_runtime: MakeRuntime,
                                                                   kit: Kit, store) -> None:
    rt = make_runtime([
        calls(("deploy", {"env": "prod"}, "c-1")), final(),
        calls(("deploy", {"env": "prod"}, "c-1")), final(),
    ])
    sid = rt.create_session()
    approve_all(rt, sid, turn_in_background(rt, sid, "first"))
    job = turn_in_background(rt, sid, "second")
    assert wait_parked(rt, sid) == ["c-1"]  # the closed turn's approval settled with it
    rt.deny(sid, "c-1", by=USER, reason="once was enough")
    assert job.join().status == "completed"
    log = read_log(store, sid)
    assert len(only(log, "approval/requested")) == 2
    assert kit.ran == [("deploy", {"env": "prod"})]


def test_r11_a_call_id_reused_in_the_same_turn_with_other_arguments_is_asked_again(
        make_runtime: MakeRuntime, kit: Kit, store) -> None:
    rt = make_runtime([
        calls(("deploy", {"env": "staging"}, "c-1")),
        calls(("deploy", {"env": "prod"}, "c-1")),  # a provider reusing an id
        final(),
    ])
    sid = rt.create_session()
    job = turn_in_background(rt, sid, "go")
    wait_parked(rt, sid)
    rt.approve(sid, "c-1", by=USER)  # approves staging
    wait_until(lambda: len(only(read_log(store, sid), "approval/requested")) == 2,
               what="a second ask for the same id with other arguments")
    rt.deny(sid, "c-1", by=USER, reason="prod needs a change ticket")
    assert job.join().status == "completed"
    assert kit.ran == [("deploy", {"env": "staging"})]
    requests = only(read_log(store, sid), "approval/requested")
    assert [r.data["args"] for r in requests] == [{"env": "staging"}, {"env": "prod"}]


@pytest.mark.parametrize("first", ["approved", "denied"])
def test_r11_a_call_id_reused_in_a_later_step_with_the_same_arguments_is_asked_again(
        make_runtime: MakeRuntime, kit: Kit, store, first: str) -> None:
    """Some servers number call ids afresh in every reply: the same id, tool and arguments in
    the next step is a new request. One approval ran the tool twice, and a denial was reused
    without asking."""
    rt = make_runtime([
        calls(("deploy", {"env": "prod"}, "call-1")),
        calls(("deploy", {"env": "prod"}, "call-1")),  # the model asks again
        final(),
    ])
    sid = rt.create_session()
    job = turn_in_background(rt, sid, "go")
    wait_parked(rt, sid)
    if first == "approved":
        rt.approve(sid, "call-1", by=USER)
    else:
        rt.deny(sid, "call-1", by=USER, reason="not now")
    wait_until(lambda: len(only(read_log(store, sid), "approval/requested")) == 2,
               what="a second ask for the repeated call")
    assert rt.pending(sid) == ["call-1"]
    rt.deny(sid, "call-1", by=USER, reason="once is enough")
    assert job.join().status == "completed"
    assert kit.ran == ([("deploy", {"env": "prod"})] if first == "approved" else [])
    assert len(only(read_log(store, sid), "approval/resolved")) == 2


def test_a_reason_past_the_limit_is_refused_before_anything_is_written(
        make_runtime: MakeRuntime, kit: Kit, store) -> None:
    """A cancel's reason is repeated for every call it stops, in one append: a long one made
    that append too large for EventStoreDB (1 MiB) and the turn could never close."""
    from terret.domain.errors import InvalidPayload
    from terret.domain.events import REASON_MAX

    rt = make_runtime([calls(("deploy", {"env": "prod"}, "c-1")), final()])
    sid = rt.create_session()
    job = turn_in_background(rt, sid, "go")
    wait_parked(rt, sid)
    before = read_log(store, sid)
    long = "x" * (REASON_MAX + 1)
    for refused in (lambda: rt.cancel(sid, by=USER, reason=long),
                    lambda: rt.deny(sid, "c-1", by=USER, reason=long),
                    lambda: rt.approve(sid, "c-1", by=USER, reason=long),
                    lambda: rt.set_budget(sid, 5.0, by=USER, reason=long)):
        with pytest.raises(InvalidPayload, match=f"at most {REASON_MAX} characters"):
            refused()
    assert read_log(store, sid) == before
    assert rt.cancel(sid, by=USER, reason="x" * REASON_MAX) is True  # at the limit: fine
    assert job.join().status == "cancelled"
    with pytest.raises(InvalidPayload, match="at most"):
        rt.close_session(sid, by=USER, reason=long)
    rt.close_session(sid, by=USER)
    closed = read_log(store, sid)
    with pytest.raises(InvalidPayload, match="at most"):  # the purge's is recorded too
        rt.purge(sid, by=USER, reason=long)
    assert read_log(store, sid) == closed
    assert kit.ran == []


def test_r11_a_second_verdict_is_told_which_verdict_stands(
        make_runtime: MakeRuntime, opened: OpenedStore) -> None:
    """The loser of two verdicts on a parked call nobody serves (its process died) was told
    only "not pending"; it is told what was decided, by whom, and nothing is written."""
    rt = make_runtime(start=False)
    sid = rt.create_session()
    other_process(opened.uri, "park", str(sid))
    other_process(opened.uri, "approve", str(sid), "c-park")
    before = read_log(opened.store, sid)
    with pytest.raises(ApprovalNotPending, match=r"decided already \(approved by operator proc"):
        rt.deny(sid, "c-park", by=USER, reason="too late")
    assert read_log(opened.store, sid) == before


def test_r12_no_timeout_by_default(make_runtime: MakeRuntime, store) -> None:
    rt = make_runtime([calls(("deploy", {"env": "prod"})), final()])
    assert rt.config.approval_max_wait is None
    sid = rt.create_session()
    job = turn_in_background(rt, sid, "go")
    (call_id,) = wait_parked(rt, sid)
    with pytest.raises(AssertionError):  # nothing resolves it on its own
        wait_until(lambda: only(read_log(store, sid), "approval/resolved"), timeout=1.1)
    assert rt.pending(sid) == [call_id] and not job.done
    rt.approve(sid, call_id, by=USER)
    assert job.join().status == "completed"


def test_r12_the_reaper_records_a_durable_denial_after_the_maximum_wait(
        make_runtime: MakeRuntime, kit: Kit, store) -> None:
    from terret import RuntimeConfig

    provider = ScriptedProvider([calls(("deploy", {"env": "prod"})), final()])
    rt = make_runtime(provider, config=RuntimeConfig(approval_max_wait=0.3))
    sid = rt.create_session()
    result = rt.run_turn(sid, "go")
    assert result.status == "completed"  # a reaped call is a denial, not a failure
    log = read_log(store, sid)
    (verdict,) = only(log, "approval/resolved")
    assert verdict.data["verdict"] == "denied"
    assert verdict.data["by"] == {"actor": "reaper"}
    (tool_result,) = only(log, "tool/result")
    assert tool_result.data["is_error"] and "denied by reaper" in tool_result.data["content"]
    assert kit.ran == []


@pytest.mark.parametrize("skew", [-3600.0, 3600.0], ids=["store behind", "store ahead"])
def test_r12_a_request_made_here_is_reaped_on_this_process_clock_whatever_the_stores(
        make_runtime: MakeRuntime, kit: Kit, opened: OpenedStore, skew: float,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """On EventStoreDB an event's recorded time is the server's clock. A server an hour
    behind had the reaper deny a call 7 ms after asking ("no verdict within 600s"); one an
    hour ahead left it an hour past its wait. The process that asks counts from its own
    clock (a request a dead process made still counts from the recorded time)."""
    import time

    from terret import RuntimeConfig
    from tests.support.esdb_emulator import store as emulator_store

    real = emulator_store.now_ticks
    monkeypatch.setattr(emulator_store, "now_ticks", lambda: real() + int(skew * 1e7))
    provider = ScriptedProvider([calls(("deploy", {"env": "prod"})), final()])
    rt = make_runtime(provider, config=RuntimeConfig(approval_max_wait=1.5))
    sid = rt.create_session()
    started = time.monotonic()
    job = turn_in_background(rt, sid, "go")
    wait_parked(rt, sid)
    assert job.join().status == "completed"
    waited = time.monotonic() - started
    assert 1.4 < waited < 10, waited
    (verdict,) = only(read_log(opened.store, sid), "approval/resolved")
    assert verdict.data["by"] == {"actor": "reaper"} and kit.ran == []


def test_r13_cancelling_a_parked_turn_records_the_cancel_then_denies_then_closes(
        make_runtime: MakeRuntime, kit: Kit, store) -> None:
    rt = make_runtime([calls(("deploy", {"env": "prod"}, "c-1")), final()])
    sid = rt.create_session()
    job = turn_in_background(rt, sid, "go")
    wait_parked(rt, sid)
    rt.cancel(sid, by=Actor(actor="operator", id="bob"), reason="wrong branch")
    result = job.join()
    assert result.status == "cancelled"
    log = read_log(store, sid)
    cancel = first_index(log, "turn/cancel_requested")
    denial = first_index(log, "approval/resolved", call_id="c-1")
    end = first_index(log, "turn/end")
    assert first_index(log, "approval/requested") < cancel < denial < end
    assert log[denial].data["verdict"] == "denied"
    assert log[denial].data["by"] == {"actor": "operator", "id": "bob"}
    assert log[end].data["status"] == "cancelled"
    assert log[end].data["by"] == {"actor": "operator", "id": "bob"}
    # the parked call is answered (an error) before the turn closes: no call is left owed
    answer = first_index(log, "tool/result", call_id="c-1")
    assert denial < answer < end
    assert log[answer].data["is_error"]
    assert log[answer].data["content"] == (
        "deploy was not run: the turn ended cancelled: wrong branch")
    assert kit.ran == []
    assert rt.pending(sid) == []
    rt.catch_up_views()
    assert rt.views.pending(sid) == []
    assert not rt.resumable(sid)


def test_r13_a_cancel_from_another_process_stops_a_parked_turn(
        make_runtime: MakeRuntime, opened: OpenedStore, kit: Kit) -> None:
    rt = make_runtime([calls(("deploy", {"env": "prod"})), final()])
    sid = rt.create_session()
    job = turn_in_background(rt, sid, "go")
    wait_parked(rt, sid)
    other_process(opened.uri, "cancel", str(sid))
    assert job.join().status == "cancelled"
    log = read_log(opened.store, sid)
    assert (first_index(log, "turn/cancel_requested") < first_index(log, "approval/resolved")
            < first_index(log, "turn/end"))
    assert only(log, "turn/end")[0].data["by"] == {"actor": "operator", "id": "proc"}
    assert kit.ran == []


@pytest.mark.parametrize("refused_first", [False, True], ids=["plain", "after-a-refusal"])
def test_r23_a_policy_recorded_while_a_call_waited_applies_once_it_is_approved(
        make_runtime: MakeRuntime, opened: OpenedStore, kit: Kit, refused_first: bool) -> None:
    """An operator's emergency stop (deny all, from another process) while a call waits for
    its verdict: the approval that follows does not run it — the call is vetoed, as the very
    next call would be — and the model is told why. Also after the serving process refused a
    verdict for the parked call (other arguments than those asked about:
    ``ApprovalNotPending``): a refused command drops the process's copy of the session, and the
    policy check after the approval read that dropped copy — the policy from before the park —
    and ran the call."""
    provider = ScriptedProvider([calls(("deploy", {"env": "prod"})), final()])
    rt = make_runtime(provider)
    sid = rt.create_session()
    job = turn_in_background(rt, sid, "go")
    (call_id,) = wait_parked(rt, sid)
    if refused_first:
        with pytest.raises(ApprovalNotPending):
            rt.approve(sid, call_id, by=USER, name="deploy", args={"env": "staging"})
    other_process(opened.uri, "policy", str(sid))  # no patterns: deny every tool
    other_process(opened.uri, "approve", str(sid), call_id)
    assert job.join().status == "completed"
    assert kit.ran == []
    (result,) = only(read_log(opened.store, sid), "tool/result")
    assert result.data["is_error"] and "not allowed by the session's policy" in \
        result.data["content"], result.data


def test_r11_a_verdict_after_the_turns_cancel_is_refused(
        make_runtime: MakeRuntime, opened: OpenedStore, kit: Kit) -> None:
    """A parked turn nobody serves (its process died) is cancelled from another process; an
    approval then would be accepted and never acted on (closing the turn denies the call), so
    it is refused and nothing is written. The next resume closes the turn with the denial."""
    sid = make_runtime().create_session()
    other_process(opened.uri, "park", str(sid))  # parked on c-park, then the process is gone
    other_process(opened.uri, "cancel", str(sid))
    before = read_log(opened.store, sid)
    rt = make_runtime([final()])
    assert rt.pending(sid) == []  # nothing an approval UI may offer
    for verdict in (lambda: rt.approve(sid, "c-park", by=USER),
                    lambda: rt.deny(sid, "c-park", by=USER, reason="no")):
        with pytest.raises(ApprovalNotPending, match="cancel is recorded"):
            verdict()
    assert read_log(opened.store, sid) == before
    assert rt.resume_turn(sid).status == "cancelled"
    (resolved,) = only(read_log(opened.store, sid), "approval/resolved")
    assert resolved.data["verdict"] == "denied"


def test_r23_a_policy_reset_goes_back_to_the_floor_of_the_release_that_runs_the_call(
        make_runtime: MakeRuntime, kit: Kit, opened: OpenedStore) -> None:
    """The session started under a release allowing every tool (its floor, ``*``, recorded
    in session/started); the release serving it now allows ``status`` alone (R32). An
    operator's reset from another process used to record the start's ``*`` as the session's
    policy, and the next call of a tool the serving release forbids ran. It withdraws the
    recorded policy now (``policy/reset``): the serving release's floor applies."""
    sid = make_runtime(start=False, allow=("*",)).create_session()
    other_process(opened.uri, "policy", str(sid), "status", "inspect")
    other_process(opened.uri, "policy-reset", str(sid))
    rt = make_runtime([calls(("status", {"env": "a"}), ("inspect", {"env": "b"})), final()],
                      allow=("status",))
    assert rt.run_turn(sid, "go").status == "completed"
    assert [name for name, _ in kit.ran] == ["status"]
    results = only(read_log(opened.store, sid), "tool/result")
    assert "not allowed by the session's policy" in results[1].data["content"]
    assert [e.name for e in read_log(opened.store, sid)].count("policy/reset") == 1
    assert rt.views.policy(sid) is None  # the view: nothing recorded in force


@given(st.lists(st.integers(0, 5), max_size=60), st.integers(1, 4))
def test_a_sessions_signal_generation_only_grows_and_every_signal_raises_it(
        order: list[int], keep: int) -> None:
    """The signals keep a generation for at most ``KEEP`` sessions (a serving process hears
    every session's turns: kept, they grew for weeks); dropping them must never let a wait
    miss a signal — a session's generation never goes back, and each signal moves it on."""
    signals = ApprovalSignals()
    signals.KEEP = keep
    sessions = [UUID(int=i + 1) for i in range(6)]
    seen = {s: signals.generation(s) for s in sessions}
    for i in order:
        signals.signal(sessions[i])
        now = {s: signals.generation(s) for s in sessions}
        assert all(now[s] >= seen[s] for s in sessions)
        assert now[sessions[i]] > seen[sessions[i]]
        seen = now
        assert len(signals._generation) <= keep


def test_a_parked_call_is_woken_by_its_verdict_after_other_sessions_pushed_its_signal_out(
        make_runtime: MakeRuntime, opened: OpenedStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Many sessions ending turns drop the parked session's signal entry: the verdict from
    another process still wakes the call at once (the poll is a minute: no poll saves it)."""
    monkeypatch.setattr(ApprovalSignals, "KEEP", 2)
    made = ApprovalGate.__init__

    def no_poll(self: ApprovalGate, *args: Any, **kwargs: Any) -> None:
        made(self, *args, **{**kwargs, "poll": 60.0})

    monkeypatch.setattr(ApprovalGate, "__init__", no_poll)
    rt = make_runtime(ScriptedProvider(default=lambda r: calls(("deploy", {"env": "prod"}))
                                       if r.messages[-1].text == "go" else final()))
    sid = rt.create_session()
    job = turn_in_background(rt, sid, "go")
    call_id = wait_parked(rt, sid)[0]
    for _ in range(6):  # each ends a turn: a signal of a session the entries did not hold
        rt.run_turn(rt.create_session(), "hi")
    other_process(opened.uri, "approve", str(sid), call_id)
    assert job.join(timeout=15).status == "completed"
