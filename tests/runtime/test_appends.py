"""Appends and fan-out (R5–R7): one critical section per session in a process, conflict fold-in
or lost ownership across processes, queued fan-out, event ids fixed before the first attempt."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest

from terret import Actor, FixedSummarizer, Reply, RuntimeConfig, ScriptedProvider, Usage, call
from terret.domain.codec import RecordedEvent
from terret.domain.errors import LostOwnership, MaxStepsExceeded
from terret.domain.store import (
    AppendResult,
    EventStore,
    ExpectedVersion,
    NewRecord,
)
from tests.runtime.conftest import MakeRuntime, OpenedStore
from tests.runtime.kit import (
    Kit,
    approve_all,
    calls,
    final,
    first_index,
    names,
    only,
    other_process,
    read_log,
    turn_in_background,
    wait_parked,
    wait_until,
)
from tests.support.stores import DelegatingStore


def test_r5_concurrent_writers_in_one_process_never_collide(make_runtime: MakeRuntime,
                                                            store) -> None:
    provider = ScriptedProvider([calls(("noop", {})) for _ in range(5)] + [final()])
    rt = make_runtime(provider)
    sid = rt.create_session()
    job = turn_in_background(rt, sid, "go")
    start = threading.Barrier(8)

    def writer(n: int) -> None:
        start.wait()
        for i in range(5):
            rt.inject(sid, f"note {n}.{i}")
        rt.set_policy(sid, ["*"], by=Actor(actor="operator"))

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert job.join().status == "completed"
    log = read_log(store, sid)
    assert [e.seq for e in log] == list(range(1, len(log) + 1))
    queued = sorted(e.data["text"] for e in only(log, "inbox/queued"))
    assert queued == sorted(f"note {n}.{i}" for n in range(8) for i in range(5))
    assert len({e.event_id for e in log}) == len(log)


@pytest.mark.parametrize("action", [("inject", "from the CLI"), ("policy", "noop", "status")])
def test_r5_a_commutative_append_from_another_process_is_folded_in(
        make_runtime: MakeRuntime, opened: OpenedStore, gates, action: tuple[str, ...]) -> None:
    gate = gates()
    provider = ScriptedProvider([calls(("noop", {}), gate=gate), final()])
    rt = make_runtime(provider)
    sid = rt.create_session()
    job = turn_in_background(rt, sid, "go")
    wait_until(lambda: provider.requests, what="the model request")
    other_process(opened.uri, action[0], str(sid), *action[1:])
    gate.set()  # the turn's next append meets the other process's event
    assert job.join().status == "completed"
    log = read_log(opened.store, sid)
    foreign = "inbox/queued" if action[0] == "inject" else "policy/updated"
    assert (first_index(log, "step/start") < first_index(log, foreign)
            < first_index(log, "assistant/message"))
    assert len(only(log, "turn/end")) == 1
    if action[0] == "inject":  # and it rides the next step
        assert [m.text for m in provider.requests[1].messages if m.role == "user"] == [
            "go", "from the CLI"]


def test_r5_a_non_commutative_append_from_another_process_stops_the_turn_without_writing(
        make_runtime: MakeRuntime, opened: OpenedStore, gates) -> None:
    gate = gates()
    provider = ScriptedProvider([final("mine", gate=gate)])
    rt = make_runtime(provider)
    sid = rt.create_session()
    job = turn_in_background(rt, sid, "go")
    wait_until(lambda: provider.requests, what="the model request")
    other_process(opened.uri, "assistant", str(sid), "the other process answered")
    before = read_log(opened.store, sid)
    gate.set()
    with pytest.raises(LostOwnership):
        job.join()
    after = read_log(opened.store, sid)
    assert after == before  # nothing written: no assistant message, no turn/end
    assert after[-1].name == "assistant/message"
    assert after[-1].data["text"] == "the other process answered"
    assert rt.resumable(sid)
    assert rt.agent_for_session(sid) is None  # the agent that lost the session is dropped


def test_r5_a_non_commutative_event_a_read_folded_in_still_stops_the_turn(
        make_runtime: MakeRuntime, opened: OpenedStore, kit: Kit) -> None:
    """Every read catches up (R30), the owner's own included: an application's event that is
    not commutative, appended elsewhere while the turn's tool runs and folded in by a read in
    the owner's process, stops the turn at its next append as a conflict would."""
    import tests.runtime.proc  # noqa: F401 - registers the event here too

    rt = make_runtime([calls(("slow", {})), final("mine")])
    sid = rt.create_session()
    job = turn_in_background(rt, sid, "go")
    assert kit.entered.wait(30), "the tool never ran"
    other_process(opened.uri, "flag", str(sid), "hands off")
    assert rt.pending(sid) == []  # a read here: the session is caught up with the flag
    before = read_log(opened.store, sid)
    assert before[-1].name == "tests.proc/flagged"
    kit.release.set()
    with pytest.raises(LostOwnership, match="tests.proc/flagged"):
        job.join()
    assert read_log(opened.store, sid) == before  # no tool result, no turn/end
    assert rt.resumable(sid)


