"""Issue 14, item 1: the usage of a model call is durable with its reply. ``usage``, the
per-model and per-turn figures and the spend budget count every model call whose reply is in
the log — after a live cancel of a parked step, a kill while parked, a kill mid-tool, a resume —
each exactly once; logs written before (usage on ``step/end``) keep their totals. Every test
runs on the SQLite store and on the EventStoreDB adapter (emulator)."""

from __future__ import annotations

import json
from typing import Any
from uuid import UUID, uuid4

import pytest
from pydantic import BaseModel

from terret import Actor, CallContext, RuntimeConfig, SessionRepository, Usage, tool
from terret.domain.store import NewRecord, StreamState, session_stream
from terret.runtime import Runtime
from tests.runtime.conftest import MakeRuntime, OpenedStore
from tests.runtime.kit import (
    LogBuilder,
    calls,
    final,
    only,
    other_process,
    read_log,
    turn_in_background,
    wait_parked,
)

OPERATOR = Actor(actor="operator", id="tests")
REPORTED = {"prompt_tokens": 111, "completion_tokens": 13, "cost": 0.01}
"""What ``tests/runtime/proc.py``'s scripted replies report."""


def replies_usage(rt: Runtime, sid: UUID) -> dict[str, Any]:
    """The oracle: the sum of what the replies in the log carry, read straight from the log."""
    total = {"prompt_tokens": 0, "completion_tokens": 0, "cost": 0.0, "steps": 0}
    for e in only(read_log(rt.store, sid), "assistant/message"):
        used = e.data.get("usage") or {}
        total["prompt_tokens"] += used.get("prompt_tokens", 0)
        total["completion_tokens"] += used.get("completion_tokens", 0)
        total["cost"] += used.get("cost", 0.0)
        total["steps"] += 1
    return total


