"""The ``Session`` aggregate's rules. Every refused command raises the typed error from
``terret.domain.errors`` and leaves the aggregate exactly as it was: no pending event, the same
state and version."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from terret.adapters.stores.memory import MemoryStore
from terret.domain import errors
from terret.domain.codec import decode
from terret.domain.events import Actor, ToolCallData, UsageData
from terret.domain.repository import SessionRepository
from terret.domain.session import MAX_STEPS, Session
from terret.domain.state import WaitingCall
from terret.domain.store import session_stream

MODEL = "openai:gpt-4o"
USER = Actor(actor="user", id="ana")


def fresh(**kwargs: Any) -> Session:
    session = Session.start(**kwargs)
    session.collect_events()
    return session


def wire_names(session: Session) -> list[str]:
    return [e.payload.wire_name for e in session.collect_events()]


def refused(session: Session, error: type[Exception], command: Callable[[], object]) -> Exception:
    """Run a command that must be refused; check it left the aggregate untouched."""
    assert session.pending_events == [], "settle the session before testing a refusal"
    state = copy.deepcopy(session.state)
    version = session.version
    with pytest.raises(error) as info:
        command()
    assert session.pending_events == []
    assert session.state == state
    assert session.version == version
    return info.value


def after_a_turn() -> Session:
    """A session whose first turn (``hello``) has ended, its events collected: a mark taken
    now is a turn boundary."""
    session = fresh()
    session.start_turn(text="hello")
    session.end_turn("completed")
    session.collect_events()
    return session


def open_step(session: Session, *calls: ToolCallData) -> None:
    if not session.turn_open:
        session.start_turn(text="go")
    session.start_step(MODEL)
    session.record_assistant("", list(calls))
    session.collect_events()


def parked(session: Session, *names: str) -> list[ToolCallData]:
    """An open turn whose step asked for approval of one call per name."""
    calls = [ToolCallData(id=f"c{i}", name=n, args={"i": i}) for i, n in enumerate(names)]
    open_step(session, *calls)
    for call in calls:
        session.request_approval(call.id, call.name, call.args)
    session.collect_events()
    return calls


# --- R4: one open turn; a closed session takes nothing -------------------------------------


def test_r4_a_second_turn_is_refused_while_the_log_holds_an_open_turn() -> None:
    session = fresh()
    assert session.start_turn(text="one") == 1
    assert wire_names(session) == ["turn/start", "user/message"]
    error = refused(session, errors.TurnOpenInLog, lambda: session.start_turn(text="two"))
    assert error.rule == "R4"
    session.end_turn("completed")
    session.collect_events()
    assert session.start_turn() == 2


def test_r4_the_open_turn_is_read_from_the_log() -> None:
    store = MemoryStore()
    repo = SessionRepository(store)
    session = Session.start()
    session.start_turn(text="hi")
    repo.save(session)
    loaded = repo.get(session.id)  # e.g. after a crash, in another process
    assert loaded.turn_open
    refused(loaded, errors.TurnOpenInLog, lambda: loaded.start_turn(text="again"))
    assert store.stream_version(session_stream(session.id)) == 3


def test_closing_needs_an_idle_session_and_a_closed_session_refuses_commands() -> None:
    session = fresh()
    session.start_turn()
    session.collect_events()
    refused(session, errors.TurnAlreadyRunning, lambda: session.close(by=USER))
    session.end_turn("completed")
    session.close(by=USER, reason="done")
    assert wire_names(session) == ["turn/end", "session/closed"]
    assert session.closed
    for command in (
        lambda: session.start_turn(text="x"),
        lambda: session.queue("x"),
        lambda: session.set_model("main", MODEL),
        lambda: session.update_policy(["fs.*"]),
        lambda: session.compact("summary", mark=session.version),
        lambda: session.close(by=USER),
    ):
        refused(session, errors.SessionClosed, command)


# --- R2 and R16: steps ---------------------------------------------------------------------


def test_r2_the_step_after_max_steps_is_refused() -> None:
    session = fresh()
    session.start_turn()
    for step in range(1, MAX_STEPS + 1):
        assert session.start_step(MODEL) == step
        session.record_assistant("thinking")
        session.end_step()
    session.collect_events()
    error = refused(session, errors.MaxStepsExceeded, lambda: session.start_step(MODEL))
    assert error.rule == "R2"
    session.end_turn("failed", error=str(error))
    assert wire_names(session) == ["turn/end"]


def test_r2_the_limit_is_configurable() -> None:
    session = fresh()
    session.start_turn()
    for _ in range(3):
        session.start_step(MODEL, max_steps=3)
        session.record_assistant("")
        session.end_step()
    session.collect_events()
    refused(session, errors.MaxStepsExceeded, lambda: session.start_step(MODEL, max_steps=3))


def test_r16_an_abandoned_step_stays_unclosed_and_numbering_continues() -> None:
    session = fresh()
    session.start_turn()
    assert session.start_step(MODEL) == 1  # the model request failed: no reply
    assert session.start_step(MODEL) == 2
    session.record_assistant("done")
    session.collect_events()
    refused(session, errors.StepOpen, lambda: session.start_step(MODEL))
    refused(session, errors.NoOpenStep, lambda: session.record_assistant("again"))


def test_steps_need_an_open_turn() -> None:
    session = fresh()
    for command in (
        lambda: session.start_step(MODEL),
        lambda: session.end_step(),
        lambda: session.end_turn("completed"),
        lambda: session.take_inbox(),
        lambda: session.request_cancel(by=USER),
    ):
        refused(session, errors.NoOpenTurn, command)


def test_a_step_owing_tool_results_cannot_end() -> None:
    session = fresh()
    open_step(session, ToolCallData(id="c1", name="fs.read"))
    refused(session, errors.StepOpen, lambda: session.end_step())
    session.record_tool_result("c1", "fs.read", "text")
    session.end_step(UsageData(prompt_tokens=3, completion_tokens=1))
    assert wire_names(session) == ["tool/result", "step/end"]


def test_duplicate_call_ids_in_one_reply_are_refused() -> None:
    session = fresh()
    session.start_turn()
    session.start_step(MODEL)
    session.collect_events()
    call = ToolCallData(id="c1", name="fs.read")
    error = refused(session, errors.InvalidPayload,
                    lambda: session.record_assistant("", [call, call]))
    assert error.field == "tool_calls"


# --- R10 and R11: approvals ----------------------------------------------------------------


def test_r10_an_approval_request_names_an_owed_call_once() -> None:
    session = fresh()
    open_step(session, ToolCallData(id="c1", name="deploy", args={"env": "prod"}))
    refused(session, errors.ToolCallNotOwed,
            lambda: session.request_approval("c9", "deploy", {"env": "prod"}))
    session.request_approval("c1", "deploy", {"env": "prod"})
    assert wire_names(session) == ["approval/requested"]
    assert session.pending_approvals() == {"c1": WaitingCall("deploy", {"env": "prod"})}
    error = refused(session, errors.ApprovalAlreadyRequested,
                    lambda: session.request_approval("c1", "deploy", {"env": "prod"}))
    assert error.rule == "R10"
    session.resolve_approval("c1", "approved", by=USER)
    session.collect_events()
    refused(session, errors.ApprovalAlreadyRequested,
            lambda: session.request_approval("c1", "deploy", {"env": "prod"}))


def test_r11_a_verdict_must_name_a_request_pending_in_the_open_turn() -> None:
    session = fresh()
    parked(session, "deploy")
    error = refused(session, errors.ApprovalNotPending,
                    lambda: session.resolve_approval("c9", "approved", by=USER))
    assert error.rule == "R11"
    # the same call id, but another tool or other arguments
    refused(session, errors.ApprovalNotPending,
            lambda: session.resolve_approval("c0", "approved", by=USER, name="rm"))
    refused(session, errors.ApprovalNotPending,
            lambda: session.resolve_approval("c0", "approved", by=USER, name="deploy",
                                             args={"i": 1}))
    error = refused(session, errors.InvalidPayload,
                    lambda: session.resolve_approval("c0", "maybe", by=USER))
    assert error.field == "verdict"
    session.resolve_approval("c0", "denied", by=USER, reason="not today", name="deploy",
                             args={"i": 0})
    assert wire_names(session) == ["approval/resolved"]
    refused(session, errors.ApprovalNotPending,  # already resolved
            lambda: session.resolve_approval("c0", "approved", by=USER))


def test_r11_the_verdict_binds_call_id_tool_and_arguments() -> None:
    session = fresh()
    parked(session, "deploy")
    session.resolve_approval("c0", "approved", by=USER)
    session.collect_events()
    verdict = session.verdict_for("c0", "deploy", {"i": 0})
    assert verdict is not None and verdict.verdict == "approved"
    assert session.verdict_for("c0", "deploy", {"i": 1}) is None
    assert session.verdict_for("c0", "rm", {"i": 0}) is None
    assert session.verdict_for("c1", "deploy", {"i": 0}) is None


def test_r11_named_arguments_are_compared_as_json_not_with_python_equality() -> None:
    session = fresh()
    open_step(session, ToolCallData(id="c1", name="deploy", args={"force": True}))
    session.request_approval("c1", "deploy", {"force": True})
    session.collect_events()
    for loose in ({"force": 1}, {"force": 1.0}):  # == True in Python
        refused(session, errors.ApprovalNotPending,
                lambda loose=loose: session.resolve_approval(
                    "c1", "approved", by=Actor(actor="user"), name="deploy", args=loose))
    session.resolve_approval("c1", "approved", by=Actor(actor="user"), name="deploy",
                             args={"force": True})


def test_a_cancel_s_reason_is_said_in_full_once_and_its_start_in_each_call_it_stops() -> None:
    """Repeated in full in every denial and result, a long reason made the closing append
    outgrow a store's limit for one (the turn could never close)."""
    session = fresh()
    parked(session, *[f"tool{i}" for i in range(50)])
    reason = "紧急冻结 " * 399  # 1,995 characters, three bytes each in UTF-8
    session.request_cancel(by=Actor(actor="operator"), reason=reason)
    session.collect_events()
    session.end_turn("cancelled", reason=reason, by=Actor(actor="operator"))
    events = [e.payload for e in session.collect_events()]
    assert events[-1].reason == reason  # turn/end: in full
    cut = [p.reason for p in events if p.wire_name == "approval/resolved"]
    assert len(cut) == 50 and all(len(r) <= 200 and reason.startswith(r[:-1]) for r in cut)
    assert all(len(p.content) < 400 for p in events if p.wire_name == "tool/result")


