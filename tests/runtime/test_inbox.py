"""Wake-on-stimulus with the durable inbox (R24)."""

from __future__ import annotations

import threading

import pytest

from terret import Actor, Reply, ScriptedProvider
from terret.runtime import ModelRequest
from tests.runtime.conftest import MakeRuntime, OpenedStore
from tests.runtime.kit import (
    Background,
    Kit,
    agent_of,
    calls,
    drain_upkeep,
    final,
    names,
    only,
    other_process,
    read_log,
    turn_in_background,
    wait_for_event,
    wait_parked,
    wait_until,
)


def user_texts(provider: ScriptedProvider, request: int) -> list[str]:
    return [m.text for m in provider.requests[request].messages if m.role == "user"]


def consumed_once(log: list, inbox_ids: list[str]) -> bool:
    taken = [e.data.get("inbox_id") for e in log
             if e.name in ("user/message", "context/injected") and e.data.get("inbox_id")]
    return sorted(taken) == sorted(inbox_ids)


def test_r24_inject_without_wake_rides_into_the_next_turn_before_its_input(
        make_runtime: MakeRuntime, store) -> None:
    """Queued before the turn's input, the note comes before it, as it was queued: the model
    answers the last message, which is the input (it was given the note last, and answered
    that)."""
    provider = ScriptedProvider([final()])
    rt = make_runtime(provider)
    sid = rt.create_session()
    rt.spawn_agent(sid)
    inbox_id = rt.inject(sid, "remember: staging only")
    drain_upkeep(rt)
    assert "turn/start" not in names(read_log(store, sid))  # no wake, no turn
    rt.run_turn(sid, "deploy")
    assert user_texts(provider, 0) == ["remember: staging only", "deploy"]
    log = read_log(store, sid)
    assert names(log)[names(log).index("turn/start"):][:3] == [
        "turn/start", "context/injected", "user/message"]
    (injected,) = only(log, "context/injected")
    assert injected.data == {"text": "remember: staging only", "inbox_id": inbox_id}
    assert consumed_once(log, [inbox_id])


def test_r24_inject_during_a_turn_rides_that_turns_next_step(make_runtime: MakeRuntime,
                                                             store, gates) -> None:
    gate = gates()
    provider = ScriptedProvider([calls(("noop", {}), gate=gate), final()])
    rt = make_runtime(provider)
    sid = rt.create_session()
    job = turn_in_background(rt, sid, "go")
    wait_until(lambda: provider.requests, what="the model request")
    rt.inject(sid, "also check eu")
    gate.set()
    job.join()
    assert user_texts(provider, 0) == ["go"]
    assert user_texts(provider, 1) == ["go", "also check eu"]
    assert len(only(read_log(store, sid), "turn/start")) == 1


def test_r24_a_waking_inject_on_an_idle_agent_starts_a_turn_with_it(make_runtime: MakeRuntime,
                                                                    store) -> None:
    provider = ScriptedProvider([final("on it")])
    rt = make_runtime(provider)
    sid = rt.create_session()
    rt.spawn_agent(sid)
    inbox_id = rt.inject(sid, "the build is red", wake=True)
    log = wait_for_event(store, sid, "turn/end")
    (start,) = only(log, "turn/start")
    assert start.data["trigger"] == "wake"
    (message,) = only(log, "user/message")
    assert message.data == {"text": "the build is red", "inbox_id": inbox_id}
    assert user_texts(provider, 0) == ["the build is red"]
    assert only(log, "turn/end")[0].data["status"] == "completed"


def test_r24_a_waking_inject_during_the_last_step_starts_the_next_turn(
        make_runtime: MakeRuntime, opened: OpenedStore, gates) -> None:
    """A waking entry from another process lands while the turn's last (final) step is at the
    model, after that step took the inbox: the wake finds the turn running, and once it ends
    the next turn starts with the text — in a process that has the session's agent but does
    not serve (no scan to find it later). It stayed queued, waking nobody."""
    gate = gates()
    provider = ScriptedProvider([final("first", gate=gate), final("second")])
    rt = make_runtime(provider)
    sid = rt.create_session()
    job = turn_in_background(rt, sid, "go")
    wait_until(lambda: provider.requests, what="the model request")
    out = other_process(opened.uri, "inject", str(sid), "wake me", "wake")
    wait_until(lambda: "inbox/queued" in names(read_log(opened.store, sid)),
               what="the inbox entry")
    gate.set()
    assert job.join().text == "first"
    log = wait_until(lambda: [e for e in read_log(opened.store, sid) if e.name == "turn/end"]
                     [1:], what="a second turn")
    starts = only(read_log(opened.store, sid), "turn/start")
    assert [s.data["trigger"] for s in starts] == ["user", "wake"], starts
    messages = only(read_log(opened.store, sid), "user/message")
    assert messages[1].data == {"text": "wake me", "inbox_id": out["inbox_id"]}
    assert log[0].data["status"] == "completed"
    assert user_texts(provider, 1) == ["go", "wake me"]


