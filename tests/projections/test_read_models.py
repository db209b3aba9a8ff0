"""Each read model through ``Views``, fed by a runner from logs written through ``Session``."""

from __future__ import annotations

from uuid import UUID

import pytest

from terret import Actor, Message, Session, ToolCall
from terret.domain.errors import ExpiryUnsupported
from terret.domain.events import ToolCallData, TurnStatus, UsageData
from terret.domain.store import EventStore, session_stream
from terret.projections import ProjectionRunner, UsageTotals, Views, ViewStore
from terret.runtime.retention import purge_session
from tests.projections.logs import MODEL, OPERATOR, Writer

OTHER_MODEL = "anthropic:claude-sonnet"


def test_messages_are_the_model_visible_events_in_seq_order(
    writer: Writer, runner: ProjectionRunner, views: Views
) -> None:
    sid = writer.start()
    inbox = writer.do(sid, lambda s: s.queue("also this"))
    del inbox
    writer.do(sid, lambda s: s.start_turn(text="list the files"), lambda s: s.take_inbox())
    writer.step(sid, "looking", calls=[("c1", "fs.list", {"path": "/"}),
                                       ("c2", "fs.stat", {"path": "/a"})],
                results=["a b", "file"])
    writer.step(sid, "there are two files")
    writer.do(sid, lambda s: s.end_turn("completed"))
    writer.do(sid, lambda s: s.title("Files"))  # not model-visible
    runner.catch_up()

    assert views.messages(sid) == [  # queued before the turn: before its input (R24)
        Message(role="user", text="also this"),
        Message(role="user", text="list the files"),
        Message(role="assistant", text="looking", tool_calls=(
            ToolCall("c1", "fs.list", {"path": "/"}), ToolCall("c2", "fs.stat", {"path": "/a"}))),
        Message(role="tool", text="a b", tool_call_id="c1", tool_name="fs.list"),
        Message(role="tool", text="file", tool_call_id="c2", tool_name="fs.stat"),
        Message(role="assistant", text="there are two files"),
    ]


def test_messages_of_a_session_do_not_leak_into_another(
    writer: Writer, runner: ProjectionRunner, views: Views
) -> None:
    a, b = writer.start(), writer.start()
    writer.turn(a, "to a", "from a")
    writer.turn(b, "to b", "from b")
    runner.catch_up()
    assert [m.text for m in views.messages(a)] == ["to a", "from a"]
    assert [m.text for m in views.messages(b)] == ["to b", "from b"]
    assert views.messages(UUID(int=7)) == []


def test_a_tool_error_result_is_marked(writer: Writer, runner: ProjectionRunner,
                                       views: Views) -> None:
    sid = writer.start()

    def run(s: Session) -> None:
        s.start_turn(text="go")
        s.start_step(MODEL)
        s.record_assistant("", [ToolCallData(id="c", name="sh", args={})])
        s.record_tool_result("c", "sh", "boom", is_error=True)

    writer.do(sid, run)
    runner.catch_up()
    assert views.messages(sid)[-1] == Message(role="tool", text="boom", tool_call_id="c",
                                              tool_name="sh", is_error=True)


def test_compaction_replaces_everything_up_to_its_mark_with_one_summary(
    writer: Writer, runner: ProjectionRunner, views: Views
) -> None:
    sid = writer.start()
    writer.turn(sid, "one", "first answer")
    writer.turn(sid, "two", "second answer")
    mark = writer.repo.get(sid).version
    writer.do(sid, lambda s: s.compact("summary one", mark=mark))
    writer.turn(sid, "three", "third answer")
    runner.catch_up()
    assert views.messages(sid) == [
        Message(role="user", text="summary one"),
        Message(role="user", text="three"),
        Message(role="assistant", text="third answer"),
    ]

    # Only the latest compaction applies: the older summary drops out.
    mark = writer.repo.get(sid).version
    writer.do(sid, lambda s: s.compact("summary two", mark=mark))
    writer.turn(sid, "four", "fourth answer")
    runner.catch_up()
    assert views.messages(sid) == [
        Message(role="user", text="summary two"),
        Message(role="user", text="four"),
        Message(role="assistant", text="fourth answer"),
    ]