def test_r11_approvals_belong_to_the_open_turn() -> None:
    session = fresh()
    parked(session, "deploy")
    session.end_turn("failed")
    session.collect_events()
    assert session.pending_approvals() == {}
    refused(session, errors.ApprovalNotPending,
            lambda: session.resolve_approval("c0", "approved", by=USER))
    session.start_turn()
    session.collect_events()
    refused(session, errors.ApprovalNotPending,  # a request of the previous turn
            lambda: session.resolve_approval("c0", "approved", by=USER))
    assert session.verdict_for("c0", "deploy", {"i": 0}) is None


# --- R13: cancelling a parked turn ---------------------------------------------------------


def test_r13_cancelling_denies_every_standing_request_then_closes_the_turn() -> None:
    session = fresh()
    parked(session, "deploy", "rm", "mail")
    session.resolve_approval("c2", "approved", by=USER)
    session.collect_events()
    session.request_cancel(by=USER, reason="stop")
    session.end_turn("cancelled", reason="stop", by=USER)
    events = session.collect_events()
    # Cancel recorded, standing requests denied, every owed call answered with an error
    # result (no call left without its result), then the turn closes.
    assert [e.payload.wire_name for e in events] == [
        "turn/cancel_requested", "approval/resolved", "approval/resolved",
        "tool/result", "tool/result", "tool/result", "turn/end",
    ]
    assert all(e.payload.is_error for e in events[3:6])
    denials = [e.payload for e in events[1:3]]
    assert sorted(d.call_id for d in denials) == ["c0", "c1"]
    assert {(d.verdict, d.by) for d in denials} == {("denied", USER)}
    assert events[-1].payload.status == "cancelled"
    assert not session.turn_open
    assert session.pending_approvals() == {}