def test_r5_a_tool_appending_a_non_commutative_event_to_its_own_session_is_told_so(
        make_runtime: MakeRuntime, store: EventStore) -> None:
    """The writer cannot tell a tool of its own turn from another process: the refusal names
    the event, says it is not commutative and that a tool of the turn may have appended it
    (it said only 'another process owns its turn', with no other process about)."""
    from pydantic import BaseModel

    from terret import CallContext, tool
    from terret.domain import encode, session_stream
    from tests.runtime.proc import Flagged

    class NoArgs(BaseModel):
        pass

    @tool(args=NoArgs)
    def flag(args: NoArgs, ctx: CallContext) -> str:
        stream = session_stream(ctx.session_id)
        store.append(stream, [encode(Flagged(text="mine"))], store.stream_version(stream))
        return "flagged"

    rt = make_runtime([calls(("flag", {})), final("done")], tools=[flag])
    sid = rt.create_session()
    with pytest.raises(LostOwnership, match=r"tests.proc/flagged, not commutative.*a tool of "
                                            r"the turn"):
        rt.run_turn(sid, "flag it")
    assert rt.resumable(sid)


def test_r5_an_event_this_process_does_not_know_is_folded_in_and_the_tool_runs_once(
        make_runtime: MakeRuntime, opened: OpenedStore, kit: Kit) -> None:
    """An event of a wire name this process has no class for (an extension only another
    program loads), appended while the turn's tool runs: nothing here reads it, so the turn
    carries on — it stopped with ``LostOwnership`` though no other process owned the turn, its
    tool's result dropped, and the resume ran the tool a second time with no crash."""
    rt = make_runtime([calls(("slow", {})), final("mine")])
    sid = rt.create_session()
    job = turn_in_background(rt, sid, "go")
    assert kit.entered.wait(30), "the tool never ran"
    other_process(opened.uri, "raw", str(sid), "acme.note/unknown", '{"a": 1}')
    kit.release.set()
    result = job.join()
    assert (result.status, result.text) == ("completed", "mine")
    assert kit.ran == [("slow", {})]  # once
    names = [e.name for e in read_log(opened.store, sid)]
    assert names.index("acme.note/unknown") < names.index("tool/result"), names
    assert names[-1] == "turn/end"


def test_an_extension_event_its_class_refuses_does_not_stop_the_session(
        make_runtime: MakeRuntime, opened: OpenedStore) -> None:
    """docs/extending.md: the session aggregate loads past extension events. One that its
    class refuses (another program wrote it without a required field) halts only what reads
    its fields; the session's turns, approvals and usage carry on — every call on the session
    raised ``CorruptRecord``."""
    import tests.runtime.proc  # noqa: F401 - registers ``Flagged`` here too

    rt = make_runtime([final("first"), final("second")])
    sid = rt.create_session()
    rt.run_turn(sid, "one")
    other_process(opened.uri, "raw", str(sid), "tests.proc/flagged", '{"no_text": true}')
    assert rt.pending(sid) == []
    assert rt.usage(sid)["steps"] == 1
    result = rt.run_turn(sid, "two")
    assert (result.status, result.text, result.turn) == ("completed", "second", 2)
    fresh = make_runtime()  # a process that loads the session from the log afresh
    assert fresh.pending(sid) == [] and fresh.usage(sid)["steps"] == 2


@pytest.mark.parametrize("act", ["cancel", "approve"])
def test_r5_a_writer_that_does_not_own_the_turn_acts_on_the_log_not_its_own_stale_copy(
        make_runtime: MakeRuntime, kit: Kit, store, act: str) -> None:
    owner = make_runtime([calls(("deploy", {"env": "prod"}, "c-1")), final()])
    other = make_runtime()
    sid = other.create_session()  # ``other`` keeps its copy of the session: no turn open
    job = turn_in_background(owner, sid, "go")
    wait_parked(owner, sid)
    assert not other.writer._own_copy(sid).turn_open  # its copy has not seen the turn start
    who = Actor(actor="operator", id="other")
    if act == "cancel":  # refused with NoOpenTurn on the stale copy, and never retried
        other.cancel(sid, by=who, reason="from the other writer")
        assert job.join().status == "cancelled"
        assert kit.ran == []
    else:
        other.approve(sid, "c-1", by=who)
        assert job.join().status == "completed"
        assert kit.ran == [("deploy", {"env": "prod"})]
    log = read_log(store, sid)
    assert first_index(log, "approval/requested") < first_index(log, "turn/end")
    assert len(only(log, "turn/end")) == 1