def test_reading_messages_costs_what_came_since_the_last_compaction(
    writer: Writer, runner: ProjectionRunner, views: Views
) -> None:
    """SQLite's VM step counter is the cost observable: a session with a long history before
    its compaction reads in as many steps as one with a short history."""
    long, short = writer.start(), writer.start()
    for i in range(150):
        writer.turn(long, f"question {i}", f"answer {i}")
    writer.turn(short, "question", "answer")
    for sid in (long, short):
        mark = writer.repo.get(sid).version
        writer.do(sid, lambda s, m=mark: s.compact("summary", mark=m))  # type: ignore[misc]
        for i in range(5):
            writer.turn(sid, f"after {i}", f"reply {i}")
    runner.catch_up()

    def steps(sid: UUID) -> int:
        count = 0

        def tick() -> int:
            nonlocal count
            count += 1
            return 0

        db = views.store.db
        db.set_progress_handler(tick, 1)
        try:
            read = views.messages(sid)
        finally:
            db.set_progress_handler(None, 1)
        assert len(read) == 11
        return count

    assert steps(long) <= steps(short) * 1.1 + 5


def test_usage_sums_step_ends_per_session_turn_and_model(
    writer: Writer, runner: ProjectionRunner, views: Views
) -> None:
    sid, other = writer.start(), writer.start()
    writer.do(sid, lambda s: s.start_turn(text="hi"))
    writer.step(sid, "a", calls=[("c", "t", {})], results=["r"],
                usage=UsageData(prompt_tokens=100, completion_tokens=10, cost=0.5))
    writer.step(sid, "b", usage=UsageData(prompt_tokens=120, completion_tokens=20, cost=0.25),
                model=OTHER_MODEL)
    writer.do(sid, lambda s: s.end_turn("completed"))
    writer.turn(sid, "again", usage=UsageData(prompt_tokens=300, completion_tokens=30))
    writer.turn(other, "elsewhere", usage=UsageData(prompt_tokens=7, completion_tokens=1))
    runner.catch_up()

    assert views.usage(sid) == UsageTotals(520, 60, 0.75, 3)
    assert views.usage_by_turn(sid) == {1: UsageTotals(220, 30, 0.75, 2),
                                        2: UsageTotals(300, 30, 0.0, 1)}
    assert views.usage_by_model(sid) == {MODEL: UsageTotals(400, 40, 0.5, 2),
                                         OTHER_MODEL: UsageTotals(120, 20, 0.25, 1)}
    assert views.usage_by_model() == {MODEL: UsageTotals(407, 41, 0.5, 3),
                                      OTHER_MODEL: UsageTotals(120, 20, 0.25, 1)}
    assert views.last_prompt_tokens(sid, 1) == 120
    assert views.usage(UUID(int=1)) == UsageTotals()


def test_a_step_end_without_usage_counts_the_step_and_adds_no_tokens(
    writer: Writer, runner: ProjectionRunner, views: Views
) -> None:
    sid = writer.start()
    writer.do(sid, lambda s: s.start_turn(text="hi"))
    writer.step(sid, "a", usage=UsageData(prompt_tokens=10, completion_tokens=2, cost=0.1))
    writer.step(sid, "resumed", usage=None)  # what a resume writes (R15)
    runner.catch_up()
    assert views.usage(sid) == UsageTotals(10, 2, 0.1, 2)
    assert views.usage_by_model(sid) == {MODEL: UsageTotals(10, 2, 0.1, 2)}


def test_title_is_the_latest_titled_event(writer: Writer, runner: ProjectionRunner,
                                          views: Views) -> None:
    sid = writer.start()
    runner.catch_up()
    assert views.title(sid) is None
    writer.do(sid, lambda s: s.title("first", automatic=True))
    writer.do(sid, lambda s: s.title("  second   title ", by=OPERATOR))
    runner.catch_up()
    assert views.title(sid) == "second title"
    assert views.title(str(sid)) == "second title"
    assert views.title(f"session-{sid}") == "second title"


def test_policy_is_the_latest_update_or_none(writer: Writer, runner: ProjectionRunner,
                                             views: Views) -> None:
    sid = writer.start()
    runner.catch_up()
    assert views.policy(sid) is None
    writer.do(sid, lambda s: s.update_policy(["fs.*", "search"]))
    writer.do(sid, lambda s: s.update_policy([], by=OPERATOR))
    runner.catch_up()
    assert views.policy(sid) == []
    writer.do(sid, lambda s: s.update_policy(["deploy"]))
    runner.catch_up()
    assert views.policy(sid) == ["deploy"]