def test_r13_a_refused_cancellation_leaves_every_request_standing() -> None:
    session = fresh()
    parked(session, "deploy")
    refused(session, errors.InvalidPayload,
            lambda: session.end_turn("cancelled", error=123))  # type: ignore[arg-type]
    assert session.pending_approvals() == {"c0": WaitingCall("deploy", {"i": 0})}


# --- R14: resume -----------------------------------------------------------------------------


def test_r14_a_crashed_turn_resumes_without_a_second_turn_start() -> None:
    store = MemoryStore()
    repo = SessionRepository(store)
    session = Session.start()
    session.start_turn(text="do two things")
    session.start_step(MODEL)
    session.record_assistant("", [ToolCallData(id="a", name="fs.read"),
                                  ToolCallData(id="b", name="fs.write", args={"x": 1})])
    session.record_tool_result("a", "fs.read", "ok")
    repo.save(session)  # then the process died

    resumed = repo.get(session.id)
    assert resumed.turn_open and resumed.current_turn == 1 and resumed.current_step == 1
    assert resumed.owed_calls() == [ToolCallData(id="b", name="fs.write", args={"x": 1})]
    refused(resumed, errors.TurnOpenInLog, lambda: resumed.start_turn())
    resumed.record_tool_result("b", "fs.write", "done")
    resumed.end_step()  # the resumed step has no usage
    assert resumed.start_step(MODEL) == 2
    resumed.record_assistant("all done")
    resumed.end_step(UsageData(prompt_tokens=9, completion_tokens=3))
    resumed.end_turn("completed")
    repo.save(resumed)
    log = [decode(r) for r in store.read_stream(session_stream(session.id))]
    assert [e.wire_name for e in log].count("turn/start") == 1
    step_ends = [e.payload for e in log if e.wire_name == "step/end"]
    assert [(p.step, p.usage) for p in step_ends] == [
        (1, None), (2, UsageData(prompt_tokens=9, completion_tokens=3)),
    ]


