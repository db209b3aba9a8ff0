"""Issue 14 in the kill -9 lane: a process parked on an approval dies by SIGKILL; the usage of
the model call whose reply is in the log is counted by any other process at once, and once more
nothing when the turn is resumed — each model call once, equal to what the scripted model
reported for the replies in the log. On SQLite and the EventStoreDB emulator."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from terret import Actor
from tests.lifecycle import child
from tests.lifecycle.kit import check_invariants, kill9_after, new_session, python_module
from tests.runtime.conftest import OpenedStore
from tests.runtime.kit import only, read_log

OPERATOR = Actor(actor="operator", id="lifecycle")


def _reported(store: Any, sid: Any) -> dict[str, Any]:
    """What the replies in the log carry: what ``child.sweep_model`` reported for them."""
    replies = only(read_log(store, sid), "assistant/message")
    return {"prompt_tokens": sum(e.data["usage"]["prompt_tokens"] for e in replies),
            "completion_tokens": sum(e.data["usage"]["completion_tokens"] for e in replies),
            "cost": round(sum(e.data["usage"]["cost"] for e in replies), 9),
            "steps": len(replies)}


def _usage(rt: Any, sid: Any) -> dict[str, Any]:
    used = rt.usage(sid)
    return {**used, "cost": round(used["cost"], 9)}


def test_kill9_while_parked_keeps_the_usage_and_a_resume_counts_each_call_once(
        opened: OpenedStore, tmp_path: Path) -> None:
    store = opened.store
    sid = new_session(store)
    ran = tmp_path / "ran.txt"
    kill9_after(python_module("tests.lifecycle.child", "park", opened.uri, str(sid), str(ran)),
                "parked")
    assert not only(read_log(store, sid), "step/end")  # died parked: the step never closed
    operator = child.runtime(store, child.sweep_model, ran)  # a CLI: never started
    try:
        assert _usage(operator, sid) == _reported(store, sid) == {
            "prompt_tokens": 100, "completion_tokens": 10, "cost": 0.001, "steps": 1}
        operator.approve(sid, "c-deploy", by=OPERATOR)
    finally:
        operator.close()

    fresh = child.runtime(store, child.sweep_model, ran).start()
    try:
        assert fresh.resume_turn(sid).status == "completed"
        log = read_log(store, sid)
        check_invariants(log)
        assert only(log, "step/end")[0].data == {"turn": 1, "step": 1, "resumed": True}
        expected = {"prompt_tokens": 100 + 101 + 102, "completion_tokens": 30, "cost": 0.003,
                    "steps": 3}
        assert _usage(fresh, sid) == _reported(store, sid) == expected
        by_turn = fresh.views.usage_by_turn(sid)[1].as_dict()
        assert {**by_turn, "cost": round(by_turn["cost"], 9)} == expected
        fresh.catch_up_views()
        assert all(fresh.runner.verify(p.name) == [] for p in fresh.runner.projections)
    finally:
        fresh.close()


def test_kill9_while_parked_then_a_cancel_keeps_the_usage(opened: OpenedStore,
                                                          tmp_path: Path) -> None:
    store = opened.store
    sid = new_session(store)
    ran = tmp_path / "ran.txt"
    kill9_after(python_module("tests.lifecycle.child", "park", opened.uri, str(sid), str(ran)),
                "parked")
    fresh = child.runtime(store, child.sweep_model, ran).start()
    try:
        fresh.cancel(sid, by=OPERATOR, reason="not today")
        assert fresh.resume_turn(sid).status == "cancelled"
        assert _usage(fresh, sid) == _reported(store, sid) == {
            "prompt_tokens": 100, "completion_tokens": 10, "cost": 0.001, "steps": 1}
        check_invariants(read_log(store, sid))
    finally:
        fresh.close()
