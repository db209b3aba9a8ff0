"""Issue 14, item 3: in-doubt tool calls. A tool that may not run twice (``idempotent=False``)
gets a durable ``tool/started`` before its handler runs; a started call without a result (its
process died mid-handler) is never re-run automatically: the resumed turn parks on it
(``tool/in_doubt``) until an operator, from any process, lets it run again or records it as not
run again. Every call has an idempotency key shared by all its executions. On the SQLite store
and the EventStoreDB emulator."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from pydantic import BaseModel

from terret import Actor, CallContext, Reply, ScriptedProvider, Tool, Usage, call, tool
from terret.domain import errors
from terret.domain.events import ToolCallData
from terret.domain.store import session_stream
from tests.runtime.conftest import MakeRuntime, OpenedStore
from tests.runtime.kit import (
    Background,
    LogBuilder,
    final,
    names,
    only,
    other_process,
    read_log,
    wait_until,
)

OPERATOR = Actor(actor="operator", id="tests")


class Amount(BaseModel):
    amount: int


class Payments:
    """A payment tool that may not run twice; it notes every execution's idempotency key and
    what the log held when its handler started."""

    def __init__(self, store: Any) -> None:
        self.keys: list[str] = []
        self.logged_before: list[list[str]] = []
        payments = self

        @tool(args=Amount, idempotent=False)
        def pay(args: Amount, ctx: CallContext) -> str:
            """Charges a card."""
            payments.keys.append(ctx.idempotency_key)
            payments.logged_before.append(
                [r.wire_name for r in store.read_stream(session_stream(ctx.session_id))])
            return f"charged {args.amount}"

        self.pay: Tool = pay


def pays(*, then: str = "paid") -> ScriptedProvider:
    return ScriptedProvider([Reply(tool_calls=[call("pay", {"amount": 5}, "c-pay")],
                                   usage=Usage(1, 1, 0.01))], default=final(then))


def answers(text: str = "paid") -> ScriptedProvider:
    """The model of a resuming process: the call is in the log already; it answers."""
    return ScriptedProvider(default=final(text))


def killed_mid_payment(make_runtime: MakeRuntime, opened: OpenedStore, tmp_path: Path
                       ) -> tuple[UUID, str]:
    """A session whose turn's process died inside ``pay``'s handler; returns it and the
    idempotency key that execution had."""
    sid = make_runtime(start=False).create_session()
    keyfile = tmp_path / "keys.txt"
    other_process(opened.uri, "die-in-payment", str(sid), str(keyfile), returncode=9)
    (key,) = keyfile.read_text().split()
    return sid, key


def parked_in_doubt(rt: Any, sid: UUID) -> None:
    wait_until(lambda: (a := rt.agent_for_session(sid)) is not None
               and a.status == "waiting_in_doubt", what="the turn parked on a call in doubt")


@dataclass
class ResumedInDoubt:
    """A turn killed inside ``pay``, resumed by this test's runtime and parked on the call."""

    sid: UUID
    first_key: str
    payments: Payments
    rt: Any
    job: Background


def resumed_in_doubt(make_runtime: MakeRuntime, opened: OpenedStore,
                     tmp_path: Path) -> ResumedInDoubt:
    sid, first_key = killed_mid_payment(make_runtime, opened, tmp_path)
    payments = Payments(opened.store)
    rt = make_runtime(answers(), tools=[payments.pay])
    job = Background(lambda: rt.resume_turn(sid))
    parked_in_doubt(rt, sid)
    return ResumedInDoubt(sid, first_key, payments, rt, job)


def test_a_tool_that_may_not_run_twice_is_recorded_as_started_before_its_handler_runs(
        make_runtime: MakeRuntime, store) -> None:
    payments = Payments(store)
    rt = make_runtime(pays(), tools=[payments.pay])
    sid = rt.create_session()
    assert rt.run_turn(sid, "pay").status == "completed"
    (seen,) = payments.logged_before
    assert seen[-2:] == ["assistant/message", "tool/started"]  # durable before it ran
    log = read_log(store, sid)
    (started,) = only(log, "tool/started")
    assert started.data == {"call_id": "c-pay", "name": "pay"}
    assert [e.name for e in log if e.seq > started.seq][0] == "tool/result"