# --- R17/R18: compaction -------------------------------------------------------------------


def test_r18_upto_seq_is_the_seq_just_before_the_compaction() -> None:
    session = after_a_turn()
    mark = session.version
    session.set_model("main", MODEL)  # not model-visible: does not spoil the mark
    upto = session.compact("they said hello", mark=mark)
    events = session.collect_events()
    assert upto == mark + 1
    assert events[-1].payload.upto_seq == upto
    assert events[-1].originator_version == upto + 1


def test_r18_a_turn_after_the_mark_stays_and_the_summary_covers_up_to_the_mark() -> None:
    """A turn that ran while the summarizer worked is not summarized, and not hidden either:
    ``upto_seq`` is the mark, the turn comes after the summary (it declined before, and a busy
    session's every summary was paid for and thrown away)."""
    session = after_a_turn()
    mark = session.version  # the summarizer reads up to here...
    session.start_turn(text="one more thing")  # ...and this lands meanwhile
    session.end_turn("completed")
    session.collect_events()
    assert session.compact("summary up to the mark", mark=mark) == mark
    (event,) = session.collect_events()
    assert event.payload.upto_seq == mark and event.originator_version > mark + 1


def test_r18_a_summary_may_land_while_a_turn_that_began_after_its_mark_runs() -> None:
    session = after_a_turn()
    mark = session.version
    open_step(session, ToolCallData(id="c1", name="fs.read"))
    session.collect_events()
    assert session.compact("summary up to the mark", mark=mark) == mark  # the call stays whole
    session.collect_events()
    during = session.version  # a mark inside the open turn would cut it in two
    error = refused(session, errors.CompactionDeclined,
                    lambda: session.compact("a summary from inside the turn", mark=during))
    assert "owes tool results" in str(error)


def test_r18_a_compaction_after_the_mark_declines_a_second_summary() -> None:
    """Two processes summarized the same history: the second to record is declined (it would
    stack a summary of what the first already summarized)."""
    session = after_a_turn()
    mark = session.version  # both summarizers read up to here
    session.compact("the first process's summary", mark=mark)
    session.collect_events()
    error = refused(session, errors.CompactionDeclined,
                    lambda: session.compact("the second process's summary", mark=mark))
    assert f"covers up to seq {mark}" in str(error)


def test_r18_after_an_overtaken_summary_the_turn_it_left_can_be_compacted() -> None:
    """A summary up to its mark leaves the turn that overtook it as it is — and that turn is
    new history for the next compaction (it was 'nothing new' since the compaction's seq)."""
    session = after_a_turn()
    mark = session.version
    session.start_turn(text="one more thing")
    session.end_turn("completed")
    session.collect_events()
    assert session.compact("summary up to the mark", mark=mark) == mark
    session.collect_events()
    assert session.state.compacted_upto == mark
    assert session.state.last_visible_seq > mark  # the overtaking turn: not summarized yet
    later = session.version
    assert session.compact("summary of it all", mark=later) == later  # the seq before it


