"""Compaction (R17–R19), titling (R20) and cost accounting with the spend cap (R21)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from terret import (
    Actor,
    FixedSummarizer,
    Message,
    Reply,
    RuntimeConfig,
    ScriptedProvider,
    StaticResolver,
    Usage,
    call,
)
from terret.adapters.summarizers import RoleSummarizer
from terret.adapters.titler import RoleTitler
from terret.domain.errors import CompactionDeclined, ConfigurationError
from terret.runtime import BudgetGuard, render_history
from tests.runtime.conftest import MakeRuntime, OpenedStore
from tests.runtime.kit import (
    calls,
    drain_upkeep,
    final,
    names,
    only,
    other_process,
    read_log,
    turn_in_background,
    wait_for_event,
    wait_until,
)


class Summarizer:
    """Records what it was given; runs ``during`` while "thinking"; returns ``reply``."""

    def __init__(self, reply: str | None = "a summary",
                 during: Callable[[], object] | None = None) -> None:
        self.reply = reply
        self.during = during
        self.rendered: list[str] = []

    def summarize(self, messages: Sequence[Message]) -> str | None:
        self.rendered.append(render_history(messages))
        if self.during is not None:
            self.during()
        return self.reply


# --- compaction -----------------------------------------------------------------------------


def test_r17_a_compaction_replaces_everything_up_to_upto_seq_with_one_user_message(
        make_runtime: MakeRuntime, store) -> None:
    provider = ScriptedProvider([calls(("noop", {}, "c-1")), final("first answer"),
                                 final("second answer")])
    rt = make_runtime(provider, summarizer=FixedSummarizer(limit=2000))
    sid = rt.create_session()
    rt.run_turn(sid, "first question")
    upto = rt.compact(sid)
    (compacted,) = only(read_log(store, sid), "session/compacted")
    assert compacted.data["upto_seq"] == upto == compacted.seq - 1
    summary = compacted.data["summary"]
    assert "[user] first question" in summary and "[assistant] first answer" in summary
    rt.catch_up_views()
    assert rt.views.messages(sid) == [Message(role="user", text=summary)]
    rt.run_turn(sid, "second question")
    seen = provider.requests[-1].messages
    assert [(m.role, m.text) for m in seen] == [("user", summary), ("user", "second question")]


def test_r17_only_the_latest_compaction_applies(make_runtime: MakeRuntime, store) -> None:
    summarizer = Summarizer()
    rt = make_runtime([final("one"), final("two")], summarizer=summarizer)
    sid = rt.create_session()
    rt.run_turn(sid, "q1")
    summarizer.reply = "first summary"
    rt.compact(sid)
    rt.run_turn(sid, "q2")
    summarizer.reply = "second summary"
    rt.compact(sid)
    rt.catch_up_views()
    assert rt.views.messages(sid) == [Message(role="user", text="second summary")]
    # the second summarizer read the first summary, not the history it replaced
    assert summarizer.rendered[1].splitlines() == [
        "[user] first summary", "[user] q2", "[assistant] two"]
    assert len(only(read_log(store, sid), "session/compacted")) == 2


def test_r18_upto_seq_is_computed_after_the_summarizer_returned_and_invisible_events_fold_under(
        make_runtime: MakeRuntime, store) -> None:
    holder: dict[str, object] = {}
    summarizer = Summarizer(during=lambda: holder["rt"].set_policy(  # type: ignore[attr-defined]
        holder["sid"], ["noop"], by=Actor(actor="operator")))
    rt = make_runtime([final("a")], summarizer=summarizer)
    sid = rt.create_session()
    holder.update(rt=rt, sid=sid)
    rt.run_turn(sid, "q")
    upto = rt.compact(sid)
    log = read_log(store, sid)
    policy = only(log, "policy/updated")[0]
    compacted = only(log, "session/compacted")[0]
    assert upto == compacted.seq - 1
    assert policy.seq <= upto  # landed during summarizing, falls under the boundary


def test_r18_a_turn_landing_meanwhile_stays_after_a_summary_of_what_came_before(
        make_runtime: MakeRuntime, store) -> None:
    holder: dict[str, object] = {}
    once = iter([lambda: holder["rt"].run_turn(  # type: ignore[attr-defined]
        holder["sid"], "a question nobody summarized")])
    summarizer = Summarizer(during=lambda: [f() for f in once])
    rt = make_runtime([final("a"), final("b")], summarizer=summarizer)
    sid = rt.create_session()
    holder.update(rt=rt, sid=sid)
    rt.run_turn(sid, "q")
    drain_upkeep(rt)  # the turn's title first: landing after the mark, it would fold under
    mark = len(read_log(store, sid))
    assert rt.compact(sid) == mark  # the summary covers what it read, not the turn after it
    log = read_log(store, sid)
    (compacted,) = only(log, "session/compacted")
    assert compacted.data["upto_seq"] == mark and compacted.seq > mark + 1
    assert summarizer.rendered == ["[user] q\n[assistant] a"]
    rt.catch_up_views()
    texts = [m.text for m in rt.views.messages(sid)]
    assert texts == ["a summary", "a question nobody summarized", "b"]
    # The turn it left is new history: the next compaction takes it (not "nothing new").
    head = len(read_log(store, sid))
    assert rt.compact(sid) == head
    assert summarizer.rendered[-1].splitlines() == [
        "[user] a summary", "[user] a question nobody summarized", "[assistant] b"]


def test_r19_a_manual_compaction_while_a_turn_is_open_declines_without_a_model_call(
        make_runtime: MakeRuntime, store, gates) -> None:
    gate = gates()
    provider = ScriptedProvider([final("a"), final("b", gate=gate)])
    summarizer = Summarizer()
    rt = make_runtime(provider, summarizer=summarizer)
    sid = rt.create_session()
    rt.run_turn(sid, "q1")
    job = turn_in_background(rt, sid, "q2")
    wait_until(lambda: len(provider.requests) == 2, what="the live turn's model request")
    with pytest.raises(CompactionDeclined, match="turn 2 is open"):
        rt.compact(sid)
    assert summarizer.rendered == []  # refused before the summarizer was asked
    gate.set()
    assert job.join().status == "completed"
    assert not only(read_log(store, sid), "session/compacted")
    rt.catch_up_views()
    assert [m.text for m in rt.views.messages(sid)] == ["q1", "a", "q2", "b"]


def test_r19_the_budget_triggers_compaction_on_turn_end(make_runtime: MakeRuntime,
                                                        store) -> None:
    summarizer = Summarizer()
    provider = ScriptedProvider([
        final("small", usage=Usage(50, 5)),
        Reply(tool_calls=[call("noop")], usage=Usage(500, 5)), final("big", usage=Usage(90, 5)),
        final("big", usage=Usage(150, 5)),
    ])
    rt = make_runtime(provider, summarizer=summarizer,
                      config=RuntimeConfig(compaction_budget=100))
    sid = rt.create_session()
    rt.run_turn(sid, "under budget")
    rt.run_turn(sid, "the last step is under budget")  # only the last step/end counts
    drain_upkeep(rt)
    assert not only(read_log(store, sid), "session/compacted")
    assert summarizer.rendered == []
    rt.run_turn(sid, "over budget")
    log = wait_for_event(store, sid, "session/compacted")
    drain_upkeep(rt)
    log = read_log(store, sid)
    (compacted,) = only(log, "session/compacted")
    last_end = only(log, "turn/end")[-1]
    assert compacted.seq > last_end.seq
    assert compacted.data["upto_seq"] == compacted.seq - 1


def test_r19_a_summarizer_decline_is_none_and_appends_nothing(make_runtime: MakeRuntime,
                                                              store) -> None:
    rt = make_runtime([final(usage=Usage(500, 5))], summarizer=Summarizer(reply=None),
                      config=RuntimeConfig(compaction_budget=100))
    sid = rt.create_session()
    assert rt.run_turn(sid, "q").status == "completed"  # the automatic attempt declined
    drain_upkeep(rt)
    assert rt.compact(sid) is None
    assert not only(read_log(store, sid), "session/compacted")


def test_r19_an_unconfigured_role_summarizer_raises_by_hand_and_never_fails_the_turn(
        make_runtime: MakeRuntime, store) -> None:
    def resolve_role(role: str):  # noqa: ANN202
        raise ConfigurationError(f"model role {role!r} is not configured")

    summarizer = RoleSummarizer(resolve_role)
    rt = make_runtime([final(usage=Usage(500, 5))], summarizer=summarizer,
                      config=RuntimeConfig(compaction_budget=100))
    sid = rt.create_session()
    assert rt.run_turn(sid, "q").status == "completed"
    drain_upkeep(rt)
    assert not only(read_log(store, sid), "session/compacted")
    with pytest.raises(ConfigurationError, match="compactor"):
        rt.compact(sid)


def test_r19_the_role_summarizer_asks_the_compactor_role(make_runtime: MakeRuntime,
                                                         store) -> None:
    compactor = ScriptedProvider([Reply(text="they asked, we answered")], name="cheap")
    resolver = StaticResolver({"cheap": compactor})
    summarizer = RoleSummarizer(lambda role: resolver.resolve({"compactor": "cheap:mini"}[role]))
    rt = make_runtime([final("answer")], summarizer=summarizer)
    sid = rt.create_session()
    rt.run_turn(sid, "question")
    rt.compact(sid)
    (compacted,) = only(read_log(store, sid), "session/compacted")
    assert compacted.data["summary"].endswith("they asked, we answered")
    (request,) = compactor.requests
    assert request.model == "mini"
    assert "[user] question\n[assistant] answer" in request.messages[-1].text


def test_r19_history_renders_one_role_tagged_line_per_message_part(make_runtime: MakeRuntime,
                                                                   store) -> None:
    summarizer = Summarizer(reply=None)
    rt = make_runtime([
        Reply(text="let me look\nfirst", tool_calls=[call("status", {"env": "eu"}, "c-1"),
                                                     call("boom", {}, "c-2")]),
        final("all good"),
    ], summarizer=summarizer)
    sid = rt.create_session()
    rt.run_turn(sid, "is eu\nup?")
    rt.compact(sid)
    assert summarizer.rendered[0].splitlines() == [
        "[user] is eu up?",
        "[assistant] let me look first",
        '[assistant tool call status#c-1] {"env":"eu"}',
        "[assistant tool call boom#c-2] {}",
        "[tool result status#c-1] eu: green",
        "[tool error boom#c-2] RuntimeError: the disk is on fire",
        "[assistant] all good",
    ]


# --- titles -----------------------------------------------------------------------------------


class Titler:
    def __init__(self, reply: str | None = None, fail: bool = False) -> None:
        self.reply = reply
        self.fail = fail
        self.calls = 0

    def title(self, messages: list[object]) -> str | None:
        self.calls += 1
        if self.fail:
            raise RuntimeError("titler is down")
        return self.reply


def test_r20_exactly_one_automatic_title_at_the_first_turn_end(make_runtime: MakeRuntime,
                                                               store) -> None:
    titler = Titler("Deploying the EU cluster")
    rt = make_runtime(ScriptedProvider(default=final()), titler=titler)
    sid = rt.create_session()
    rt.run_turn(sid, "deploy eu")
    wait_for_event(store, sid, "session/titled")
    rt.run_turn(sid, "again")
    rt.run_turn(sid, "and again")
    drain_upkeep(rt)
    log = read_log(store, sid)
    (titled,) = only(log, "session/titled")
    assert titled.seq > only(log, "turn/end")[0].seq
    assert titled.data == {"title": "Deploying the EU cluster", "by": {"actor": "agent"}}
    assert rt.title(sid) == "Deploying the EU cluster"
    assert titler.calls == 1
    rt.catch_up_views()
    assert all("EU cluster" not in m.text for m in rt.views.messages(sid))  # metadata only


@pytest.mark.parametrize("titler", [None, Titler(fail=True), Titler(reply=None)],
                         ids=["no-titler", "titler-fails", "titler-declines"])
def test_r20_without_a_titler_the_first_user_message_cut_to_40_characters(
        make_runtime: MakeRuntime, store, titler: Titler | None) -> None:
    rt = make_runtime([final()], titler=titler)
    sid = rt.create_session()
    text = "Please migrate the billing database to the new cluster tonight"
    rt.run_turn(sid, text)
    wait_for_event(store, sid, "session/titled")
    assert rt.title(sid) == text[:40] == "Please migrate the billing database to t"


def test_r20_a_first_turn_with_nothing_said_leaves_the_title_to_the_next_one(
        make_runtime: MakeRuntime, opened: OpenedStore) -> None:
    """A first turn that ended ``empty`` (no user message): no placeholder title (it became
    "Untitled session" for good, the one automatic title); the next turn's text titles it —
    here a turn run by another process."""
    rt = make_runtime([final()])
    sid = rt.create_session()
    assert rt.run_turn(sid, None).status == "empty"
    drain_upkeep(rt)
    assert "session/titled" not in names(read_log(opened.store, sid))
    rt.close()
    other_process(opened.uri, "turn", str(sid), "the real question")
    later = make_runtime([final()])
    later.run_turn(sid, "and another")
    drain_upkeep(later)
    titles = [e.data["title"] for e in only(read_log(opened.store, sid), "session/titled")]
    assert titles == ["the real question"], titles


def test_r20_stored_titles_are_capped_at_80_characters(make_runtime: MakeRuntime,
                                                       store) -> None:
    rt = make_runtime([final()], titler=Titler("word " * 60))
    sid = rt.create_session()
    rt.run_turn(sid, "hi")
    (titled,) = only(wait_for_event(store, sid, "session/titled"), "session/titled")
    assert len(titled.data["title"]) <= 80 and titled.data["title"].startswith("word word")
    assert rt.set_title(sid, "x" * 200, by=Actor(actor="user")) == "x" * 80
    assert rt.title(sid) == "x" * 80  # the latest one wins


def test_r20_a_session_the_title_view_shows_titled_is_not_read_again(
        make_runtime: MakeRuntime, store, monkeypatch: pytest.MonkeyPatch) -> None:
    titler = Titler("First")
    rt = make_runtime(ScriptedProvider(default=final()), titler=titler)
    sid = rt.create_session()
    rt.run_turn(sid, "hi")
    wait_for_event(store, sid, "session/titled")
    rt.catch_up_views()
    drain_upkeep(rt)

    def no_read(session_id: object) -> None:
        raise AssertionError("the titler read a session its title view shows titled")

    monkeypatch.setattr(rt.writer, "load", no_read)
    monkeypatch.setattr(rt.writer, "refresh", no_read)
    rt.titler.title_now(sid)  # what every later turn/end of the session queues
    assert titler.calls == 1
    assert len(only(read_log(store, sid), "session/titled")) == 1


def test_r20_the_titler_role_is_used_when_configured(make_runtime: MakeRuntime,
                                                     store) -> None:
    model = ScriptedProvider([Reply(text='Title: "EU rollout, phase two."')], name="tiny")
    resolver = StaticResolver({"tiny": model})
    titler = RoleTitler(lambda role: resolver.resolve({"titler": "tiny:t1"}[role]))
    rt = make_runtime([final()], titler=titler)
    sid = rt.create_session()
    rt.run_turn(sid, "roll out phase two in the EU")
    wait_for_event(store, sid, "session/titled")
    assert rt.title(sid) == "EU rollout, phase two"
    assert model.requests[0].model == "t1"


# --- cost ---------------------------------------------------------------------------------


def test_r21_usage_is_the_sum_over_every_step_end_and_survives_a_restart(
        make_runtime: MakeRuntime, store) -> None:
    rt = make_runtime([
        calls(("noop", {}), usage=Usage(100, 10, 0.01)), final(usage=Usage(120, 20, 0.02)),
        final(usage=Usage(200, 30, 0.03)),
    ])
    sid = rt.create_session()
    rt.run_turn(sid, "one")
    rt.run_turn(sid, "two")
    expected = {"prompt_tokens": 420, "completion_tokens": 60, "cost": 0.06, "steps": 3}
    usage = rt.usage(sid)
    assert usage["cost"] == pytest.approx(0.06)
    assert {**usage, "cost": 0.06} == expected
    restarted = make_runtime()  # a fresh process: the same figures, from the log alone
    again = restarted.usage(sid)
    assert {**again, "cost": round(again["cost"], 6)} == expected
    by_model = restarted.views.usage_by_model(sid)
    assert set(by_model) == {"scripted:default"}
    assert by_model["scripted:default"].steps == 3


def test_r21_a_resumed_step_without_usage_counts_as_a_step_with_zero_tokens(
        make_runtime: MakeRuntime, store) -> None:
    from tests.runtime.kit import LogBuilder

    dead = make_runtime(start=False)
    sid = dead.create_session()
    b = LogBuilder(store, sid)
    b.do(lambda s: s.start_turn(text="q"))
    b.do(lambda s: s.start_step("scripted:default"))
    b.do(lambda s: s.record_assistant("almost"))
    fresh = make_runtime([final(usage=Usage(10, 1, 0.5))])
    fresh.resume_turn(sid)
    assert fresh.usage(sid) == {"prompt_tokens": 10, "completion_tokens": 1, "cost": 0.5,
                                "steps": 2}


def test_r21_the_spend_cap_parks_the_turn_before_the_step_that_would_pass_it(
        make_runtime: MakeRuntime, store) -> None:
    """The spend cap no longer rejects the step (issue 14): the turn parks on its budget,
    recorded, and goes on when a budget covers its next step."""
    provider = ScriptedProvider([calls(("noop", {}), usage=Usage(10, 1, 0.04))] * 3,
                                default=final(usage=Usage(10, 1, 0.04)))
    rt = make_runtime(provider, config=RuntimeConfig(spend_cap=0.1))
    sid = rt.create_session()
    job = turn_in_background(rt, sid, "spend")
    wait_until(lambda: only(read_log(store, sid), "budget/exceeded"), what="the budget park")
    log = read_log(store, sid)
    assert len(only(log, "step/end")) == 2  # 0.08 spent; a third 0.04 step would pass 0.10
    (parked,) = only(log, "budget/exceeded")
    assert parked.data["by"] == {"actor": "budget"} and parked.data["limit"] == 0.1
    assert parked.data["spent"] == pytest.approx(0.08)
    assert parked.data["estimate"] == pytest.approx(0.04)
    assert not only(log, "turn/end") and not job.done
    assert rt.usage(sid)["cost"] == pytest.approx(0.08)
    rt.set_budget(sid, 0.2, by=Actor(actor="operator"))
    assert job.join().status == "completed"  # a third call and the final answer: 0.16
    assert rt.usage(sid)["cost"] == pytest.approx(0.16)
    assert len(only(read_log(store, sid), "budget/exceeded")) == 1


def test_r21_the_spend_cap_counts_the_session_total_the_usage_view_reports(
        make_runtime: MakeRuntime, store) -> None:
    costs = [0.1, 0.2, 0.07, 0.013, 0.3]
    rt = make_runtime([final(usage=Usage(10, 1, c)) for c in costs])
    sid = rt.create_session()
    for n in range(len(costs)):
        assert rt.run_turn(sid, f"turn {n}").status == "completed"
    rt.catch_up_views()
    total = rt.views.usage(sid).cost
    state = rt.writer.load(sid).state
    assert state.total_cost == total  # exactly: the budget and the view agree to the last bit
    assert BudgetGuard(total).check(state).exceeded  # type: ignore[union-attr]  # spent >= cap
    check = BudgetGuard(total + 0.31).check(state)
    assert check is not None and not check.exceeded  # the dearest call (0.3) fits
    assert check.spent == total and check.estimate == 0.3
    assert BudgetGuard(total + 0.29).check(state).exceeded  # type: ignore[union-attr]
    assert BudgetGuard(None).check(state) is None  # no budget at all


def test_a_summary_holding_half_a_character_is_recorded_made_whole(
        make_runtime: MakeRuntime, store) -> None:
    """A summarizer's text with a lone surrogate (half a character) was refused by the log —
    ``InvalidPayload``, the summary paid for and lost, and ``terret compact`` said the command
    line was wrong. It is recorded with U+FFFD in place of the half, a pair made one."""
    class Halves:
        def summarize(self, messages: Sequence[Message]) -> str:
            return "kept \ud83c\udf89 and \ud800 alone"

    rt = make_runtime([final("answer")], summarizer=Halves())
    sid = rt.create_session()
    rt.run_turn(sid, "question")
    assert rt.compact(sid) is not None
    (compacted,) = only(read_log(store, sid), "session/compacted")
    assert compacted.data["summary"] == "kept 🎉 and \ufffd alone"