def test_idempotent_tools_write_no_started_record(make_runtime: MakeRuntime, store) -> None:
    rt = make_runtime(ScriptedProvider([Reply(tool_calls=[call("noop", {}, "c-1")])],
                                       default=final()))
    sid = rt.create_session()
    assert rt.run_turn(sid, "go").status == "completed"
    assert "tool/started" not in names(read_log(store, sid))


def test_the_idempotency_key_is_the_same_for_every_execution_of_a_call_and_only_its_own() -> None:
    sid = UUID(int=7)
    one = CallContext(sid, "c-1", "pay", {"amount": 5}, 3)
    again = CallContext(sid, "c-1", "pay", {"amount": 5}, 3)
    assert one.idempotency_key == again.idempotency_key
    assert UUID(one.idempotency_key).version == 5
    others = [CallContext(sid, "c-2", "pay", {}, 3), CallContext(sid, "c-1", "pay", {}, 4),
              CallContext(UUID(int=8), "c-1", "pay", {}, 3)]
    assert one.idempotency_key not in {c.idempotency_key for c in others}


def test_a_call_id_reused_by_a_later_step_of_the_turn_is_another_call_with_its_own_key(
        make_runtime: MakeRuntime, store: Any) -> None:
    """Two payments of one turn under the same call id (a provider that reuses ids): both ran,
    with the same idempotency key — an API deduplicating on it dropped the second charge
    while the model was told it was made. The first use keeps the key it always had."""
    payments = Payments(store)
    provider = ScriptedProvider([
        Reply(tool_calls=[call("pay", {"amount": 1}, "c-z")]),
        Reply(tool_calls=[call("pay", {"amount": 2}, "c-z")]),
        final("paid twice")])
    rt = make_runtime(provider, tools=[payments.pay])
    sid = rt.create_session()
    assert rt.run_turn(sid, "pay 1 then 2").status == "completed"
    first, second = payments.keys
    assert first != second
    assert first == CallContext(sid, "c-z", "pay", {"amount": 1}, 1).idempotency_key


def test_a_call_in_doubt_after_a_kill_mid_handler_parks_and_reruns_on_another_process_verdict(
        make_runtime: MakeRuntime, opened: OpenedStore, tmp_path: Path) -> None:
    store = opened.store
    sid, first_key = killed_mid_payment(make_runtime, opened, tmp_path)
    assert names(read_log(store, sid))[-2:] == ["assistant/message", "tool/started"]
    payments = Payments(store)
    rt = make_runtime(answers(), tools=[payments.pay])
    job = Background(lambda: rt.resume_turn(sid))
    parked_in_doubt(rt, sid)
    assert payments.keys == []  # never re-run automatically
    log = read_log(store, sid)
    (doubt,) = only(log, "tool/in_doubt")
    assert doubt.data == {"call_id": "c-pay", "name": "pay", "args": {"amount": 5}}
    assert rt.in_doubt(sid) == ["c-pay"]
    rt.catch_up_views()
    status = rt.views.status(sid)
    assert status is not None and status.status == "waiting_in_doubt"
    assert [(s.session, c["id"]) for s, c in rt.views.in_doubt()] == [(status.session, "c-pay")]
    assert rt.pending(sid) == []  # not an approval

    other_process(opened.uri, "rerun", str(sid), "c-pay")
    assert job.join().status == "completed"
    assert payments.keys == [first_key]  # one more execution, with the same key
    log = read_log(store, sid)
    (verdict,) = only(log, "tool/in_doubt_resolved")
    assert verdict.data["verdict"] == "rerun" and verdict.data["by"] == {
        "actor": "operator", "id": "proc"}
    assert names(log)[names(log).index("tool/in_doubt_resolved"):][:3] == [
        "tool/in_doubt_resolved", "tool/started", "tool/result"]
    (result,) = only(log, "tool/result")
    assert result.data == {"call_id": "c-pay", "name": "pay", "content": "charged 5",
                           "is_error": False}
    rt.catch_up_views()
    assert rt.views.in_doubt(sid) == []