def test_r18_a_mark_inside_the_last_turn_is_refused() -> None:
    session = fresh()
    open_step(session, ToolCallData(id="c1", name="fs.read"))
    inside = session.version  # after the call, before its result
    session.record_tool_result("c1", "fs.read", "ok")
    session.end_step()
    session.end_turn("completed")
    session.collect_events()
    error = refused(session, errors.CompactionDeclined,
                    lambda: session.compact("a summary that would orphan the result",
                                            mark=inside))
    assert "falls inside turn 1" in str(error)


def test_r18_a_summary_waits_for_a_turn_whose_owner_cannot_fold_it_in() -> None:
    session = after_a_turn()
    mark = session.version
    session.start_turn(text="a turn an older release runs")
    session.collect_events()
    error = refused(session, errors.CompactionDeclined,
                    lambda: session.compact("summary", mark=mark, during_turn=False))
    assert "older release" in str(error)


def test_r17_compaction_declines_while_a_step_owes_tool_results() -> None:
    session = fresh()
    open_step(session, ToolCallData(id="c1", name="fs.read"))
    refused(session, errors.CompactionDeclined,
            lambda: session.compact("summary", mark=session.version))


def test_r17_the_latest_compaction_is_remembered_across_a_reload() -> None:
    store = MemoryStore()
    repo = SessionRepository(store)
    session = Session.start()
    session.start_turn(text="hi")
    session.end_turn("completed")
    session.compact("first", mark=session.version)
    session.compact("second", mark=session.version)
    repo.save(session)
    loaded = repo.get(session.id)
    assert loaded.state.last_compaction_seq == loaded.version == 6


# --- R20: one automatic title ----------------------------------------------------------------


def test_r20_exactly_one_automatic_title() -> None:
    session = fresh()
    assert session.title("Planning the launch", automatic=True) == "Planning the launch"
    session.collect_events()
    error = refused(session, errors.AlreadyTitled,
                    lambda: session.title("Another", automatic=True))
    assert error.rule == "R20"
    assert session.title("Renamed by hand", by=USER) == "Renamed by hand"  # explicit: allowed
    assert wire_names(session) == ["session/titled"]


def test_r20_titles_are_capped_and_the_mark_survives_a_reload() -> None:
    store = MemoryStore()
    repo = SessionRepository(store)
    session = Session.start()
    title = session.title("  word " * 40, automatic=True)
    assert len(title) <= 80 and title == " ".join(["word"] * 40)[:80].strip()
    repo.save(session)
    loaded = repo.get(session.id)
    refused(loaded, errors.AlreadyTitled, lambda: loaded.title("x", automatic=True))
    error = refused(loaded, errors.InvalidPayload, lambda: loaded.title("   "))
    assert error.field == "title"


# --- R26: tool results -----------------------------------------------------------------------


def test_r26_a_tool_result_for_a_closed_turn_is_rejected() -> None:
    session = fresh()
    open_step(session, ToolCallData(id="c1", name="fs.read"))
    session.end_turn("cancelled", by=USER)
    session.collect_events()
    error = refused(session, errors.ToolCallNotOwed,
                    lambda: session.record_tool_result("c1", "fs.read", "late"))
    assert error.rule == "R26"
    session.start_turn()  # a new turn does not owe the old call either
    session.collect_events()
    refused(session, errors.ToolCallNotOwed,
            lambda: session.record_tool_result("c1", "fs.read", "late"))


def test_r26_a_result_must_answer_an_owed_call_of_the_same_tool_once() -> None:
    session = fresh()
    open_step(session, ToolCallData(id="c1", name="fs.read"))
    refused(session, errors.ToolCallNotOwed,
            lambda: session.record_tool_result("c2", "fs.read", "never asked"))
    refused(session, errors.ToolCallNotOwed,
            lambda: session.record_tool_result("c1", "fs.write", "wrong tool"))
    session.record_tool_result("c1", "fs.read", "ok", is_error=False)
    session.collect_events()
    refused(session, errors.ToolCallNotOwed,
            lambda: session.record_tool_result("c1", "fs.read", "twice"))


# --- payload validation inside commands ----------------------------------------------------


