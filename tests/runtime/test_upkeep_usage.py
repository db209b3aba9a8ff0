"""The upkeep's model calls are paid for and recorded (R21, R31): the titler's and the
summarizer's requests leave a ``usage/recorded`` — with the title or summary they produced, in
the same append, or alone when nothing came of them — kept apart from the steps' usage
(``usage``), shown by ``upkeep_usage`` and the CLI, and counted by the session's budget.

Every test runs on SQLite and on the EventStoreDB emulator; the CLI that reads the figures back
runs as a second OS process on the same store.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from terret import Actor, FixedSummarizer, Reply, RuntimeConfig, ScriptedProvider, Usage
from terret.domain.store import EventStore
from terret.runtime.model import ModelReply, ModelRequest, TextSink
from tests.cli.conftest import subprocess_env
from tests.runtime.conftest import MakeRuntime, OpenedStore
from tests.runtime.kit import drain_upkeep, final, only, read_log, wait_for_event, wait_until

OPERATOR = Actor(actor="operator", id="test")
STEP = Usage(100, 10, 0.01)
TITLE = Usage(40, 6, 0.0004)
SUMMARY = Usage(900, 50, 0.02)


def cli(opened: OpenedStore, views: Path, *args: str) -> Any:
    """``terret --json ARGS`` in a second OS process on the store under test."""
    done = subprocess.run(
        [sys.executable, "-m", "terret", "--store", opened.uri, "--views", str(views), "--json",
         *args], capture_output=True, text=True, timeout=60, env=subprocess_env())
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def totals(usage: Usage, calls: int = 1) -> dict[str, Any]:
    return {"prompt_tokens": usage.prompt_tokens * calls,
            "completion_tokens": usage.completion_tokens * calls,
            "cost": round((usage.cost or 0.0) * calls, 10), "steps": calls}


def test_a_titles_request_is_recorded_with_the_title_apart_from_the_steps_and_budgeted(
        opened: OpenedStore, make_runtime: MakeRuntime, store: EventStore,
        tmp_path: Path) -> None:
    tiny = ScriptedProvider([Reply(text="Checkout rollout", usage=TITLE)], name="tiny")
    rt = make_runtime([final("rolled out", usage=STEP)],
                      config=RuntimeConfig(roles={"main": "scripted:default",
                                                  "titler": "tiny:t1"}))
    rt.resolver.add(tiny)  # type: ignore[attr-defined]
    sid = rt.create_session()
    rt.set_budget(sid, 1.0, by=OPERATOR)
    rt.run_turn(sid, "roll out checkout v2")
    log = wait_for_event(store, sid, "usage/recorded")

    (titled,) = only(log, "session/titled")
    (metered,) = only(log, "usage/recorded")
    assert metered.seq == titled.seq + 1  # one append: the title and what it cost
    assert metered.data == {"purpose": "title", "turn": 1, "model": "tiny:t1",
                            "usage": {"prompt_tokens": 40, "completion_tokens": 6,
                                      "cost": 0.0004}}
    assert rt.usage(sid) == totals(STEP)  # R21: the steps, as before
    assert rt.upkeep_usage(sid) == {"title": totals(TITLE)}
    check = rt.budget(sid)
    assert check is not None and check.spent == pytest.approx(0.0104)

    views = tmp_path / "cli-views.db"
    by_purpose = cli(opened, views, "usage", str(sid), "--by", "purpose")
    assert by_purpose == {"steps": totals(STEP), "title": totals(TITLE)}
    shown = cli(opened, views, "sessions", "show", str(sid))
    assert shown["usage"] == totals(STEP)
    assert shown["upkeep_usage"] == {"title": totals(TITLE)}
    assert shown["budget"]["spent"] == pytest.approx(0.0104)
    everyone = cli(opened, views, "usage", "--by", "purpose")
    assert everyone == {"steps": totals(STEP), "title": totals(TITLE)}

    cli(opened, views, "projections", "rebuild")  # replayed from scratch: the same figures
    assert cli(opened, views, "usage", str(sid), "--by", "purpose") == by_purpose


def test_a_summarys_request_is_recorded_with_the_compaction_and_asks_for_no_second_one(
        make_runtime: MakeRuntime, store: EventStore) -> None:
    cheap = ScriptedProvider(default=Reply(text="they asked, we answered", usage=SUMMARY),
                             name="cheap")
    rt = make_runtime([final("heavy", usage=Usage(500, 5, 0.01))],
                      config=RuntimeConfig(compaction_budget=100,
                                           roles={"main": "scripted:default",
                                                  "compactor": "cheap:mini"}))
    rt.resolver.add(cheap)  # type: ignore[attr-defined]
    sid = rt.create_session()
    rt.run_turn(sid, "a heavy question")
    log = wait_for_event(store, sid, "usage/recorded")
    drain_upkeep(rt)

    (compacted,) = only(read_log(store, sid), "session/compacted")
    (metered,) = only(log, "usage/recorded")
    assert metered.seq == compacted.seq + 1
    assert metered.data["purpose"] == "compaction" and metered.data["model"] == "cheap:mini"
    assert len(cheap.requests) == 1  # the summary's own large prompt asks for no compaction
    assert rt.usage(sid) == totals(Usage(500, 5, 0.01))
    assert rt.upkeep_usage(sid) == {"compaction": totals(SUMMARY)}


def test_a_declined_summary_is_paid_for_all_the_same(
        make_runtime: MakeRuntime, store: EventStore) -> None:
    cheap = ScriptedProvider([Reply(text="   ", usage=SUMMARY)], name="cheap")
    rt = make_runtime([final("answer", usage=STEP)])
    rt.resolver.add(cheap)  # type: ignore[attr-defined]
    sid = rt.create_session(roles={"compactor": "cheap:mini"})
    rt.run_turn(sid, "question")

    assert rt.compact(sid) is None  # an empty summary declines

    log = read_log(store, sid)
    assert not only(log, "session/compacted")
    (metered,) = only(log, "usage/recorded")
    assert metered.data["purpose"] == "compaction"
    assert rt.upkeep_usage(sid) == {"compaction": totals(SUMMARY)}


def test_a_summary_too_large_to_store_is_paid_for_all_the_same(
        make_runtime: MakeRuntime, store: EventStore, opened: OpenedStore,
        tmp_path: Path) -> None:
    """A summary over what the log takes was refused (PayloadTooLarge, nothing written) and
    its cost dropped, with a warning that the store failed: refused is certain, so the cost is
    recorded alone, as a declined summary's is — and another process's CLI counts it."""
    from terret.domain.errors import PayloadTooLarge

    cheap = ScriptedProvider([Reply(text="x" * (2 << 20), usage=SUMMARY)], name="cheap")
    rt = make_runtime([final("answer", usage=STEP)])
    rt.resolver.add(cheap)  # type: ignore[attr-defined]
    sid = rt.create_session(roles={"compactor": "cheap:mini"})
    rt.run_turn(sid, "question")

    with pytest.raises(PayloadTooLarge):
        rt.compact(sid)
    assert not only(read_log(store, sid), "session/compacted")
    assert rt.upkeep_usage(sid) == {"compaction": totals(SUMMARY)}
    by_purpose = cli(opened, tmp_path / "views.db", "usage", str(sid), "--by", "purpose")
    assert by_purpose["compaction"] == totals(SUMMARY)


class Answering:
    """A summarizer of the application's own: it answers ``reply`` once ``go`` is set."""

    def __init__(self, reply: str | None, go: threading.Event | None = None) -> None:
        self.reply, self.go = reply, go

    def summarize(self, messages: Any) -> str | None:
        if self.go is not None:
            self.go.wait()
        return self.reply