def test_the_emergency_stop_holds_for_a_call_in_doubt_an_operator_reruns(
        make_runtime: MakeRuntime, opened: OpenedStore, tmp_path: Path) -> None:
    """A deny-all recorded while the call waited in doubt (R23) applies to its re-run, as to
    any next call: the rerun verdict does not run it. (It was checked against the policy read
    before the wait.)"""
    store = opened.store
    resumed = resumed_in_doubt(make_runtime, opened, tmp_path)
    sid, payments, rt, job = resumed.sid, resumed.payments, resumed.rt, resumed.job
    with pytest.raises(errors.CallNotInDoubt):  # refused here: the process drops its copy
        rt.rerun(sid, "c-other", by=OPERATOR)
    other_process(opened.uri, "policy", str(sid))  # no patterns: deny every tool
    other_process(opened.uri, "rerun", str(sid), "c-pay")
    assert job.join().status == "completed"
    assert payments.keys == []
    (result,) = only(read_log(store, sid), "tool/result")
    assert result.data["is_error"] and "not allowed by the session's policy" in \
        result.data["content"], result.data


def test_a_call_in_doubt_recorded_as_not_run_again_shows_the_model_an_error(
        make_runtime: MakeRuntime, opened: OpenedStore, tmp_path: Path) -> None:
    sid, _ = killed_mid_payment(make_runtime, opened, tmp_path)
    payments = Payments(opened.store)
    provider = answers("I will check the card statement")
    rt = make_runtime(provider, tools=[payments.pay])
    job = Background(lambda: rt.resume_turn(sid))
    parked_in_doubt(rt, sid)
    other_process(opened.uri, "skip", str(sid), "c-pay", "charged already, per the bank")
    assert job.join().status == "completed"
    assert payments.keys == []  # it never ran again
    (result,) = only(read_log(opened.store, sid), "tool/result")
    assert result.data["is_error"] is True
    assert "not run again" in result.data["content"]
    assert "charged already, per the bank" in result.data["content"]
    (request,) = provider.requests  # the model saw the error as the call's result
    assert request.messages[-1].role == "tool" and request.messages[-1].is_error
    assert request.messages[-1].tool_call_id == "c-pay"


def test_a_cancel_while_in_doubt_closes_the_turn_saying_the_outcome_is_unknown(
        make_runtime: MakeRuntime, opened: OpenedStore, tmp_path: Path) -> None:
    sid, _ = killed_mid_payment(make_runtime, opened, tmp_path)
    payments = Payments(opened.store)
    rt = make_runtime(answers(), tools=[payments.pay])
    job = Background(lambda: rt.resume_turn(sid))
    parked_in_doubt(rt, sid)
    other_process(opened.uri, "cancel", str(sid))
    assert job.join().status == "cancelled"
    assert payments.keys == []
    (result,) = only(read_log(opened.store, sid), "tool/result")
    assert result.data["is_error"] and "whether it took effect is unknown" in \
        result.data["content"]


def test_verdicts_are_bound_to_a_call_in_doubt_of_the_open_turn(
        make_runtime: MakeRuntime, store) -> None:
    rt = make_runtime(start=False)
    sid = rt.create_session()
    b = LogBuilder(store, sid)
    b.do(lambda s: s.start_turn(text="pay"))
    b.do(lambda s: s.start_step("scripted:default"))
    b.do(lambda s: s.record_assistant("", [ToolCallData(id="c-pay", name="pay",
                                                        args={"amount": 5})]))
    with pytest.raises(errors.CallNotInDoubt):  # not started: nothing to doubt
        b.do(lambda s: s.mark_in_doubt("c-pay", "pay"))
    b.do(lambda s: s.start_tool("c-pay", "pay"))
    with pytest.raises(errors.CallInDoubt):  # started, no result, no verdict: never again
        b.do(lambda s: s.start_tool("c-pay", "pay"))
    with pytest.raises(errors.CallNotInDoubt):  # no turn has parked on it yet
        rt.rerun(sid, "c-pay", by=OPERATOR)
    b.do(lambda s: s.mark_in_doubt("c-pay", "pay"))
    with pytest.raises(errors.CallNotInDoubt):
        rt.rerun(sid, "c-other", by=OPERATOR)
    with pytest.raises(errors.CallNotInDoubt):  # decided on other arguments
        b.do(lambda s: s.resolve_in_doubt("c-pay", "rerun", by=OPERATOR, name="pay",
                                          args={"amount": 6}))
    rt.rerun(sid, "c-pay", by=OPERATOR)
    # Decided already — said so, not "not in doubt yet … resume the turn to mark it", which sent
    # the operator who lost the race to a needless `terret resume`.
    with pytest.raises(errors.CallNotInDoubt, match=r"^call 'c-pay' was decided already "
                       r"\(rerun by operator tests\): that verdict stands$"):
        rt.skip(sid, "c-pay", by=OPERATOR, reason="no")
    b.do(lambda s: s.start_tool("c-pay", "pay"))  # the rerun verdict allows one more start
    with pytest.raises(errors.CallInDoubt):  # and only one
        b.do(lambda s: s.start_tool("c-pay", "pay"))