def test_r6_fan_out_is_queued_so_every_listener_sees_the_log_in_order(
        make_runtime: MakeRuntime, store) -> None:
    rt = make_runtime([calls(("noop", {})), final()])
    sid = rt.create_session()
    seen_by_first: list[tuple[int, str]] = []
    seen_by_last: list[tuple[int, str]] = []

    def appender(event: RecordedEvent) -> None:
        seen_by_first.append((event.seq, event.wire_name))
        if event.wire_name == "turn/end" and event.session_id == sid:
            rt.inject(sid, "appended by a listener")  # lands while turn/end is fanning out

    def observer(event: RecordedEvent) -> None:
        if event.session_id == sid:
            seen_by_last.append((event.seq, event.wire_name))

    rt.runner.add_listener(appender)
    rt.runner.add_listener(observer)  # registered after the appender
    rt.run_turn(sid, "go")
    wait_until(lambda: any(n == "inbox/queued" for _, n in seen_by_last),
               what="the listener's own event to fan out")
    wait_until(lambda: any(n == "session/titled" for _, n in seen_by_last),
               what="the titler's event to fan out")
    log = [(e.seq, e.name) for e in read_log(store, sid)]
    # the observer saw turn/end before the event appended while turn/end was being delivered
    assert seen_by_last == [x for x in log if x[0] >= seen_by_last[0][0]][:len(seen_by_last)]
    assert [s for s, _ in seen_by_last] == sorted(s for s, _ in seen_by_last)
    end = seen_by_last.index(next(x for x in seen_by_last if x[1] == "turn/end"))
    queued = seen_by_last.index(next(x for x in seen_by_last if x[1] == "inbox/queued"))
    assert end < queued


class AtLeastOnceTransport(DelegatingStore):
    """Delivers every append twice with the same records and expected version, as a client that
    retries after losing the first reply would (R7)."""

    def __init__(self, inner: EventStore) -> None:
        super().__init__(inner)
        self.appends = 0

    def append(self, stream: str, records: Sequence[NewRecord],
               expected_version: ExpectedVersion) -> AppendResult:
        first = self.inner.append(stream, records, expected_version)
        again = self.inner.append(stream, records, expected_version)  # the retry
        assert again == first
        self.appends += 1
        return again


def test_r7_a_retried_append_never_duplicates_an_event(make_runtime: MakeRuntime, kit: Kit,
                                                       store) -> None:
    transport = AtLeastOnceTransport(store)
    rt = make_runtime([calls(("deploy", {"env": "prod"})), calls(("noop", {})),
                       final(usage=Usage(10, 1))],
                      on_store=transport, config=RuntimeConfig(compaction_budget=5),
                      summarizer=FixedSummarizer())
    sid = rt.create_session()
    rt.inject(sid, "context")
    result = approve_all(rt, sid, turn_in_background(rt, sid, "go"))
    assert result.status == "completed"
    log = wait_until(lambda: (lambda lg: "session/compacted" in names(lg) and lg)(
        read_log(store, sid)), what="compaction")
    assert transport.appends >= 10  # every one of them delivered twice
    assert len({e.event_id for e in log}) == len(log)
    assert names(log).count("turn/start") == 1
    assert names(log).count("approval/requested") == 1
    assert names(log).count("tool/result") == 2
    assert kit.ran == [("deploy", {"env": "prod"}), ("noop", {})]


def test_r7_event_ids_are_unique_across_a_long_session(make_runtime: MakeRuntime,
                                                       store) -> None:
    rt = make_runtime(ScriptedProvider(default=Reply(tool_calls=[call("noop")])),
                      config=RuntimeConfig(max_steps=4))
    sid = rt.create_session()
    for _ in range(3):
        with pytest.raises(MaxStepsExceeded):  # each turn hits the step cap
            rt.run_turn(sid, "loop")
    log = read_log(store, sid)
    assert len(only(log, "step/start")) == 12
    assert len({e.event_id for e in log}) == len(log)
    assert [e.data["status"] for e in only(log, "turn/end")] == ["failed"] * 3


def test_more_sessions_loaded_at_once_than_the_writer_keeps_raise_nothing(
        store: EventStore) -> None:
    """A serving process with more open turns than the writer's cache holds (512) printed a
    KeyError traceback per wake (and failed resumes): a session evicted by one thread between
    another's lookup and its reordering. Sixteen threads load forty sessions through a writer
    that keeps four."""
    from terret.domain.repository import SessionRepository
    from terret.domain.session import Session
    from terret.runtime.writer import SessionWriter

    writer = SessionWriter(SessionRepository(store), cache_size=4)
    sessions = []
    for _ in range(40):
        session = Session.start()
        writer.repository.save(session)
        sessions.append(session.id)
    failures: list[BaseException] = []

    def load_all(offset: int) -> None:
        try:
            for round_ in range(8):
                for i in range(len(sessions)):
                    sid = sessions[(i + offset + round_) % len(sessions)]
                    assert writer.load(sid).id == sid
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    threads = [threading.Thread(target=load_all, args=(n,)) for n in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not failures, failures[:3]


def test_a_long_lived_runtime_keeps_no_lock_or_signal_for_every_session_it_wrote(
        make_runtime: MakeRuntime, monkeypatch: pytest.MonkeyPatch) -> None:
    """A serving process lives for weeks and writes to, or hears of, every session: a lock per
    session written and a signal generation per session heard were kept for good."""
    import gc

    from terret.runtime.approvals import ApprovalSignals

    monkeypatch.setattr(ApprovalSignals, "KEEP", 16)
    rt = make_runtime()
    for _ in range(40):
        rt.run_turn(rt.create_session(), "hi")
    gc.collect()
    assert len(rt.writer._locks) < 10
    assert len(rt.signals._generation) <= 16
