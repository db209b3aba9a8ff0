"""Issue 11: the compactor's mark is the store's head (R18), also for a turn another process ran;
the default summarizer is the role summarizer on the session's ``compactor`` role (R19); the
``titler`` role is used when configured (R20); a fixed summarizer keeps the latest turn.

Every test runs on SQLite and on the EventStoreDB emulator; "another process" is a second
``Runtime`` on a second connection to the same store (its own writer and cache, as a second
process has).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

import pytest

from terret import (
    Actor,
    FixedSummarizer,
    Message,
    Reply,
    RuntimeConfig,
    ScriptedProvider,
    Usage,
    call,
    tool,
)
from terret.domain.errors import ConfigurationError
from terret.domain.store import EventStore
from terret.runtime import render_history
from terret.runtime.runtime import UPKEEP_THREADS
from tests.runtime.conftest import MakeRuntime
from tests.runtime.kit import (
    Background,
    NoArgs,
    drain_upkeep,
    final,
    only,
    read_log,
    turn_in_background,
    wait_for_event,
    wait_until,
)

OPERATOR = Actor(actor="operator", id="test")


class Recording:
    """A summarizer that records the history it was given."""

    def __init__(self, reply: str = "a summary") -> None:
        self.reply = reply
        self.rendered: list[str] = []

    def summarize(self, messages: Sequence[Message]) -> str | None:
        self.rendered.append(render_history(messages))
        return self.reply


def roles(**extra: str) -> dict[str, str]:
    return {"main": "scripted:default", **extra}


# --- R18: the mark is the store's head, not this process's last write -------------------------


def test_r18_a_manual_compaction_after_another_processs_turn_takes_the_stores_head_as_mark(
        other_store: EventStore, make_runtime: MakeRuntime, store: EventStore) -> None:
    summarizer = Recording()
    here = make_runtime([final("first answer")], summarizer=summarizer)
    sid = here.create_session()
    here.run_turn(sid, "first question")
    drain_upkeep(here)  # this process's last write is now behind it
    there = make_runtime([final("second answer")], on_store=other_store, start=False)
    assert there.run_turn(sid, "second question").status == "completed"

    upto = here.compact(sid)  # its mark is the store's head: the other turn is summarized

    (compacted,) = only(read_log(store, sid), "session/compacted")
    assert upto == compacted.data["upto_seq"] == compacted.seq - 1
    assert summarizer.rendered[-1].splitlines() == [
        "[user] first question", "[assistant] first answer",
        "[user] second question", "[assistant] second answer"]


def test_r18_a_summary_lands_while_another_process_runs_the_next_turn_which_goes_on(
        other_store: EventStore, make_runtime: MakeRuntime, store: EventStore, gates) -> None:
    """The busy session: the summarizer (here, in a second process) is still working when the
    owner starts the next turn. The summary is recorded while that turn runs; the owner folds
    it in (R5), its next step sees the summary and the whole turn so far, and it completes."""
    gate = gates()
    provider = ScriptedProvider([final("first answer"),
                                 Reply(tool_calls=[call("look", {}, "c-look")], gate=gate),
                                 final("second answer")])
    owner = make_runtime(provider, tools=[tool("look", args=NoArgs)(lambda a, c: "seen")])
    sid = owner.create_session()
    owner.run_turn(sid, "first question")
    drain_upkeep(owner)
    turns: list[Background] = []

    class StartsTheNextTurn(Recording):
        def summarize(self, messages: Sequence[Message]) -> str | None:
            turns.append(turn_in_background(owner, sid, "second question"))
            wait_until(lambda: len(provider.requests) == 2, what="the next turn's request")
            return super().summarize(messages)

    there = make_runtime([], on_store=other_store, start=False, summarizer=StartsTheNextTurn())
    mark = len(read_log(store, sid))
    assert there.compact(sid) == mark  # recorded while the owner's turn waits on its model
    gate.set()
    assert turns[0].join().status == "completed"
    names = [e.name for e in read_log(store, sid)]
    assert names.index("turn/start", mark) < names.index("session/compacted") \
        < names.index("turn/end", mark)
    last = [m.text for m in provider.requests[-1].messages]
    assert last == ["a summary", "second question", "", "seen"]


def test_r19_the_budget_trigger_compacts_after_a_heavy_turn_another_process_ran(
        other_store: EventStore, make_runtime: MakeRuntime, store: EventStore,
        caplog: pytest.LogCaptureFixture) -> None:
    summarizer = Recording()
    here = make_runtime([final("light answer", usage=Usage(10, 1))], summarizer=summarizer,
                        config=RuntimeConfig(compaction_budget=100))
    sid = here.create_session()
    here.run_turn(sid, "light question")
    drain_upkeep(here)
    assert not only(read_log(store, sid), "session/compacted")
    there = make_runtime([final("heavy answer", usage=Usage(500, 5))], on_store=other_store,
                         start=False)
    with caplog.at_level(logging.WARNING, logger="terret.maintenance"):
        assert there.run_turn(sid, "heavy question").status == "completed"
        drain_upkeep(here)  # the serving process saw the heavy turn/end and acted on it

    assert not [r for r in caplog.records if "skipped" in r.getMessage()]
    log = read_log(store, sid)
    (compacted,) = only(log, "session/compacted")
    assert compacted.seq > only(log, "turn/end")[-1].seq
    assert compacted.data["upto_seq"] == compacted.seq - 1
    assert summarizer.rendered[-1].splitlines()[-2:] == [
        "[user] heavy question", "[assistant] heavy answer"]


def test_r19_the_budget_trigger_summarizes_up_to_its_turn_when_the_next_one_already_runs(
        other_store: EventStore, make_runtime: MakeRuntime, store: EventStore, gates) -> None:
    """A busy session: by the time the serving process's compactor looks, another process has
    started the next turn. It summarizes the history as it stood at the heavy turn's end (it
    skipped, and the context grew past the budget, before) and the running turn goes on."""
    summarizer = Recording()
    here = make_runtime(summarizer=summarizer, config=RuntimeConfig(compaction_budget=100))
    held = threading.Event()
    for _ in range(UPKEEP_THREADS):  # every upkeep thread: the trigger runs once the next
        # turn has begun
        here.background(held.wait)
    gate = gates()
    provider = ScriptedProvider([final("heavy answer", usage=Usage(500, 5)),
                                 final("next answer", gate=gate)])
    there = make_runtime(provider, on_store=other_store, start=False)
    sid = there.create_session()
    assert there.run_turn(sid, "heavy question").status == "completed"
    heavy_end = only(read_log(store, sid), "turn/end")[-1].seq
    job = turn_in_background(there, sid, "next question")
    wait_until(lambda: len(provider.requests) == 2, what="the next turn's model request")
    held.set()
    wait_for_event(store, sid, "session/compacted")
    gate.set()
    assert job.join().status == "completed"  # the owner folded the summary in
    log = read_log(store, sid)
    (compacted,) = only(log, "session/compacted")
    assert compacted.data["upto_seq"] == heavy_end
    assert summarizer.rendered[-1].splitlines() == ["[user] heavy question",
                                                    "[assistant] heavy answer"]
    starts, ends = only(log, "turn/start"), only(log, "turn/end")
    assert starts[-1].seq < compacted.seq < ends[-1].seq
    here.catch_up_views(sid)
    assert [m.text for m in here.views.messages(sid)] == [
        "a summary", "next question", "next answer"]


def test_r19_triggers_queued_on_a_busy_session_pay_for_one_summary_at_a_time(
        other_store: EventStore, make_runtime: MakeRuntime, store: EventStore) -> None:
    """Three heavy turns end while the first trigger's summarizer works: the two later
    triggers wait for it, and one summary then takes what it left — two summaries paid, each
    recorded (three were paid before, with the same history summarized twice)."""
    release = threading.Event()

    class Slow(Recording):
        def summarize(self, messages: Sequence[Message]) -> str | None:
            release.wait(30)
            return super().summarize(messages)

    summarizer = Slow()
    here = make_runtime(summarizer=summarizer, config=RuntimeConfig(compaction_budget=100))
    there = make_runtime([final(f"answer {n}", usage=Usage(500, 5)) for n in range(3)],
                         on_store=other_store, start=False)
    sid = there.create_session()
    for n in range(3):
        assert there.run_turn(sid, f"question {n}").status == "completed"
    here.catch_up_views(sid)
    time.sleep(0.5)  # the later triggers reach the compactor while the first one waits
    release.set()
    wait_until(lambda: len(only(read_log(store, sid), "session/compacted")) == 2,
               what="two compactions")
    drain_upkeep(here)
    log = read_log(store, sid)
    assert len(summarizer.rendered) == 2
    assert len(only(log, "session/compacted")) == 2
    assert only(log, "session/compacted")[-1].data["upto_seq"] >= only(log, "turn/end")[-1].seq


def test_r19_two_serving_processes_compact_a_heavy_turn_once(
        other_store: EventStore, make_runtime: MakeRuntime, store: EventStore) -> None:
    config = RuntimeConfig(compaction_budget=100)
    here = make_runtime([final("heavy", usage=Usage(500, 5))], summarizer=Recording("here"),
                        config=config)
    there = make_runtime(summarizer=Recording("there"), config=config, on_store=other_store)
    sid = here.create_session()
    here.run_turn(sid, "q")
    wait_for_event(store, sid, "session/compacted")
    drain_upkeep(here)
    drain_upkeep(there)
    assert len(only(read_log(store, sid), "session/compacted")) == 1


# --- R19: the default summarizer is the role summarizer on the session's compactor role ------


def test_r19_by_default_compaction_asks_the_compactor_role_of_the_runtime_config(
        make_runtime: MakeRuntime, store: EventStore) -> None:
    cheap = ScriptedProvider([Reply(text="  they asked, we answered  ")], name="cheap")
    rt = make_runtime([final("answer")],
                      config=RuntimeConfig(roles=roles(compactor="cheap:mini")))
    rt.resolver.add(cheap)  # type: ignore[attr-defined]
    sid = rt.create_session()
    rt.run_turn(sid, "question")

    upto = rt.compact(sid)

    (compacted,) = only(read_log(store, sid), "session/compacted")
    assert upto == compacted.seq - 1
    assert compacted.data["summary"] == "Summary of earlier conversation:\nthey asked, we answered"
    (request,) = cheap.requests
    assert request.model == "mini" and request.messages[0].role == "system"
    assert request.messages[-1] == Message("user", "[user] question\n[assistant] answer")


def test_r19_the_default_summarizer_follows_the_sessions_role_and_a_model_set_from_elsewhere(
        other_store: EventStore, make_runtime: MakeRuntime, store: EventStore) -> None:
    cheap = ScriptedProvider(default=Reply(text="summary"), name="cheap")
    rt = make_runtime([final("one"), final("two")])
    rt.resolver.add(cheap)  # type: ignore[attr-defined]
    sid = rt.create_session(roles={"compactor": "cheap:first"})
    rt.run_turn(sid, "q1")
    rt.compact(sid)
    there = make_runtime(on_store=other_store, start=False)
    there.set_model(sid, "compactor", "cheap:second", by=OPERATOR)  # another process repoints it
    rt.run_turn(sid, "q2")
    rt.compact(sid)
    assert [r.model for r in cheap.requests] == ["first", "second"]
    assert len(only(read_log(store, sid), "session/compacted")) == 2


def test_r19_without_a_compactor_role_the_default_raises_by_hand_and_never_fails_the_turn(
        make_runtime: MakeRuntime, store: EventStore) -> None:
    provider = ScriptedProvider([final("heavy", usage=Usage(500, 5)), final("next")])
    rt = make_runtime(provider, config=RuntimeConfig(compaction_budget=100))
    sid = rt.create_session()
    assert rt.run_turn(sid, "q1").status == "completed"
    drain_upkeep(rt)  # the budget trigger ran, failed, and was isolated
    assert not only(read_log(store, sid), "session/compacted")
    with pytest.raises(ConfigurationError, match="'compactor' is not configured"):
        rt.compact(sid)
    assert not only(read_log(store, sid), "session/compacted")
    assert rt.run_turn(sid, "q2").status == "completed"
    seen = [(m.role, m.text) for m in provider.requests[-1].messages if m.role != "system"]
    assert seen == [("user", "q1"), ("assistant", "heavy"), ("user", "q2")]


def test_r17_a_fixed_summarizer_chosen_explicitly_keeps_the_latest_turn_for_the_model(
        make_runtime: MakeRuntime, store: EventStore) -> None:
    provider = ScriptedProvider([final("noted: " + "x" * 300), final("the deploy id is d-4711"),
                                 final("ok")])
    rt = make_runtime(provider, summarizer=FixedSummarizer())
    sid = rt.create_session()
    rt.run_turn(sid, "here is a long brief: " + "y" * 300)
    rt.run_turn(sid, "which deploy id?")
    rt.compact(sid)
    rt.run_turn(sid, "thanks")
    summary, question = provider.requests[-1].messages[-2:]
    assert question == Message("user", "thanks")
    assert summary.role == "user" and len(summary.text) <= 400 + 100
    assert summary.text.endswith("[user] which deploy id?\n[assistant] the deploy id is d-4711")


# --- R20: the titler role is used when configured ---------------------------------------------


def test_r20_the_titler_role_of_the_runtime_config_titles_the_session(
        make_runtime: MakeRuntime, store: EventStore) -> None:
    tiny = ScriptedProvider([Reply(text='Title: "EU rollout, phase two."')], name="tiny")
    rt = make_runtime([final()], config=RuntimeConfig(roles=roles(titler="tiny:t1")))
    rt.resolver.add(tiny)  # type: ignore[attr-defined]
    sid = rt.create_session()
    rt.run_turn(sid, "Please roll out phase two of the EU migration tonight")
    wait_for_event(store, sid, "session/titled")
    assert rt.title(sid) == "EU rollout, phase two"
    (request,) = tiny.requests
    assert request.model == "t1"
    assert "[user] Please roll out phase two" in request.messages[-1].text


@pytest.mark.parametrize("how", ["create_session", "model/set"])
def test_r20_a_titler_role_configured_for_the_session_titles_it(
        make_runtime: MakeRuntime, store: EventStore, how: str) -> None:
    tiny = ScriptedProvider([Reply(text="Billing database migration")], name="tiny")
    rt = make_runtime([final()])
    rt.resolver.add(tiny)  # type: ignore[attr-defined]
    if how == "create_session":
        sid = rt.create_session(roles={"titler": "tiny:t2"})
    else:
        sid = rt.create_session()
        rt.set_model(sid, "titler", "tiny:t2", by=OPERATOR)
    rt.run_turn(sid, "Please migrate the billing database to the new cluster tonight")
    wait_for_event(store, sid, "session/titled")
    assert rt.title(sid) == "Billing database migration"
    assert [r.model for r in tiny.requests] == ["t2"]


def test_r20_a_configured_titler_role_that_fails_falls_back_to_the_first_message(
        make_runtime: MakeRuntime, store: EventStore) -> None:
    rt = make_runtime([final()], config=RuntimeConfig(roles=roles(titler="nowhere:t1")))
    sid = rt.create_session()
    text = "Please migrate the billing database to the new cluster tonight"
    rt.run_turn(sid, text)
    (titled,) = only(wait_for_event(store, sid, "session/titled"), "session/titled")
    assert titled.data["title"] == text[:40]