def test_a_rerun_that_dies_again_is_in_doubt_again(make_runtime: MakeRuntime, store) -> None:
    sid = make_runtime(start=False).create_session()
    b = LogBuilder(store, sid)
    b.do(lambda s: s.start_turn(text="pay"))
    b.do(lambda s: s.start_step("scripted:default"))
    b.do(lambda s: s.record_assistant("", [ToolCallData(id="c-pay", name="pay",
                                                        args={"amount": 5})]))
    b.do(lambda s: s.start_tool("c-pay", "pay"))
    b.do(lambda s: s.mark_in_doubt("c-pay", "pay"))
    b.do(lambda s: s.resolve_in_doubt("c-pay", "rerun", by=OPERATOR))
    b.do(lambda s: s.start_tool("c-pay", "pay"))  # the re-run, and its process died too
    payments = Payments(store)
    rt = make_runtime(answers(), tools=[payments.pay])
    job = Background(lambda: rt.resume_turn(sid))
    parked_in_doubt(rt, sid)
    assert payments.keys == [] and len(only(read_log(store, sid), "tool/in_doubt")) == 2
    rt.skip(sid, "c-pay", by=OPERATOR, reason="twice is enough")
    assert job.join().status == "completed"
    assert payments.keys == []


def test_a_restarted_process_parks_again_on_the_same_call_without_a_second_record(
        make_runtime: MakeRuntime, opened: OpenedStore, tmp_path: Path) -> None:
    sid, key = killed_mid_payment(make_runtime, opened, tmp_path)
    first = make_runtime(answers(), tools=[Payments(opened.store).pay])
    job = Background(lambda: first.resume_turn(sid))
    parked_in_doubt(first, sid)
    first.close()  # a graceful stop leaves the park; the turn stays open
    with pytest.raises(Exception):  # noqa: B017 - TurnSuspended
        job.join()
    payments = Payments(opened.store)
    second = make_runtime(answers(), tools=[payments.pay])
    job = Background(lambda: second.resume_turn(sid))
    parked_in_doubt(second, sid)
    assert len(only(read_log(opened.store, sid), "tool/in_doubt")) == 1
    second.rerun(sid, "c-pay", by=OPERATOR)
    assert job.join().status == "completed"
    assert payments.keys == [key]


def test_rerun_and_skip_through_the_api_are_bound_to_the_tool_and_arguments_given(
        make_runtime: MakeRuntime, opened: OpenedStore, tmp_path: Path) -> None:
    """The CLI's ``in-doubt rerun|skip --tool/--args`` decided exactly the call looked at;
    ``Runtime.rerun``/``skip`` took no ``name``/``args`` (``TypeError``), unlike ``approve``."""
    from terret.domain.errors import CallNotInDoubt

    store = opened.store
    resumed = resumed_in_doubt(make_runtime, opened, tmp_path)
    sid, payments, rt, job = resumed.sid, resumed.payments, resumed.rt, resumed.job
    before = read_log(store, sid)
    for wrong in ({"name": "refund"}, {"args": {"amount": 500}}):
        with pytest.raises(CallNotInDoubt):
            rt.rerun(sid, "c-pay", by=OPERATOR, **wrong)  # type: ignore[arg-type]
        with pytest.raises(CallNotInDoubt):
            rt.skip(sid, "c-pay", by=OPERATOR, reason="no",
                    **wrong)  # type: ignore[arg-type]
    from terret.domain.errors import ApprovalNotPending

    with pytest.raises(ApprovalNotPending, match=r"in doubt .*in-doubt rerun\|skip"):
        rt.approve(sid, "c-pay", by=OPERATOR)  # an approval cannot decide it: said so
    assert read_log(store, sid) == before
    rt.rerun(sid, "c-pay", by=OPERATOR, name="pay", args={"amount": 5})
    assert job.join().status == "completed" and payments.keys == [resumed.first_key]
