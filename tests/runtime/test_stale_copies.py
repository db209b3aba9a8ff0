"""R30 and the seed rules it protects (issue 11, items 1 and 2): a runtime that served a session
earlier never decides on the copy it kept while another process wrote to the session. Every
test here has a second process (``tests/runtime/proc.py``) act on the same session, on the
SQLite store and on the EventStoreDB adapter."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from terret import Reply, ScriptedProvider
from terret.adapters.providers import StreamBroken
from terret.domain import errors
from terret.runtime.model import ModelReply, ModelRequest, TextSink
from tests.runtime.conftest import MakeRuntime, OpenedStore
from tests.runtime.kit import (
    DEADLINE,
    Kit,
    calls,
    final,
    names,
    only,
    other_process,
    read_log,
    turn_in_background,
    wait_until,
)


def test_a_turn_after_another_process_ran_one_starts_from_the_log(
        make_runtime: MakeRuntime, opened: OpenedStore) -> None:
    p = make_runtime()
    sid = p.create_session()
    assert p.run_turn(sid, "one").status == "completed"
    assert other_process(opened.uri, "turn", str(sid), "two") == {
        "ok": True, "status": "completed", "turn": 2}
    result = p.run_turn(sid, "three")  # it raised LostOwnership on the copy it kept
    assert (result.status, result.turn) == ("completed", 3)
    log = read_log(opened.store, sid)
    assert [e.data["turn"] for e in only(log, "turn/end")] == [1, 2, 3]


def test_a_turn_another_process_died_in_is_refused_as_open_in_the_log(
        make_runtime: MakeRuntime, opened: OpenedStore) -> None:
    p = make_runtime()
    sid = p.create_session()
    assert p.run_turn(sid, "one").status == "completed"
    other_process(opened.uri, "die-in-tool", str(sid), returncode=9)
    before = read_log(opened.store, sid)
    with pytest.raises(errors.TurnOpenInLog):  # it raised LostOwnership
        p.run_turn(sid, "three")
    assert read_log(opened.store, sid) == before  # a refusal appends nothing (R4)
    assert p.resumable(sid)


def test_r4_a_fresh_process_refuses_an_open_turn_without_attaching(
        make_runtime: MakeRuntime, opened: OpenedStore) -> None:
    sid = make_runtime().create_session()
    other_process(opened.uri, "die-in-tool", str(sid), returncode=9)
    before = read_log(opened.store, sid)
    fresh = make_runtime()
    with pytest.raises(errors.TurnOpenInLog):
        fresh.run_turn(sid, "hello")
    assert read_log(opened.store, sid) == before  # no agent/attached either
    assert fresh.agent_for_session(sid) is None


def test_pending_reads_what_another_process_parked_after_a_first_read(
        make_runtime: MakeRuntime, opened: OpenedStore) -> None:
    reader = make_runtime(start=False)
    sid = reader.create_session()
    assert reader.pending(sid) == []  # read once: the copy it keeps has no turn
    assert other_process(opened.uri, "park", str(sid))["pending"] == ["c-park"]
    assert reader.pending(sid) == ["c-park"]  # it kept returning []
    assert reader.resumable(sid)


def test_r23_a_policy_recorded_by_another_process_during_a_call_stops_the_next_call(
        make_runtime: MakeRuntime, opened: OpenedStore, kit: Kit) -> None:
    rt = make_runtime([calls(("slow", {}, "c-1"), ("status", {"env": "prod"}, "c-2")),
                       final()], allow=["*"])
    sid = rt.create_session()
    job = turn_in_background(rt, sid, "go")
    assert kit.entered.wait(DEADLINE)  # the first call runs...
    other_process(opened.uri, "policy", str(sid), "slow")  # ...while the policy changes
    kit.release.set()
    assert job.join().status == "completed"
    assert kit.ran == [("slow", {})]  # the second call did not run
    results = only(read_log(opened.store, sid), "tool/result")
    assert [(r.data["call_id"], r.data["is_error"]) for r in results] == [
        ("c-1", False), ("c-2", True)]
    assert "not allowed" in results[1].data["content"]


class _CancelledWhileAnswering(ScriptedProvider):
    """Answers after another process has recorded a cancel: the cancel is durable before the
    reply is, whether or not the subscription delivered it to the turn yet."""

    def __init__(self, uri: str, sid: Any) -> None:
        super().__init__([calls(("noop", {}, "c-1"))], default=final("all done"))
        self.uri, self.sid, self.fired = uri, sid, False

    def complete(self, request: ModelRequest, *, on_text: TextSink | None = None,
                 cancel: threading.Event | None = None) -> ModelReply:
        reply = super().complete(request, on_text=on_text, cancel=None)
        if len(self.requests) == 2 and not self.fired:  # the turn's final request
            self.fired = True
            other_process(self.uri, "cancel", str(self.sid))
        return reply


def test_r13_a_cancel_recorded_during_the_final_model_request_wins(
        make_runtime: MakeRuntime, opened: OpenedStore) -> None:
    provider = _CancelledWhileAnswering(opened.uri, None)
    rt = make_runtime(provider)
    sid = rt.create_session()
    provider.sid = sid
    result = rt.run_turn(sid, "go")
    assert result.status == "cancelled"  # it ended completed
    log = read_log(opened.store, sid)
    (end,) = only(log, "turn/end")
    assert end.data["status"] == "cancelled"
    assert end.data["by"] == {"actor": "operator", "id": "proc"}
    assert names(log).index("turn/cancel_requested") < names(log).index("turn/end")
    # The reply the model gave is kept, with the usage of its step.
    assert [e.data["text"] for e in only(log, "assistant/message")][-1] == "all done"
    assert len(only(log, "step/end")) == 2


def test_r13_a_cancel_from_another_process_closes_the_in_flight_model_stream(
        make_runtime: MakeRuntime, opened: OpenedStore, gates: Any) -> None:
    gate: threading.Event = gates()  # the model never answers unless cancelled
    provider = ScriptedProvider([Reply(text="never", gate=gate)])
    rt = make_runtime(provider)
    sid = rt.create_session()
    job = turn_in_background(rt, sid, "go")
    wait_until(lambda: len(provider.requests) == 1, what="the model request")
    other_process(opened.uri, "cancel", str(sid))
    result = job.join()  # without the stream closed, this waited for the gate forever
    assert result.status == "cancelled"
    (end,) = only(read_log(opened.store, sid), "turn/end")
    assert (end.data["status"], end.data["by"]["actor"]) == ("cancelled", "operator")
    assert not gate.is_set()


class _BrokenAfterACancel(ScriptedProvider):
    """The stream breaks while another process's cancel is closing it: the provider sees the
    break before it sees the cancel."""

    def __init__(self, uri: str) -> None:
        super().__init__([])
        self.uri, self.sid, self.cancelling = uri, "", True

    def complete(self, request: ModelRequest, *, on_text: TextSink | None = None,
                 cancel: threading.Event | None = None) -> ModelReply:
        if self.cancelling:
            other_process(self.uri, "cancel", self.sid)
        raise StreamBroken("acme", "the stream ended without [DONE] after 7 characters")


def test_r13_a_stream_that_breaks_after_a_recorded_cancel_ends_the_turn_cancelled(
        make_runtime: MakeRuntime, opened: OpenedStore) -> None:
    """docs/runtime.md: a cancel recorded by another process closes the in-flight model request
    and wins. A stream the cancel was closing broke first: the turn ended ``failed`` with a
    StreamBroken raised to the caller, though the cancel was already in the log."""
    provider = _BrokenAfterACancel(opened.uri)
    rt = make_runtime(provider)
    sid = rt.create_session()
    provider.sid = str(sid)
    result = rt.run_turn(sid, "go")
    assert result.status == "cancelled"
    log = read_log(opened.store, sid)
    (end,) = only(log, "turn/end")
    assert (end.data["status"], end.data["by"]) == ("cancelled", {"actor": "operator",
                                                                   "id": "proc"})
    provider.cancelling = False
    with pytest.raises(StreamBroken):  # no cancel recorded: a failure
        rt.run_turn(sid, "again")
    assert only(read_log(opened.store, sid), "turn/end")[-1].data["status"] == "failed"


def test_the_views_hold_what_another_process_wrote_once_caught_up(
        make_runtime: MakeRuntime, opened: OpenedStore) -> None:
    """docs/runtime.md, *Reading the views*: an unstarted runtime's views move only when caught
    up; ``catch_up_views(session)`` brings them to everything written so far, another
    process's turn and this process's own writes alike."""
    from terret import Actor

    reader = make_runtime(start=False)
    sid = reader.create_session()
    reader.catch_up_views(sid)
    assert reader.views.status(sid).last_turn_status is None
    assert other_process(opened.uri, "turn", str(sid), "two")["status"] == "completed"
    reader.catch_up_views(sid)
    status = reader.views.status(sid)
    assert (status.status, status.turn, status.last_turn_status) == ("idle", 1, "completed")
    assert [m.role for m in reader.views.messages(sid)] == ["user", "assistant"]
    started = make_runtime()
    started.set_policy(sid, ["deploy"], by=Actor(actor="operator"))
    started.catch_up_views(sid)
    assert started.views.policy(sid) == ["deploy"]


@pytest.mark.parametrize("started", [True, False])
def test_a_session_another_process_purged_is_not_found_here_either(
        make_runtime: MakeRuntime, opened: OpenedStore, started: bool) -> None:
    """A runtime that had read (or run) a session answered for it from the copy it kept once
    another process purged it — usage zeros, no title, no owner, and as its live owner an agent
    it still held — where a fresh runtime raised SessionNotFound. Every call raises it now, the
    agent held for it is dropped, and closing the runtime has nothing to release."""
    from terret import Actor

    rt = make_runtime(start=started)
    sid = rt.create_session()
    assert rt.run_turn(sid, "hello").status == "completed"
    assert rt.usage(sid)["steps"] == 1 and rt.agent_for_session(sid) is not None
    other_process(opened.uri, "purge", str(sid))
    user = Actor(actor="user", id="alice")
    calls_ = {
        "usage": lambda: rt.usage(sid), "title": lambda: rt.title(sid),
        "pending": lambda: rt.pending(sid), "resumable": lambda: rt.resumable(sid),
        "owner": lambda: rt.owner(sid), "budget": lambda: rt.budget(sid),
        "run_turn": lambda: rt.run_turn(sid, "again"), "inject": lambda: rt.inject(sid, "x"),
        "set_title": lambda: rt.set_title(sid, "t", by=user),
    }
    for name, call_ in calls_.items():
        with pytest.raises(errors.SessionNotFound):
            call_()
        assert rt.agent_for_session(sid) is None, name
    assert read_log(opened.store, sid) == []