def test_an_empty_summary_from_a_summarizer_of_your_own_is_a_decline(
        make_runtime: MakeRuntime, store: EventStore) -> None:
    """``""`` was recorded as the summary, and the model was shown an empty message in place
    of the whole history (the role summarizer declined such an answer; a summarizer of your
    own was trusted)."""
    rt = make_runtime([final("the deploy id is 42"), final("it is 42")],
                      summarizer=Answering(""))
    sid = rt.create_session()
    rt.run_turn(sid, "deploy")
    assert rt.compact(sid) is None
    assert not only(read_log(store, sid), "session/compacted")
    texts = [m.text for m in rt.views.messages(sid)]
    assert texts == ["deploy", "the deploy id is 42"]
    # Nor does the session record one, whoever writes it.
    from terret.domain.errors import InvalidPayload

    with pytest.raises(InvalidPayload, match="summary"):
        rt.writer.execute(sid, lambda s: s.compact(" \n", mark=s.version))
    # (Not the log's head: the runtime's beats and the title land meanwhile.)
    assert not only(read_log(store, sid), "session/compacted")


def test_a_summarizer_that_never_answers_is_given_up_and_holds_no_upkeep_thread(
        make_runtime: MakeRuntime, store: EventStore) -> None:
    """Four hung summaries held the upkeep's four threads for good: no session of the process
    was titled or compacted again. Each is given up after ``upkeep_timeout`` now."""
    from terret.runtime.runtime import UPKEEP_THREADS

    never = threading.Event()
    rt = make_runtime(ScriptedProvider(default=Reply(text="done", usage=Usage(500, 5, 0.01))),
                      summarizer=Answering("unused", go=never),
                      config=RuntimeConfig(compaction_budget=100, upkeep_timeout=0.5))
    try:
        sessions = [rt.create_session() for _ in range(UPKEEP_THREADS + 2)]
        for sid in sessions:
            rt.run_turn(sid, f"question {sid}")  # each asks for a summary that never comes
        for sid in sessions:
            wait_until(lambda sid=sid: rt.title(sid) is not None, what="a title", timeout=30)
            assert rt.title(sid) == f"question {sid}"[:40]
            assert not only(read_log(store, sid), "session/compacted")
    finally:
        never.set()