def test_model_roles_start_from_the_session_and_follow_model_set(
    writer: Writer, runner: ProjectionRunner, views: Views
) -> None:
    sid = writer.start(roles={"main": MODEL, "titler": MODEL})
    writer.do(sid, lambda s: s.set_model("main", OTHER_MODEL))
    writer.do(sid, lambda s: s.set_model("compactor", OTHER_MODEL))
    runner.catch_up()
    assert views.roles(sid) == {"main": OTHER_MODEL, "titler": MODEL, "compactor": OTHER_MODEL}


def _ask(writer: Writer, sid: UUID, calls: list[tuple[str, str, dict[str, object]]]) -> None:
    def run(s: Session) -> None:
        s.start_step(MODEL)
        s.record_assistant("", [ToolCallData(id=i, name=n, args=a)
                                for i, n, a in calls])
        for i, n, a in calls:
            s.request_approval(i, n, a)

    writer.do(sid, run)


def test_pending_approvals_are_the_open_turns_unresolved_requests(
    writer: Writer, runner: ProjectionRunner, views: Views
) -> None:
    sid, other = writer.start(), writer.start()
    writer.do(sid, lambda s: s.start_turn(text="deploy"))
    _ask(writer, sid, [("c1", "deploy", {"env": "prod"}), ("c2", "rm", {"path": "/tmp"})])
    writer.do(other, lambda s: s.start_turn(text="x"))
    _ask(writer, other, [("k", "deploy", {})])
    runner.catch_up()
    assert [(p.call_id, p.name, p.args, p.turn) for p in views.pending(sid)] == [
        ("c1", "deploy", {"env": "prod"}, 1), ("c2", "rm", {"path": "/tmp"}, 1)]
    assert {p.call_id for p in views.pending()} == {"c1", "c2", "k"}

    writer.do(sid, lambda s: s.resolve_approval("c1", "approved", by=OPERATOR, reason="fine"))
    runner.catch_up()
    assert [p.call_id for p in views.pending(sid)] == ["c2"]
    verdict = views.verdict_for(sid, "c1", "deploy", {"env": "prod"})
    assert verdict is not None
    assert (verdict.verdict, verdict.reason, verdict.by) == (
        "approved", "fine", {"actor": "operator", "id": "ops"})
    assert views.verdict_for(sid, "c2", "rm", {"path": "/tmp"}) is None  # still pending


def test_a_verdict_is_bound_to_call_id_tool_and_arguments(
    writer: Writer, runner: ProjectionRunner, views: Views
) -> None:
    sid = writer.start()
    writer.do(sid, lambda s: s.start_turn(text="deploy"))
    _ask(writer, sid, [("c1", "deploy", {"env": "prod", "n": 1})])
    writer.do(sid, lambda s: s.resolve_approval("c1", "denied", by=OPERATOR))
    runner.catch_up()
    found = views.verdict_for(sid, "c1", "deploy", {"n": 1, "env": "prod"})  # key order free
    assert found is not None and found.verdict == "denied"
    assert views.verdict_for(sid, "c1", "deploy", {"env": "staging", "n": 1}) is None
    assert views.verdict_for(sid, "c1", "deploy.v2", {"env": "prod", "n": 1}) is None
    assert views.verdict_for(sid, "c9", "deploy", {"env": "prod", "n": 1}) is None


def test_a_closed_turns_approvals_are_settled(writer: Writer, runner: ProjectionRunner,
                                              views: Views) -> None:
    sid = writer.start()
    writer.do(sid, lambda s: s.start_turn(text="deploy"))
    _ask(writer, sid, [("c1", "deploy", {}), ("c2", "deploy", {"x": 1})])
    writer.do(sid, lambda s: s.resolve_approval("c1", "approved", by=OPERATOR))
    writer.do(sid, lambda s: s.request_cancel(by=Actor(actor="user")))
    runner.catch_up()
    assert [p.call_id for p in views.pending(sid)] == ["c2"]
    # R13: cancelling denies the standing request durably, then closes the turn.
    writer.do(sid, lambda s: s.end_turn("cancelled", by=Actor(actor="user")))
    runner.catch_up()
    assert views.pending(sid) == []
    assert views.verdict_for(sid, "c1", "deploy", {}) is None  # the closed turn's verdict

    # A new turn reusing the call id does not inherit the old verdict.
    writer.do(sid, lambda s: s.start_turn(text="again"))
    _ask(writer, sid, [("c1", "deploy", {})])
    runner.catch_up()
    assert views.verdict_for(sid, "c1", "deploy", {}) is None
    assert [(p.call_id, p.turn) for p in views.pending(sid)] == [("c1", 2)]