@pytest.mark.parametrize(("command", "field"), [
    (lambda s: s.set_model("Main Role", MODEL), "role"),
    (lambda s: s.set_model("main", "no-provider"), "spec"),
    (lambda s: s.update_policy(["fs read"]), "patterns"),
    (lambda s: s.queue(None), "text"),
    (lambda s: s.start_turn(text=123), "text"),  # the second event of a two-event command
])
def test_an_invalid_payload_names_the_field_and_records_nothing(
    command: Callable[[Session], object], field: str
) -> None:
    session = fresh()
    error = refused(session, errors.InvalidPayload, lambda: command(session))
    assert error.field == field
    assert repr(field) in str(error)


def test_the_inbox_moves_into_the_turn() -> None:
    session = fresh()
    first = session.queue("first")
    session.queue("second", wake=True)
    session.start_turn()
    assert session.take_inbox() == ["first", "second"]
    assert session.pending_inbox() == {}
    events = session.collect_events()
    assert [e.payload.wire_name for e in events] == [
        "inbox/queued", "inbox/queued", "turn/start", "context/injected", "context/injected",
    ]
    assert events[3].payload.inbox_id == first


def test_the_live_state_equals_a_replay_of_the_log() -> None:
    """What the aggregate holds after running commands is what loading its log gives (so a
    session used right after it was created behaves like one loaded in another process)."""
    store = MemoryStore()
    repo = SessionRepository(store, snapshot_every=10_000)
    session = Session.start(agent="ops", agent_revision=3, roles={"main": MODEL},
                            policy_floor=["fs.*"])
    session.attach("agent-1", "host", 42)
    session.queue("also check the cache")
    session.start_turn(text="deploy it")
    session.take_inbox()
    session.start_step(MODEL)
    session.record_assistant("", [ToolCallData(id="c1", name="deploy", args={"env": "prod"}),
                                  ToolCallData(id="c2", name="fs.read")])
    session.request_approval("c1", "deploy", {"env": "prod"})
    session.resolve_approval("c1", "approved", by=USER)
    session.record_tool_result("c1", "deploy", "ok")
    session.set_model("titler", "openai:gpt-4o-mini", by=USER)
    session.update_policy(["fs.*", "deploy"], by=USER)
    session.title("Deploying", automatic=True)
    repo.save(session)
    assert repo.get(session.id).state == session.state  # mid-turn
    session.request_cancel(by=USER, reason="enough")
    session.record_tool_result("c2", "fs.read", "late but owed")
    session.end_step()
    session.end_turn("cancelled", by=USER)
    session.compact("summary", mark=session.version)
    session.detach("agent-1", "host", 42)
    session.close(by=USER)
    repo.save(session)
    assert repo.get(session.id).state == session.state


def test_a_gap_in_the_seqs_is_a_corrupt_record_at_the_position_after_it() -> None:
    store = MemoryStore()
    repo = SessionRepository(store)
    session = Session.start()
    session.start_turn(text="one")
    repo.save(session)
    records = store.read_stream(session_stream(session.id))
    fresh = Session.restore(session.id, 0, type(session.state)())
    fresh.replay(decode(records[0]))
    with pytest.raises(errors.CorruptRecord) as info:
        fresh.replay(decode(records[2]))  # seq 2 missing
    assert info.value.position == records[2].position
    assert "before seq 3" in str(info.value) and "at 1" in str(info.value)
    assert fresh.version == 1


def test_a_change_of_revision_is_recorded_once_and_kept_in_the_state() -> None:
    """R32: ``run_under`` records another revision (forward or back), never the same one."""
    from terret.domain.errors import InvalidPayload
    from terret.domain.events import AgentRevised

    session = Session.start(agent="ops", agent_revision=2, roles={"main": MODEL})
    session.run_under(2)
    assert session.state.agent_revision == 2 and len(session.collect_events()) == 1
    session.start_turn(text="go")
    session.run_under(3)
    session.run_under(1)
    revised = [e.payload for e in session.collect_events() if isinstance(e.payload, AgentRevised)]
    assert [(p.previous, p.revision, p.turn, p.in_turn) for p in revised] == [
        (2, 3, 1, True), (3, 1, 1, True)]
    assert session.state.agent_revision == 1
    with pytest.raises(InvalidPayload, match="the same revision"):
        AgentRevised(previous=4, revision=4, turn=0)