class TitledMeanwhile:
    """A titler model during whose request an operator in another process titles the
    session."""

    name = "tiny"

    def __init__(self) -> None:
        self.elsewhere: Any = None
        self.session: UUID | None = None
        self.asked = threading.Event()

    def complete(self, request: ModelRequest, *, on_text: TextSink | None = None,
                 cancel: threading.Event | None = None) -> ModelReply:
        self.elsewhere.set_title(self.session, "Named by the operator", by=OPERATOR)
        self.asked.set()
        return ModelReply(text="The model's title", usage=TITLE)


def test_a_title_request_overtaken_by_an_operators_title_is_recorded_alone(
        make_runtime: MakeRuntime, store: EventStore, other_store: EventStore) -> None:
    tiny = TitledMeanwhile()
    rt = make_runtime([final("done", usage=STEP)])
    rt.resolver.add(tiny)  # type: ignore[attr-defined]
    tiny.elsewhere = make_runtime(on_store=other_store, start=False)
    sid = tiny.session = rt.create_session(roles={"titler": "tiny:t1"})
    rt.run_turn(sid, "please name this")
    log = wait_for_event(store, sid, "usage/recorded")
    drain_upkeep(rt)

    assert tiny.asked.is_set()
    assert [e.data["title"] for e in only(read_log(store, sid), "session/titled")] == [
        "Named by the operator"]
    (metered,) = only(log, "usage/recorded")
    assert metered.data["purpose"] == "title"
    assert rt.title(sid) == "Named by the operator"
    assert rt.upkeep_usage(sid) == {"title": totals(TITLE)}


def test_a_title_that_cannot_be_stored_falls_back_to_the_first_message_and_is_paid_for(
        make_runtime: MakeRuntime, store: EventStore) -> None:
    """A titler reply with a lone surrogate (what a JSON ``\\ud800`` escape decodes to) failed
    the title's append: no title, no cost, nothing said — and every later turn asked again."""
    tiny = ScriptedProvider(default=Reply(text="Deploy \ud800 plan", usage=TITLE), name="tiny")
    rt = make_runtime([final("one", usage=STEP), final("two", usage=STEP)])
    rt.resolver.add(tiny)  # type: ignore[attr-defined]
    sid = rt.create_session(roles={"titler": "tiny:t1"})
    rt.run_turn(sid, "please deploy the plan")
    wait_for_event(store, sid, "session/titled")
    rt.run_turn(sid, "and again")
    drain_upkeep(rt)

    assert rt.title(sid) == "please deploy the plan"
    assert len(tiny.requests) == 1  # titled: not asked again
    assert rt.upkeep_usage(sid) == {"title": totals(TITLE)}