def test_status_follows_the_turn_lifecycle(writer: Writer, runner: ProjectionRunner,
                                           views: Views) -> None:
    sid = writer.start()

    def status() -> tuple[object, ...]:
        runner.catch_up()
        s = views.status(sid)
        assert s is not None
        return (s.status, s.turn, s.turn_open, s.step, s.step_open,
                [c["id"] for c in s.owed], s.pending_approvals, s.cancel_requested)

    assert status() == ("idle", 0, False, 0, False, [], 0, False)
    assert not views.resumable(sid)
    writer.do(sid, lambda s: s.start_turn(text="go"))
    assert status() == ("running", 1, True, 0, False, [], 0, False)
    assert views.resumable(sid)
    assert views.resumable_sessions() == [sid]
    writer.do(sid, lambda s: s.start_step(MODEL))
    assert status() == ("running", 1, True, 1, True, [], 0, False)
    writer.do(sid, lambda s: s.record_assistant("", [ToolCallData(id="a", name="t"),
                                                     ToolCallData(id="b", name="u")]))
    assert status() == ("running", 1, True, 1, True, ["a", "b"], 0, False)
    writer.do(sid, lambda s: s.record_tool_result("a", "t", "done"))
    assert status() == ("running", 1, True, 1, True, ["b"], 0, False)
    owed = views.status(sid)
    assert owed is not None and owed.owed == [{"id": "b", "name": "u", "args": {}}]
    writer.do(sid, lambda s: s.request_approval("b", "u", {}))
    assert status() == ("waiting_approval", 1, True, 1, True, ["b"], 1, False)
    writer.do(sid, lambda s: s.resolve_approval("b", "approved", by=OPERATOR))
    assert status() == ("running", 1, True, 1, True, ["b"], 0, False)
    writer.do(sid, lambda s: s.record_tool_result("b", "u", "ok"), lambda s: s.end_step())
    assert status() == ("running", 1, True, 1, False, [], 0, False)
    writer.do(sid, lambda s: s.request_cancel(by=Actor(actor="user"), reason="stop"))
    assert status() == ("running", 1, True, 1, False, [], 0, True)
    writer.do(sid, lambda s: s.end_turn("cancelled"))
    assert status() == ("idle", 1, False, 1, False, [], 0, False)
    found = views.status(sid)
    assert found is not None and found.last_turn_status == "cancelled"
    assert not views.resumable(sid) and views.resumable_sessions() == []

    writer.do(sid, lambda s: s.close(by=OPERATOR))
    runner.catch_up()
    closed = views.status(sid)
    assert closed is not None and closed.closed and closed.status == "closed"
    assert views.status(UUID(int=3)) is None


def test_status_counts_the_inbox_and_lists_sessions_to_wake(
    writer: Writer, runner: ProjectionRunner, views: Views
) -> None:
    quiet, woken = writer.start(), writer.start()
    writer.do(quiet, lambda s: s.queue("later", inbox_id="nottrue"))
    writer.do(woken, lambda s: s.queue("now", wake=True))
    runner.catch_up()
    q, w = views.status(quiet), views.status(woken)
    assert q is not None and (q.inbox, q.wake) == (1, False)
    assert w is not None and (w.inbox, w.wake) == (1, True)
    assert views.sessions_to_wake() == [woken]

    writer.do(woken, lambda s: s.start_turn(trigger="wake"))
    runner.catch_up()
    assert views.sessions_to_wake() == []  # a turn is open
    writer.do(woken, lambda s: s.take_inbox())
    writer.do(woken, lambda s: s.end_turn("empty"))
    runner.catch_up()
    taken = views.status(woken)
    assert taken is not None and (taken.inbox, taken.wake) == (0, False)
    assert views.sessions_to_wake() == []


def test_sessions_index_joins_title_status_and_usage(
    writer: Writer, runner: ProjectionRunner, views: Views
) -> None:
    first = writer.start(agent="coder")
    writer.turn(first, "hi", usage=UsageData(prompt_tokens=5, completion_tokens=1, cost=0.01))
    writer.do(first, lambda s: s.title("First"))
    second = writer.start(agent="ops")
    writer.do(second, lambda s: s.start_turn(text="deploy"))
    _ask(writer, second, [("c", "deploy", {})])
    third = writer.start()
    writer.do(third, lambda s: s.close(by=OPERATOR, reason="done"))
    runner.catch_up()

    index = {s.id: s for s in views.sessions()}
    assert set(index) == {str(first), str(second), str(third)}
    one = index[str(first)]
    assert (one.agent, one.title, one.status, one.closed) == ("coder", "First", "idle", False)
    assert one.usage == UsageTotals(5, 1, 0.01, 1)
    assert one.events == writer.repo.get(first).version
    assert one.created <= one.last_activity
    assert index[str(second)].status == "waiting_approval"
    assert index[str(third)].status == "closed" and index[str(third)].closed
    assert [s.id for s in views.sessions(status="waiting_approval")] == [str(second)]
    assert len(views.sessions(limit=2)) == 2
    summary = views.summary(first)
    assert summary is not None and summary.as_dict()["title"] == "First"
    assert views.summary(UUID(int=5)) is None