def test_r24_two_racing_wakes_make_one_turn_and_the_losers_text_reaches_the_model(
        make_runtime: MakeRuntime, store, gates) -> None:
    gate = gates()
    provider = ScriptedProvider([final("both seen", gate=gate)])
    rt = make_runtime(provider)
    sid = rt.create_session()  # no agent and not serving: nothing wakes on its own
    first = rt.inject(sid, "first ping", wake=True)
    second = rt.inject(sid, "second ping", wake=True)
    barrier = threading.Barrier(2)

    def wake() -> object:
        barrier.wait()
        return rt.wake(sid)

    racers = [Background(wake), Background(wake)]
    wait_until(lambda: any(r.done for r in racers), what="the loser to give up")
    gate.set()
    results = [r.join() for r in racers]
    assert sorted(r is None for r in results) == [False, True]  # one winner, one loser
    log = read_log(store, sid)
    assert len(only(log, "turn/start")) == 1
    assert sorted(user_texts(provider, 0)) == ["first ping", "second ping"]
    assert consumed_once(log, [first, second])


def test_r24_a_losing_wake_is_requeued_onto_the_winners_next_step(make_runtime: MakeRuntime,
                                                                  store, gates) -> None:
    gate = gates()
    provider = ScriptedProvider([calls(("noop", {}), gate=gate), final()])
    rt = make_runtime(provider)
    sid = rt.create_session()
    rt.spawn_agent(sid)
    rt.inject(sid, "first", wake=True)
    wait_until(lambda: provider.requests, what="the winner's first step")
    late = rt.inject(sid, "second", wake=True)  # its wake loses: the agent is mid-turn
    gate.set()
    log = wait_for_event(store, sid, "turn/end")
    drain_upkeep(rt)
    log = read_log(store, sid)
    assert len(only(log, "turn/start")) == 1
    assert user_texts(provider, 1) == ["first", "second"]
    assert consumed_once(log, [e.data["inbox_id"] for e in only(log, "inbox/queued")])
    assert only(log, "context/injected")[0].data["inbox_id"] == late


def test_r24_wakes_of_many_sessions_run_at_once(make_runtime: MakeRuntime, store) -> None:
    rt = make_runtime(ScriptedProvider(default=calls(("deploy", {"env": "prod"}))))
    sessions = [rt.create_session() for _ in range(5)]
    for sid in sessions:
        rt.spawn_agent(sid)
        rt.inject(sid, "deploy", wake=True)
    for sid in sessions:  # every woken turn parks on its own thread, none waits for another
        wait_parked(rt, sid)
    assert all(agent_of(rt, s).status == "waiting_approval" for s in sessions)
    for sid in sessions:
        rt.cancel(sid, by=Actor(actor="operator"))
    for sid in sessions:
        wait_for_event(store, sid, "turn/end")


def test_r24_a_waking_entry_is_the_input_after_what_was_queued_before_it(
        make_runtime: MakeRuntime, opened: OpenedStore) -> None:
    """Another process queues a note, then a waking question, then a later note: the woken
    turn's model sees the first note, then the question — its input, last — and the later
    note rides the next step."""
    from tests.runtime.kit import other_process

    provider = ScriptedProvider(default=final("answered"))
    server = make_runtime(provider, start=False)
    sid = server.create_session()
    other_process(opened.uri, "inject", str(sid), "note: staging only")
    other_process(opened.uri, "inject", str(sid), "deploy now?", "wake")
    server.serve_start()
    log = wait_for_event(opened.store, sid, "turn/end")
    assert user_texts(provider, 0) == ["note: staging only", "deploy now?"]
    assert [e.data["text"] for e in only(log, "user/message")] == ["deploy now?"]


def test_r24_the_inbox_is_durable_across_a_crash(make_runtime: MakeRuntime, store) -> None:
    crashed = make_runtime(start=False)  # an operator's CLI, or a process about to die
    sid = crashed.create_session()
    inbox_id = crashed.inject(sid, "do not forget me")
    crashed.close()
    provider = ScriptedProvider([final()])
    fresh = make_runtime(provider)
    fresh.run_turn(sid, "hello again")
    assert user_texts(provider, 0) == ["do not forget me", "hello again"]
    assert consumed_once(read_log(store, sid), [inbox_id])