def test_a_turns_title_and_compaction_are_asked_for_once_however_many_processes_serve(
        make_runtime: MakeRuntime, store: EventStore, other_store: EventStore) -> None:
    """Every started runtime whose app defined the agent asked the titler and the summarizer
    on every turn/end it saw (the aggregate kept the title single, but each request was paid
    for). The owner that ran the turn, live and doing upkeep, does it; the others leave it."""
    config = RuntimeConfig(compaction_budget=100,
                           roles={"main": "scripted:default", "titler": "tiny:t1",
                                  "compactor": "tiny:c1"})
    mine = ScriptedProvider(default=Reply(text="Heavy work", usage=TITLE), name="tiny")
    theirs = ScriptedProvider(default=Reply(text="Heavy work", usage=TITLE), name="tiny")
    here = make_runtime([final("heavy", usage=Usage(500, 5, 0.01))], config=config)
    here.resolver.add(mine)  # type: ignore[attr-defined]
    there = make_runtime(config=config, on_store=other_store)
    there.resolver.add(theirs)  # type: ignore[attr-defined]
    sid = here.create_session()
    here.run_turn(sid, "a heavy question")
    wait_for_event(store, sid, "usage/recorded", count=2)
    drain_upkeep(here)
    drain_upkeep(there)

    assert (len(mine.requests), len(theirs.requests)) == (2, 0)  # the title and the summary
    log = read_log(store, sid)
    assert sorted(e.data["purpose"] for e in only(log, "usage/recorded")) == [
        "compaction", "title"]
    assert len(only(log, "session/titled")) == len(only(log, "session/compacted")) == 1


def test_compaction_is_not_left_to_an_owner_that_does_none(
        make_runtime: MakeRuntime, store: EventStore, other_store: EventStore) -> None:
    """The owner that ran the turn has no compaction budget: a serving process that has one
    compacts the heavy turn (it left it to the owner, which never compacts)."""
    cheap = ScriptedProvider(default=Reply(text="summary", usage=SUMMARY), name="cheap")
    here = make_runtime([final("heavy", usage=Usage(500, 5, 0.01))])  # no compaction budget
    there = make_runtime(config=RuntimeConfig(compaction_budget=100, roles={
        "main": "scripted:default", "compactor": "cheap:c1"}), on_store=other_store)
    there.resolver.add(cheap)  # type: ignore[attr-defined]
    sid = here.create_session()
    here.run_turn(sid, "a heavy question")
    wait_for_event(store, sid, "session/compacted")
    assert len(cheap.requests) == 1


def test_a_turn_ended_by_a_runtime_without_upkeep_is_titled_and_compacted_once_by_the_others(
        make_runtime: MakeRuntime, store: EventStore, other_store: EventStore) -> None:
    """The turn's runtime was never started (a web app's request worker: no upkeep): every
    serving process that defined the agent asked the titler and the summarizer, and each
    request was paid for (the aggregate kept one title and one summary). The first of them in
    rendezvous order does it; the next looks again two lease TTLs later and finds it done."""
    config = RuntimeConfig(compaction_budget=100, lease_ttl=2.0,
                           roles={"main": "scripted:default", "titler": "tiny:t1",
                                  "compactor": "tiny:c1"})
    serving = []
    for on_store in (store, other_store):
        provider = ScriptedProvider(default=Reply(text="Heavy work", usage=TITLE), name="tiny")
        rt = make_runtime(config=config, on_store=on_store)
        rt.resolver.add(provider)  # type: ignore[attr-defined]
        rt.serve_start()
        serving.append((rt, provider))
    web = make_runtime([final("heavy", usage=Usage(500, 5, 0.01))], config=config, start=False)
    sid = web.create_session()
    assert web.run_turn(sid, "a heavy question").status == "completed"
    wait_for_event(store, sid, "usage/recorded", count=2)
    threading.Event().wait(2 * 2.0 + 1.0)  # past the second one's look again
    for rt, _ in serving:
        drain_upkeep(rt)
    asked = [len(provider.requests) for _, provider in serving]
    assert sorted(asked) == [0, 2], asked  # one process asked for the title and the summary
    log = read_log(store, sid)
    assert sorted(e.data["purpose"] for e in only(log, "usage/recorded")) == [
        "compaction", "title"]
    assert len(only(log, "session/titled")) == len(only(log, "session/compacted")) == 1


