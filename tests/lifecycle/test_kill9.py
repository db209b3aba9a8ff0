"""The kill -9 lane: a process wedges mid-tool and dies by SIGKILL, so nothing of it runs on
the way out; a fresh runtime completes the turn on the first wake (R14–R16, R24)."""

from __future__ import annotations

from pathlib import Path

from terret import Actor
from tests.lifecycle import child
from tests.lifecycle.kit import check_invariants, kill9_after, new_session, python_module
from tests.runtime.conftest import OpenedStore
from tests.runtime.kit import agent_of, names, only, read_log, wait_for_event


def test_kill9_mid_tool_then_a_fresh_runtime_completes_the_turn_on_the_first_wake(
        opened: OpenedStore, tmp_path: Path) -> None:
    store = opened.store
    sid = new_session(store)
    ran = tmp_path / "ran.txt"
    kill9_after(python_module("tests.lifecycle.child", "wedge", opened.uri, str(sid), str(ran)),
                "wedged")

    left = read_log(store, sid)
    assert names(left)[-1] == "assistant/message"  # died mid-tool: no result, no ensure
    assert left[-1].data["tool_calls"][0]["id"] == "c-probe"
    assert not only(left, "turn/end")

    fresh = child.runtime(store, child.wedge_model, ran).start()  # the probe does not wedge
    try:
        assert fresh.resumable(sid)
        fresh.spawn_agent(sid)
        fresh.inject(sid, "still there?", wake=True)  # the first wake resumes the turn
        log = wait_for_event(store, sid, "turn/end")
        (end,) = only(log, "turn/end")
        assert end.data["status"] == "completed"
        assert len(only(log, "turn/start")) == 1
        assert [e.data["step"] for e in only(log, "step/start")] == [1, 2, 3]
        step_ends = {e.data["step"]: e.data for e in only(log, "step/end")}
        assert "usage" not in step_ends[2]  # the dead process's usage died with it
        injected = only(log, "context/injected")
        assert [e.data["text"] for e in injected] == ["still there?"]
        assert ran.read_text().splitlines() == [
            "status c-status", "probe c-probe", "probe c-probe"]  # at-least-once
        check_invariants(log)
        fresh.catch_up_views()
        assert all(fresh.runner.verify(p.name) == [] for p in fresh.runner.projections)
        assert agent_of(fresh, sid).status == "idle"
    finally:
        fresh.close()


def test_a_cancel_after_a_kill9_mid_tool_says_the_call_may_have_run(
        opened: OpenedStore, tmp_path: Path) -> None:
    """The dead process was running ``probe`` (a tool that may run twice records no start):
    the log cannot tell whether it ran, so the turn closed by a cancel recorded meanwhile
    answers it "may have run" — it said "was not run", which the log does not know."""
    store = opened.store
    sid = new_session(store)
    ran = tmp_path / "ran.txt"
    kill9_after(python_module("tests.lifecycle.child", "wedge", opened.uri, str(sid), str(ran)),
                "wedged")
    assert ran.read_text().splitlines()[-1] == "probe c-probe"  # it did run
    fresh = child.runtime(store, child.wedge_model, ran)
    try:
        fresh.cancel(sid, by=Actor(actor="operator", id="ops"), reason="wrong session")
        assert fresh.resume_turn(sid).status == "cancelled"
        log = read_log(store, sid)
        (result,) = [e for e in only(log, "tool/result") if e.data["call_id"] == "c-probe"]
        assert result.data["is_error"] is True
        assert result.data["content"].startswith(
            "probe has no result: the process running its step stopped before recording one, "
            "so it may have run; the turn ended cancelled: wrong session"), result.data
        assert ran.read_text().splitlines()[-1] == "probe c-probe"  # not run again
        check_invariants(log)
    finally:
        fresh.close()


def test_kill9_while_parked_then_a_verdict_from_another_process_then_the_first_wake(
        opened: OpenedStore, tmp_path: Path) -> None:
    """Killed while parked on an approval; an operator approves while nobody serves the session;
    the next process resumes on its first wake without asking again."""
    store = opened.store
    sid = new_session(store)
    ran = tmp_path / "ran.txt"
    kill9_after(python_module("tests.lifecycle.child", "park", opened.uri, str(sid), str(ran)),
                "parked")
    operator = child.runtime(store, child.sweep_model, ran)  # a CLI: never started
    assert operator.pending(sid) == ["c-deploy"]
    operator.approve(sid, "c-deploy", by=Actor(actor="operator", id="cli"))
    operator.close()
    assert not ran.exists()  # nothing ran yet

    fresh = child.runtime(store, child.sweep_model, ran).start()
    try:
        fresh.spawn_agent(sid)
        fresh.inject(sid, "approved, go on", wake=True)
        log = wait_for_event(store, sid, "turn/end")
        assert only(log, "turn/end")[0].data["status"] == "completed"
        assert len(only(log, "approval/requested")) == 1  # never asked again
        assert ran.read_text().splitlines() == ["deploy c-deploy", "status c-status"]
        check_invariants(log)
    finally:
        fresh.close()