def close(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return {**a, "cost": round(a["cost"], 9)} == {**b, "cost": round(b["cost"], 9)}


def everywhere(rt: Runtime, sid: UUID, expected: dict[str, Any]) -> None:
    """``usage``, ``--by model`` and ``--by turn`` (and a rebuild from the log, in a process
    that never saw the session) all say ``expected``; so does the budget's count."""
    fresh = Runtime(rt.store, resolver=rt.resolver)
    try:
        for runtime in (rt, fresh):
            assert close(runtime.usage(sid), expected), runtime.usage(sid)
            by_model = runtime.views.usage_by_model(sid)
            by_turn = runtime.views.usage_by_turn(sid)
            for split in (by_model, by_turn):
                summed = {"prompt_tokens": sum(u.prompt_tokens for u in split.values()),
                          "completion_tokens": sum(u.completion_tokens for u in split.values()),
                          "cost": sum(u.cost for u in split.values()),
                          "steps": sum(u.steps for u in split.values())}
                assert close(summed, expected), summed
        session = SessionRepository(rt.store).get(sid)
        assert session.state.total_cost == pytest.approx(expected["cost"])
    finally:
        fresh.close()


def test_a_live_cancel_of_a_parked_step_keeps_its_usage(make_runtime: MakeRuntime,
                                                         store) -> None:
    rt = make_runtime([calls(("deploy", {"env": "prod"}, "c-1"), usage=Usage(111, 13, 0.01))])
    sid = rt.create_session()
    job = turn_in_background(rt, sid, "ship it")
    wait_parked(rt, sid)
    rt.cancel(sid, by=OPERATOR, reason="not today")
    assert job.join().status == "cancelled"
    log = read_log(store, sid)
    assert not only(log, "step/end")  # the parked step never closed: its usage is on the reply
    expected = {**REPORTED, "steps": 1}
    assert close(replies_usage(rt, sid), expected)
    everywhere(rt, sid, expected)
    assert set(rt.views.usage_by_model(sid)) == {"scripted:default"}
    assert list(rt.views.usage_by_turn(sid)) == [1]


def test_a_cancel_from_another_process_while_parked_keeps_its_usage(
        make_runtime: MakeRuntime, opened: OpenedStore) -> None:
    rt = make_runtime([calls(("deploy", {"env": "prod"}, "c-1"), usage=Usage(111, 13, 0.01))])
    sid = rt.create_session()
    job = turn_in_background(rt, sid, "ship it")
    wait_parked(rt, sid)
    other_process(opened.uri, "cancel", str(sid))
    assert job.join().status == "cancelled"
    everywhere(rt, sid, {**REPORTED, "steps": 1})


def test_a_kill_while_parked_keeps_the_usage_and_a_cancel_counts_it_once(
        make_runtime: MakeRuntime, opened: OpenedStore) -> None:
    sid = make_runtime(start=False).create_session()
    assert other_process(opened.uri, "park", str(sid))["pending"] == ["c-park"]  # then died
    rt = make_runtime([final("deployed", usage=Usage(20, 2, 0.002))])
    everywhere(rt, sid, {**REPORTED, "steps": 1})
    rt.cancel(sid, by=OPERATOR)  # recorded: the resume closes the turn, its calls answered
    assert rt.resume_turn(sid).status == "cancelled"
    everywhere(rt, sid, {**REPORTED, "steps": 1})


def test_a_kill_while_parked_then_a_verdict_and_a_resume_count_each_call_once(
        make_runtime: MakeRuntime, opened: OpenedStore) -> None:
    sid = make_runtime(start=False).create_session()
    assert other_process(opened.uri, "park", str(sid))["pending"] == ["c-park"]  # then died
    other_process(opened.uri, "approve", str(sid), "c-park")
    rt = make_runtime([final("deployed", usage=Usage(20, 2, 0.002))], tools=[_deploy_as_parked])
    assert rt.resume_turn(sid).status == "completed"  # the approved deploy runs here
    expected = {"prompt_tokens": 131, "completion_tokens": 15, "cost": 0.012, "steps": 2}
    assert close(replies_usage(rt, sid), expected)
    everywhere(rt, sid, expected)
    (first_end, _) = only(read_log(opened.store, sid), "step/end")
    assert first_end.data == {"turn": 1, "step": 1, "resumed": True}  # no usage of its own


class _NoArgs(BaseModel):
    pass


@tool(args=_NoArgs, name="deploy", approval="always")
def _deploy_as_parked(args: _NoArgs, ctx: CallContext) -> str:
    """``deploy`` as the parking process defines it: a process whose tool no longer takes the
    arguments of a call a person approved refuses the session."""
    return "deployed"


@tool(args=_NoArgs, name="die")
def _die_survived(args: _NoArgs, ctx: CallContext) -> str:
    """The tool the killed process ran, as the resuming one defines it (it must: a process
    whose app lacks a tool the turn owes a call to refuses the session)."""
    return "not this time"


def test_a_kill_mid_tool_keeps_the_usage_of_the_reply(
        make_runtime: MakeRuntime, opened: OpenedStore) -> None:
    sid = make_runtime(start=False).create_session()
    other_process(opened.uri, "die-in-tool", str(sid), returncode=9)
    rt = make_runtime([final("recovered", usage=Usage(30, 3, 0.003))], tools=[_die_survived])
    everywhere(rt, sid, {**REPORTED, "steps": 1})
    assert rt.resume_turn(sid).status == "completed"  # `die` runs again here, and returns
    expected = {"prompt_tokens": 141, "completion_tokens": 16, "cost": 0.013, "steps": 2}
    assert close(replies_usage(rt, sid), expected)
    everywhere(rt, sid, expected)


def test_a_resume_after_a_final_reply_counts_both_model_calls_once(
        make_runtime: MakeRuntime, store) -> None:
    """R16: a turn that crashed after its final reply resumes with one extra model request;
    both replies are in the log, both count, the resumed step/end adds nothing."""
    dead = make_runtime(start=False)
    sid = dead.create_session()
    b = LogBuilder(store, sid)
    b.do(lambda s: s.start_turn(text="q"))
    b.do(lambda s: s.start_step("scripted:default"))
    from terret.domain.events import UsageData

    b.do(lambda s: s.record_assistant("almost", model="scripted:default",
                                      usage=UsageData(prompt_tokens=40, completion_tokens=4,
                                                      cost=0.04)))
    rt = make_runtime([final("there", usage=Usage(10, 1, 0.5))])
    assert rt.resume_turn(sid).status == "completed"
    expected = {"prompt_tokens": 50, "completion_tokens": 5, "cost": 0.54, "steps": 2}
    assert close(replies_usage(rt, sid), expected)
    everywhere(rt, sid, expected)


def test_a_provider_reporting_no_usage_counts_the_call_with_no_tokens(
        make_runtime: MakeRuntime, store) -> None:
    rt = make_runtime([calls(("noop", {}), usage=None), final(usage=Usage(5, 1, 0.1))])
    sid = rt.create_session()
    assert rt.run_turn(sid, "go").status == "completed"
    replies = only(read_log(store, sid), "assistant/message")
    assert [("usage" in e.data, e.data["model"]) for e in replies] == [
        (False, "scripted:default"), (True, "scripted:default")]
    everywhere(rt, sid, {"prompt_tokens": 5, "completion_tokens": 1, "cost": 0.1, "steps": 2})


def test_a_step_end_cannot_count_a_metered_reply_twice(make_runtime: MakeRuntime,
                                                       store) -> None:
    from terret.domain.errors import InvalidPayload
    from terret.domain.events import UsageData

    sid = make_runtime(start=False).create_session()
    b = LogBuilder(store, sid)
    b.do(lambda s: s.start_turn(text="q"))
    b.do(lambda s: s.start_step("scripted:default"))
    used = UsageData(prompt_tokens=1, completion_tokens=1, cost=0.1)
    with pytest.raises(InvalidPayload):
        b.do(lambda s: (s.record_assistant("a", model="scripted:default", usage=used),
                        s.end_step(used)))
    with pytest.raises(InvalidPayload):  # usage without the model that reported it
        b.do(lambda s: s.record_assistant("a", usage=used))
    assert [e.name for e in read_log(store, sid)][-1] == "step/start"  # nothing written


# --- logs written before: usage on step/end ------------------------------------------------


def _raw(wire_name: str, data: dict[str, Any], version: int = 1) -> NewRecord:
    return NewRecord(uuid4(), wire_name, json.dumps(data).encode(),
                     json.dumps({"schema_version": version}).encode())


def old_log(store: Any) -> UUID:
    """A session as an older Terret wrote it: replies without usage (assistant/message v1),
    usage on step/end (v2 nested, v1 flat), a resumed step without usage."""
    sid = uuid4()
    store.append(session_stream(sid), [
        _raw("session/started", {"agent": "default", "roles": {"main": "scripted:old"}}),
        _raw("turn/start", {"turn": 1}),
        _raw("user/message", {"text": "one"}),
        _raw("step/start", {"turn": 1, "step": 1, "model": "scripted:old"}),
        _raw("assistant/message", {"text": "", "tool_calls": [
            {"id": "c1", "name": "noop", "args": {}}]}),
        _raw("tool/result", {"call_id": "c1", "name": "noop", "content": "ok"}),
        _raw("step/end", {"turn": 1, "step": 1, "usage": {
            "prompt_tokens": 100, "completion_tokens": 10, "cost": 0.25}}, 2),
        _raw("step/start", {"turn": 1, "step": 2, "model": "scripted:older"}),
        _raw("assistant/message", {"text": "done"}),
        _raw("step/end", {"turn": 1, "step": 2, "prompt_tokens": 200, "completion_tokens": 20,
                          "cost": 0.5}, 1),
        _raw("turn/end", {"turn": 1, "status": "completed"}),
        _raw("turn/start", {"turn": 2}),
        _raw("user/message", {"text": "two"}),
        _raw("step/start", {"turn": 2, "step": 1, "model": "scripted:old"}),
        _raw("assistant/message", {"text": "", "tool_calls": [
            {"id": "c2", "name": "noop", "args": {}}]}),
        _raw("tool/result", {"call_id": "c2", "name": "noop", "content": "ok"}),
        _raw("step/end", {"turn": 2, "step": 1}, 2),  # resumed: no usage
        _raw("turn/end", {"turn": 2, "status": "completed"}),
    ], StreamState.NO_STREAM)
    return sid


def test_an_old_log_keeps_its_totals(make_runtime: MakeRuntime, store) -> None:
    sid = old_log(store)
    rt = make_runtime([final("new", usage=Usage(1, 1, 0.125))])
    assert close(rt.usage(sid), {"prompt_tokens": 300, "completion_tokens": 30, "cost": 0.75,
                                 "steps": 3})
    assert {k: v.as_dict() for k, v in rt.views.usage_by_model(sid).items()} == {
        "scripted:old": {"prompt_tokens": 100, "completion_tokens": 10, "cost": 0.25,
                         "steps": 2},
        "scripted:older": {"prompt_tokens": 200, "completion_tokens": 20, "cost": 0.5,
                           "steps": 1},
    }
    assert SessionRepository(store).get(sid).state.total_cost == 0.75
    # A new turn on the old session adds its metered reply, and nothing else.
    assert rt.run_turn(sid, "three").status == "completed"
    everywhere(rt, sid, {"prompt_tokens": 301, "completion_tokens": 31, "cost": 0.875,
                         "steps": 4})
    assert rt.views.usage_by_turn(sid)[3].as_dict() == {
        "prompt_tokens": 1, "completion_tokens": 1, "cost": 0.125, "steps": 1}


def test_the_compaction_trigger_reads_the_last_model_call_of_the_turn(
        make_runtime: MakeRuntime, store) -> None:
    """R19 with the usage on the reply: the last model call's prompt tokens."""
    rt = make_runtime([calls(("noop", {}), usage=Usage(500, 5)), final(usage=Usage(90, 5))],
                      config=RuntimeConfig(compaction_budget=100))
    sid = rt.create_session()
    rt.run_turn(sid, "go")
    rt.catch_up_views()
    assert rt.views.last_prompt_tokens(sid, 1) == 90


BIG = Usage(prompt_tokens=900, completion_tokens=600_000, cost=0.75)


def test_a_reply_too_long_for_the_store_is_cut_to_fit_and_its_cost_is_kept(
        make_runtime: MakeRuntime) -> None:
    """A 2 MiB reply failed the turn with ``PayloadTooLarge`` and its billed cost was never
    recorded; its text is now cut to fit, as a tool result's is, and the turn goes on."""
    from terret import Reply, ScriptedProvider
    from terret.runtime.step_commands import MAX_REPLY_BYTES
    from terret.runtime.tools import TRUNCATED_MARK

    rt = make_runtime(ScriptedProvider([Reply(text="é" * (1024 * 1024), usage=BIG)]))
    sid = rt.create_session()
    assert rt.run_turn(sid, "write a lot").status == "completed"
    (reply,) = only(read_log(rt.store, sid), "assistant/message")
    assert TRUNCATED_MARK in reply.data["text"] and "the reply was" in reply.data["text"]
    assert len(json.dumps(reply.data["text"], ensure_ascii=False).encode()) <= MAX_REPLY_BYTES + 2
    assert reply.data["usage"]["cost"] == 0.75
    everywhere(rt, sid, {"prompt_tokens": 900, "completion_tokens": 600_000, "cost": 0.75,
                         "steps": 1})


def test_a_reply_whose_calls_cannot_be_stored_fails_the_turn_and_keeps_its_cost(
        make_runtime: MakeRuntime) -> None:
    """Calls cannot be cut (their arguments are the call): the reply is recorded without
    them, with its usage, and the turn fails saying why."""
    from terret import Reply, ScriptedProvider, call
    from terret.domain.errors import PayloadTooLarge

    huge = Reply(text="writing", usage=BIG,
                 tool_calls=[call("noop", {"content": "x" * (600 * 1024)}, "c-big")])
    rt = make_runtime(ScriptedProvider([huge]))
    sid = rt.create_session()
    with pytest.raises(PayloadTooLarge, match="tool calls"):
        rt.run_turn(sid, "write a file")
    log = read_log(rt.store, sid)
    (reply,) = only(log, "assistant/message")
    assert reply.data["text"] == "writing" and not reply.data.get("tool_calls")
    assert reply.data["usage"]["cost"] == 0.75
    (end,) = only(log, "turn/end")
    assert end.data["status"] == "failed" and "tool calls" in end.data["error"]
    everywhere(rt, sid, {"prompt_tokens": 900, "completion_tokens": 600_000, "cost": 0.75,
                         "steps": 1})