def test_turns_that_end_while_the_title_is_asked_for_do_not_ask_again(
        make_runtime: MakeRuntime, store: EventStore, gates: Any) -> None:
    """Turns in quick succession: each turn/end asked the titler anew until the first title
    landed — three requests paid for one title (three failures said when it failed)."""
    slow = gates()
    config = RuntimeConfig(roles={"main": "scripted:default", "titler": "tiny:t1"})
    titler = ScriptedProvider([Reply(text="Quick work", usage=TITLE, gate=slow)],
                              default=Reply(text="Asked again", usage=TITLE), name="tiny")
    rt = make_runtime([final("one"), final("two"), final("three")], config=config)
    rt.resolver.add(titler)  # type: ignore[attr-defined]
    sid = rt.create_session()
    for text in ("one", "two", "three"):
        assert rt.run_turn(sid, text).status == "completed"
    wait_until(lambda: titler.requests, what="the titler to be asked")
    rt.catch_up_views()
    threading.Event().wait(0.5)  # the later turn ends' upkeep ran meanwhile
    slow.set()
    (titled,) = only(wait_for_event(store, sid, "session/titled"), "session/titled")
    drain_upkeep(rt)
    assert titled.data["title"] == "Quick work"
    assert len(titler.requests) == 1
    assert len(only(read_log(store, sid), "usage/recorded")) == 1


def test_upkeep_left_to_an_owner_that_is_gone_before_it_did_it_is_done_by_another(
        make_runtime: MakeRuntime, store: EventStore, other_store: EventStore,
        gates: Any) -> None:
    """Left to the live owner that ran the turn, the title was never written when the owner
    died before its titler answered: now the others look again a lease's TTL later."""
    stuck = gates()
    config = RuntimeConfig(lease_ttl=1.0, roles={"main": "scripted:default",
                                                 "titler": "tiny:t1"})
    mine = ScriptedProvider([Reply(text="Owner's title", usage=TITLE, gate=stuck)], name="tiny")
    theirs = ScriptedProvider(default=Reply(text="Their title", usage=TITLE), name="tiny")
    here = make_runtime([final("done", usage=STEP)], config=config)
    here.resolver.add(mine)  # type: ignore[attr-defined]
    there = make_runtime(config=config, on_store=other_store)
    there.resolver.add(theirs)  # type: ignore[attr-defined]
    sid = here.create_session()
    here.run_turn(sid, "name this")
    wait_until_asked = 0
    while not mine.requests and wait_until_asked < 500:  # the owner's titler is under way
        threading.Event().wait(0.01)
        wait_until_asked += 1
    here.lease.stop(leave=True)  # the owner is gone (its beats with it), its title not written
    (titled,) = only(wait_for_event(store, sid, "session/titled"), "session/titled")
    assert titled.data["title"] == "Their title"
    stuck.set()


def test_a_titler_after_a_compaction_reads_the_start_of_the_conversation_not_the_summary(
        make_runtime: MakeRuntime, store: EventStore) -> None:
    """Title and compaction run side by side after the first turn: when the compaction landed
    first the titler was given the summary, and titled the session after it."""
    seen: list[str] = []

    class Noting:
        def title(self, messages: Any) -> str:
            seen.append(messages[0].text)
            return "Noted"

    # Not started: nothing runs after the turn but what the test runs, in the order it runs.
    rt = make_runtime([final("deployed")], titler=Noting(), summarizer=FixedSummarizer(),
                      start=False)
    sid = rt.create_session()
    rt.run_turn(sid, "please deploy service number seven")
    rt.compact(sid)  # the compaction lands first
    rt.catch_up_views(sid)  # as a started runtime's views hold it by then
    rt.titler.title_now(sid)
    assert rt.title(sid) == "Noted"
    assert seen == ["please deploy service number seven"]