def test_r24_a_waking_inject_while_no_server_runs_is_picked_up_when_serving_starts(
        make_runtime: MakeRuntime, store) -> None:
    cli = make_runtime(start=False)
    sid = cli.create_session()
    cli.inject(sid, "wake up", wake=True)
    provider = ScriptedProvider(default=final("awake"))  # a shared server may hold others
    server = make_runtime(provider, start=False)
    server.serve_start()
    log = wait_for_event(store, sid, "turn/end")
    assert only(log, "user/message")[0].data["text"] == "wake up"
    assert only(log, "turn/end")[0].data["status"] == "completed"


def test_r24_text_injected_from_another_process_wakes_a_serving_runtime(
        make_runtime: MakeRuntime, opened: OpenedStore, kit: Kit) -> None:
    def model(request: ModelRequest) -> Reply:  # per request: serving may find other sessions
        if request.messages[-1].text == "is eu up?":
            return calls(("status", {"env": "eu"}))
        return final("eu is green")

    server = make_runtime(ScriptedProvider(default=model), start=False)
    sid = server.create_session()
    server.serve_start()
    out = other_process(opened.uri, "inject", str(sid), "is eu up?", "wake")
    log = wait_for_event(opened.store, sid, "turn/end")
    assert only(log, "user/message")[0].data == {"text": "is eu up?",
                                                 "inbox_id": out["inbox_id"]}
    assert kit.ran == [("status", {"env": "eu"})]
    assert only(log, "turn/end")[0].data["status"] == "completed"


def test_r24_a_waking_inject_on_a_session_left_open_by_a_crash_resumes_it(
        make_runtime: MakeRuntime, store) -> None:
    from tests.runtime.kit import LogBuilder

    dead = make_runtime(start=False)
    sid = dead.create_session()
    LogBuilder(store, sid).do(lambda s: s.start_turn(text="first question"))
    provider = ScriptedProvider([final("answering both")])
    server = make_runtime(provider)
    server.spawn_agent(sid)
    server.inject(sid, "second question", wake=True)
    log = wait_for_event(store, sid, "turn/end")
    assert len(only(log, "turn/start")) == 1  # resumed, not a second turn
    assert user_texts(provider, 0) == ["first question", "second question"]


def test_r24_a_worker_taking_a_released_session_over_starts_no_turn_for_an_unwaking_entry(
        make_runtime: MakeRuntime, store) -> None:
    """docs/cli.md, inject: without wake the text rides the next turn. A serving worker that
    took over a session another released (a chat that ended, a worker stopping) started a turn
    with such an entry; it waits for the next turn, which a waking inject starts."""
    import time

    first = make_runtime(ScriptedProvider(default=final("one")), start=False)
    first.serve_start()
    sid = first.create_session()
    assert first.run_turn(sid, "hi").status == "completed"
    provider = ScriptedProvider(default=final("two"))
    second = make_runtime(provider, start=False)
    second.serve_start()
    quiet = first.inject(sid, "quiet note, no wake")
    first.close()  # releases the session: the second worker may take it over
    wait_until(lambda: "agent/detached" in names(read_log(store, sid)), what="the release")
    time.sleep(2.5)  # two scans and the release's delivery
    assert names(read_log(store, sid)).count("turn/start") == 1
    loud = second.inject(sid, "now wake", wake=True)
    log = wait_until(lambda: (lg := read_log(store, sid)) and
                     len(only(lg, "turn/end")) == 2 and lg, what="the waking turn")
    assert names(log).count("turn/start") == 2
    assert consumed_once(log, [quiet, loud])


def test_wake_of_a_session_closed_from_another_process_is_refused(
        make_runtime: MakeRuntime, opened: OpenedStore) -> None:
    """``wake`` answered None — "idle, nothing to do" — for a closed session, where ``inject``
    and ``run_turn`` say ``SessionClosed``; it says so too, and writes nothing."""
    from terret.domain.errors import SessionClosed
    from tests.runtime.kit import other_process

    rt = make_runtime()
    sid = rt.create_session()
    assert rt.wake(sid) is None  # open and idle: nothing to do
    other_process(opened.uri, "close", str(sid))
    before = read_log(opened.store, sid)
    with pytest.raises(SessionClosed):
        rt.wake(sid)
    assert read_log(opened.store, sid) == before
