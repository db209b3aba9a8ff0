"""Resume (R14–R16): a log a dead process left with an open turn, completed by a fresh runtime.

The dead process's log is built through the ``Session`` aggregate, stopping exactly where a
crash would; ``tests/lifecycle`` does the same with real SIGKILLs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from uuid import UUID

import pytest

from terret import Actor, Reply, ScriptedProvider, Session, ToolCall
from terret.domain.errors import NoOpenTurn, ProviderError
from terret.domain.events import ToolCallData
from tests.runtime.conftest import MakeRuntime, OpenedStore
from tests.runtime.kit import (
    Background,
    Kit,
    LogBuilder,
    agent_of,
    final,
    first_index,
    only,
    other_process,
    read_log,
    wait_parked,
)

USER = Actor(actor="user")
DEPLOY = ToolCallData(id="c-a", name="deploy", args={"env": "prod"})
STATUS = ToolCallData(id="c-b", name="status", args={"env": "prod"})


def dead_process(make_runtime: MakeRuntime, store,
                 *steps: Callable[[Session], Any]) -> UUID:
    """A session whose process died after ``steps`` were logged."""
    sid = make_runtime(start=False).create_session()
    builder = LogBuilder(store, sid)
    for step in steps:
        builder.do(step)
    return sid


def opening(text: str | None = "deploy and check") -> list[Callable[[Session], Any]]:
    return [lambda s: s.start_turn(text=text),
            lambda s: s.start_step("scripted:default")]


def test_r14_resumable_iff_the_log_has_a_turn_start_without_a_turn_end(
        make_runtime: MakeRuntime, store) -> None:
    rt = make_runtime([final()])
    sid = rt.create_session()
    assert not rt.resumable(sid)
    LogBuilder(store, sid).do(lambda s: s.start_turn(text="hello"))
    fresh = make_runtime([final("picked up")])
    assert fresh.resumable(sid)
    result = fresh.resume_turn(sid)
    assert (result.status, result.text, result.turn) == ("completed", "picked up", 1)
    log = read_log(store, sid)
    assert len(only(log, "turn/start")) == 1  # no second turn/start
    assert len(only(log, "turn/end")) == 1
    assert not fresh.resumable(sid)
    with pytest.raises(NoOpenTurn):
        fresh.resume_turn(sid)


def test_resume_of_a_session_without_an_open_turn_writes_nothing(
        make_runtime: MakeRuntime, store) -> None:
    """``NoOpenTurn`` before the session is taken: neither ``agent/attached`` nor, at close,
    ``agent/detached`` — as ``terret resume`` promises (the API attached first)."""
    rt = make_runtime([final()])
    sid = rt.create_session()
    rt.run_turn(sid, "hello")
    rt.close()
    before = [e.name for e in read_log(store, sid)]
    for started in (False, True):
        fresh = make_runtime([final()], start=started)
        with pytest.raises(NoOpenTurn):
            fresh.resume_turn(sid)
        fresh.close()
        assert [e.name for e in read_log(store, sid)] == before, started


def test_r14_a_wake_on_a_session_with_an_open_turn_resumes_it(make_runtime: MakeRuntime,
                                                              kit: Kit, store) -> None:
    sid = dead_process(make_runtime, store, *opening(),
                       lambda s: s.record_assistant("", [STATUS]))
    provider = ScriptedProvider([final("all green")])
    fresh = make_runtime(provider)
    fresh.inject(sid, "and say hi", wake=False)
    result = fresh.wake(sid)
    assert result is not None and result.status == "completed"
    assert kit.ran == [("status", {"env": "prod"})]
    log = read_log(store, sid)
    assert len(only(log, "turn/start")) == 1
    seen = [m.text for m in provider.requests[0].messages if m.role == "user"]
    assert seen == ["deploy and check", "and say hi"]


def test_r15_resume_reexecutes_owed_calls_reading_verdicts_from_the_log(
        make_runtime: MakeRuntime, kit: Kit, store) -> None:
    sid = dead_process(
        make_runtime, store, *opening(),
        lambda s: s.record_assistant("", [DEPLOY, STATUS]),
        lambda s: s.request_approval("c-a", "deploy", {"env": "prod"}),
        lambda s: s.resolve_approval("c-a", "approved", by=USER),
    )
    provider = ScriptedProvider([final("deployed and checked")])
    fresh = make_runtime(provider)
    assert fresh.resume_turn(sid).status == "completed"
    assert kit.ran == [("deploy", {"env": "prod"}), ("status", {"env": "prod"})]
    log = read_log(store, sid)
    assert len(only(log, "approval/requested")) == 1  # never asked again
    assert [r.data["call_id"] for r in only(log, "tool/result")] == ["c-a", "c-b"]
    step_ends = only(log, "step/end")
    # closed without usage of its own, marked as closed by a resume
    assert step_ends[0].data == {"turn": 1, "step": 1, "resumed": True}
    assert [e.data["step"] for e in only(log, "step/start")] == [1, 2]
    assert len(provider.requests) == 1
    assert only(log, "turn/end")[0].data["status"] == "completed"


def test_r15_only_calls_without_a_logged_result_are_reexecuted(make_runtime: MakeRuntime,
                                                               kit: Kit, store) -> None:
    sid = dead_process(
        make_runtime, store, *opening(),
        lambda s: s.record_assistant("", [STATUS, ToolCallData(id="c-c", name="noop")]),
        lambda s: s.record_tool_result("c-b", "status", "prod: green"),
    )
    fresh = make_runtime([final()])
    assert fresh.resume_turn(sid).status == "completed"
    assert kit.ran == [("noop", {})]
    results = only(read_log(store, sid), "tool/result")
    assert [r.data["call_id"] for r in results] == ["c-b", "c-c"]


def test_r15_a_denial_in_the_log_is_honoured_without_asking(make_runtime: MakeRuntime,
                                                            kit: Kit, store) -> None:
    sid = dead_process(
        make_runtime, store, *opening(),
        lambda s: s.record_assistant("", [DEPLOY]),
        lambda s: s.request_approval("c-a", "deploy", {"env": "prod"}),
        lambda s: s.resolve_approval("c-a", "denied", by=Actor(actor="operator"),
                                     reason="freeze"),
    )
    fresh = make_runtime([final()])
    assert fresh.resume_turn(sid).status == "completed"
    assert kit.ran == []
    (result,) = only(read_log(store, sid), "tool/result")
    assert result.data["content"] == "deploy was denied by operator: freeze"
    assert len(only(read_log(store, sid), "approval/requested")) == 1


def test_r15_an_ask_without_a_verdict_parks_again_without_a_second_request_and_a_verdict_from_another_process_completes_it(  # noqa: E501
        make_runtime: MakeRuntime, opened: OpenedStore, kit: Kit) -> None:
    store = opened.store
    sid = dead_process(
        make_runtime, store, *opening(),
        lambda s: s.record_assistant("", [DEPLOY]),
        lambda s: s.request_approval("c-a", "deploy", {"env": "prod"}),
    )
    fresh = make_runtime([final("shipped")])
    assert fresh.resumable(sid) and fresh.pending(sid) == ["c-a"]
    job = Background(lambda: fresh.resume_turn(sid))
    assert wait_parked(fresh, sid) == ["c-a"]
    other_process(opened.uri, "approve", str(sid), "c-a")
    assert job.join().status == "completed"
    assert kit.ran == [("deploy", {"env": "prod"})]
    assert len(only(read_log(store, sid), "approval/requested")) == 1


def test_r15_tool_calls_are_at_least_once(make_runtime: MakeRuntime, kit: Kit, store) -> None:
    # The dead process ran the call but died before its result was logged: it runs again.
    sid = dead_process(make_runtime, store, *opening(),
                       lambda s: s.record_assistant("", [STATUS]))
    kit.ran.append(("status", {"env": "prod"}))  # what the dead process did
    make_runtime([final()]).resume_turn(sid)
    assert kit.ran == [("status", {"env": "prod"})] * 2
    assert len(only(read_log(store, sid), "tool/result")) == 1


def test_r16_an_unclosed_step_start_stays_unclosed_and_numbering_continues(
        make_runtime: MakeRuntime, store) -> None:
    sid = dead_process(make_runtime, store, *opening())
    provider = ScriptedProvider([final()])
    assert make_runtime(provider).resume_turn(sid).status == "completed"
    log = read_log(store, sid)
    assert [e.data["step"] for e in only(log, "step/start")] == [1, 2]
    assert [e.data["step"] for e in only(log, "step/end")] == [2]  # 1 is not backfilled
    assert len(provider.requests) == 1


def test_r16_a_crash_after_a_final_message_resumes_with_one_extra_model_request(
        make_runtime: MakeRuntime, store) -> None:
    sid = dead_process(make_runtime, store, *opening(),
                       lambda s: s.record_assistant("the answer is 42"))
    provider = ScriptedProvider([final("as I said: 42")])
    result = make_runtime(provider).resume_turn(sid)
    assert (result.status, result.text) == ("completed", "as I said: 42")
    assert len(provider.requests) == 1
    seen = provider.requests[0].messages
    assert seen[-1].role == "assistant" and seen[-1].text == "the answer is 42"
    log = read_log(store, sid)
    assert [e.data for e in only(log, "step/end")][0] == {"turn": 1, "step": 1,
                                                          "resumed": True}
    assert [e.data["step"] for e in only(log, "step/start")] == [1, 2]


def test_r16_a_turn_with_nothing_to_do_closes_empty(make_runtime: MakeRuntime, store) -> None:
    sid = dead_process(make_runtime, store, lambda s: s.start_turn(text=None))
    provider = ScriptedProvider([final()])
    assert make_runtime(provider).resume_turn(sid).status == "empty"
    assert not provider.requests
    assert only(read_log(store, sid), "turn/end")[0].data["status"] == "empty"


def test_r16_a_failed_resume_leaves_the_turn_open(make_runtime: MakeRuntime, kit: Kit,
                                                  store) -> None:
    sid = dead_process(make_runtime, store, *opening(),
                       lambda s: s.record_assistant("", [STATUS]))
    down = ScriptedProvider([Reply(raises=ProviderError("scripted", "503 from upstream"))])
    fresh = make_runtime(down)
    with pytest.raises(ProviderError):
        fresh.resume_turn(sid)
    log = read_log(store, sid)
    assert not only(log, "turn/end")  # never closed failed
    assert fresh.resumable(sid)
    assert agent_of(fresh, sid).status == "idle"
    fresh.close()  # the next stimulus comes in the next process, once this one is gone
    later = make_runtime([final("back up")])
    assert later.resume_turn(sid).status == "completed"
    log = read_log(store, sid)
    assert [e.data["status"] for e in only(log, "turn/end")] == ["completed"]
    assert len(only(log, "turn/start")) == 1
    assert len(only(log, "tool/result")) == 1
    assert kit.ran == [("status", {"env": "prod"})]


def test_r16_a_serving_worker_whose_resume_failed_waits_for_a_stimulus(
        make_runtime: MakeRuntime, kit: Kit, opened: OpenedStore) -> None:
    """A provider down: serve resumed the open turn at every scan (each second), each try
    a model request and a new step/start, until the step limit closed the turn failed. It
    tries once, then again at the next event of the session (here another process's inject),
    and the turn stays open through the outage."""
    import time

    from tests.runtime.kit import wait_until

    store = opened.store
    sid = dead_process(make_runtime, store, *opening(),
                       lambda s: s.record_assistant("", [STATUS]))
    down = ScriptedProvider(default=Reply(raises=ProviderError("scripted", "503 upstream")))
    server = make_runtime(down, start=False)
    server.serve_start()
    wait_until(lambda: len(down.requests) == 1, what="the first try")
    time.sleep(4 * server.supervisor.scan_interval)  # four scans
    assert len(down.requests) == 1 and len(only(read_log(store, sid), "step/start")) == 2
    other_process(opened.uri, "inject", str(sid), "any news?")
    wait_until(lambda: len(down.requests) == 2, what="the try at the stimulus")
    time.sleep(2 * server.supervisor.scan_interval)
    assert len(down.requests) == 2 and server.resumable(sid)
    assert not only(read_log(store, sid), "turn/end")


def test_r16_a_resumed_turn_with_a_recorded_cancel_closes_cancelled(make_runtime: MakeRuntime,
                                                                    kit: Kit, store) -> None:
    sid = dead_process(
        make_runtime, store, *opening(),
        lambda s: s.record_assistant("", [DEPLOY]),
        lambda s: s.request_approval("c-a", "deploy", {"env": "prod"}),
        lambda s: s.request_cancel(by=Actor(actor="operator", id="ops"), reason="abort"),
    )
    provider = ScriptedProvider([final()])
    result = make_runtime(provider).resume_turn(sid)
    assert result.status == "cancelled"
    assert kit.ran == [] and not provider.requests
    log = read_log(store, sid)
    assert (first_index(log, "turn/cancel_requested")
            < first_index(log, "approval/resolved", call_id="c-a", verdict="denied")
            < first_index(log, "turn/end", status="cancelled"))
    assert only(log, "turn/end")[0].data["by"] == {"actor": "operator", "id": "ops"}


def test_r16_the_same_log_resumed_twice_concurrently_has_one_winner(make_runtime: MakeRuntime,
                                                                    store) -> None:
    sid = dead_process(make_runtime, store, *opening(),
                       lambda s: s.record_assistant("", [STATUS]))
    fresh = make_runtime(ScriptedProvider(default=final()))
    jobs = [Background(lambda: fresh.resume_turn(sid)) for _ in range(2)]
    outcomes = []
    for job in jobs:
        try:
            outcomes.append(job.join().status)
        except Exception as exc:  # the loser
            outcomes.append(type(exc).__name__)
    assert sorted(outcomes) in (["TurnAlreadyRunning", "completed"], ["NoOpenTurn", "completed"])
    log = read_log(store, sid)
    assert len(only(log, "turn/end")) == 1 and len(only(log, "tool/result")) == 1


def test_r16_scripted_ids_do_not_matter_to_resume(make_runtime: MakeRuntime, store) -> None:
    # A resumed step's model may reuse an id the dead process's model used: it is a new call.
    sid = dead_process(make_runtime, store, *opening(),
                       lambda s: s.record_assistant("", [STATUS]))
    provider = ScriptedProvider([Reply(tool_calls=[ToolCall("c-b", "noop", {})]), final()])
    assert make_runtime(provider).resume_turn(sid).status == "completed"
    results = only(read_log(store, sid), "tool/result")
    assert [(r.data["call_id"], r.data["name"]) for r in results] == [
        ("c-b", "status"), ("c-b", "noop")]


def test_r12_the_maximum_wait_counts_from_the_recorded_request_across_processes(
        make_runtime: MakeRuntime, opened: OpenedStore, kit: Kit) -> None:
    """A call parked by a process that died, taken up by another: its maximum wait ran again
    from the takeover, so every restart or deploy extended it (with deploys more often than
    the wait, it was never reaped). It counts from the request's recorded time."""
    import json
    import time

    from terret import RuntimeConfig
    from terret.domain.store import session_stream

    store = opened.store
    sid = dead_process(
        make_runtime, store, *opening(),
        lambda s: s.record_assistant("", [DEPLOY]),
        lambda s: s.request_approval("c-a", "deploy", {"env": "prod"}),
    )
    time.sleep(1.5)  # the dead process's wait went on meanwhile
    fresh = make_runtime([final("not shipped")], config=RuntimeConfig(approval_max_wait=2.0))
    resumed = time.time()
    assert fresh.resume_turn(sid).status == "completed"
    records = store.read_stream(session_stream(sid))
    (request,) = [r for r in records if r.wire_name == "approval/requested"]
    (verdict,) = [r for r in records if r.wire_name == "approval/resolved"]
    assert json.loads(verdict.data)["by"] == {"actor": "reaper"}
    waited = verdict.recorded_at - request.recorded_at
    assert 2.0 <= waited < 3.0, waited  # not 1.5 + 2.0
    assert verdict.recorded_at - resumed < 1.2
    assert kit.ran == []

    # Past its wait already when taken up: reaped at once.
    late = dead_process(
        make_runtime, store, *opening(),
        lambda s: s.record_assistant("", [DEPLOY]),
        lambda s: s.request_approval("c-a", "deploy", {"env": "prod"}),
    )
    time.sleep(0.6)
    started = time.monotonic()
    again = make_runtime([final("not shipped")], config=RuntimeConfig(approval_max_wait=0.5))
    assert again.resume_turn(late).status == "completed"
    assert time.monotonic() - started < 1.5
    assert only(read_log(store, late), "approval/resolved")[0].data["by"] == {"actor": "reaper"}