def test_sessions_index_filters_then_pages(writer: Writer, runner: ProjectionRunner,
                                           views: Views) -> None:
    idle = [writer.start(agent="coder") for _ in range(4)]
    for sid in idle:
        writer.turn(sid, "hi")
    writer.do(idle[1], lambda s: s.title("Fix the Linker"))
    closed = writer.start(agent="coder")
    writer.do(closed, lambda s: s.close(by=OPERATOR, reason="done"))
    other = writer.start(agent="ops")
    runner.catch_up()

    newest_first = [s.id for s in views.sessions()]
    assert newest_first[0] == str(other) and len(newest_first) == 6
    coder_idle = [i for i in newest_first if i in {str(s) for s in idle}]
    assert [s.id for s in views.sessions(status="idle", agent="coder")] == coder_idle
    # The filters first, then the offset, then the limit.
    assert [s.id for s in views.sessions(status="idle", agent="coder", offset=1, limit=2)
            ] == coder_idle[1:3]
    assert [s.id for s in views.sessions(status="idle", offset=3)] == \
        [i for i in newest_first if i != str(closed)][3:]
    assert views.sessions(status="idle", limit=0) == []
    assert [s.id for s in views.sessions(title="linker")] == [str(idle[1])]
    mark = views.summary(idle[2])
    assert mark is not None
    since = views.sessions(since=mark.last_activity)
    until = views.sessions(until=mark.last_activity)
    assert all(s.last_activity >= mark.last_activity for s in since)
    assert all(s.last_activity <= mark.last_activity for s in until)
    assert str(idle[2]) in {s.id for s in since} & {s.id for s in until}


@pytest.mark.parametrize("status", ["completed", "failed", "empty", "rejected"])
def test_every_turn_end_status_returns_the_session_to_idle(
    status: TurnStatus, writer: Writer, runner: ProjectionRunner, views: Views
) -> None:
    sid = writer.start()
    writer.do(sid, lambda s: s.start_turn(text="go"))
    writer.do(sid, lambda s: s.end_turn(status))
    runner.catch_up()
    found = views.status(sid)
    assert found is not None
    assert (found.status, found.last_turn_status, found.resumable) == ("idle", status, False)


@pytest.mark.parametrize("processed_before", [True, False])
@pytest.mark.parametrize("max_age", [None, 3600])
def test_a_purged_session_is_forgotten_by_every_view(
    processed_before: bool, max_age: int | None, writer: Writer, store: EventStore,
    runner: ProjectionRunner, views: Views, view_store: ViewStore
) -> None:
    """R27. With ``max_age`` the store keeps the events until it expires them, so a catch-up
    may see the session's events and its purge in one batch; a store without native expiry
    refuses the expiry."""
    gone, kept = writer.start(), writer.start()
    for sid in (gone, kept):
        writer.turn(sid, "hello", usage=UsageData(prompt_tokens=5, completion_tokens=1))
        writer.do(sid, lambda s: s.title("t"), lambda s: s.update_policy(["x"]))
        writer.do(sid, lambda s: s.close(by=OPERATOR))
    if processed_before:
        runner.catch_up()
    if max_age is not None and not store.native_expiry:
        with pytest.raises(ExpiryUnsupported):  # it would hide a session whose events stay
            purge_session(writer.repo, gone, by=OPERATOR, max_age=max_age)
        max_age = None
    purge_session(writer.repo, gone, by=OPERATOR, max_age=max_age)
    runner.catch_up()

    stream = session_stream(gone)
    for projection in runner.projections:
        for table, rows in projection.dump(view_store.db).items():
            if table == "sessions_purged":  # the purge's own record, as the retention stream's
                assert [r[0] for r in rows] == [stream]
                continue
            assert not [r for r in rows if stream in r], (projection.name, table)
    assert [s.id for s in views.sessions()] == [str(kept)]
    assert views.messages(kept) != [] and views.title(kept) == "t"
    assert all(runner.verify(p.name) == [] for p in runner.projections)
