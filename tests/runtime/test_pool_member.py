"""A pool member's ``Runtime`` (``serve_start(group=...)``): its views follow only the sessions
it serves, so its per-session queries answer for those and refuse the others with a typed
error rather than an empty answer. On a store without groups (SQLite) the group is ignored and
every session is answered."""

from __future__ import annotations

import pytest

from terret import Actor, Usage
from terret.domain.errors import RuntimeFault
from tests.runtime.conftest import MakeRuntime, OpenedStore
from tests.runtime.kit import final, names, read_log, wait_until


def test_a_pool_members_queries_answer_for_its_sessions_and_refuse_the_others(
        make_runtime: MakeRuntime, opened: OpenedStore) -> None:
    member = make_runtime([final("served", usage=Usage(10, 2))], start=False)
    member.serve_start(group="terret-test-pool")
    operator = make_runtime()
    served, other = operator.create_session(), operator.create_session()
    operator.set_title(other, "Not the member's", by=Actor(actor="operator", id="test"))
    operator.inject(served, "take this one", wake=True)
    wait_until(lambda: "turn/end" in names(read_log(opened.store, served)),
               what="the member to serve the woken session")
    assert member.usage(served)["prompt_tokens"] == 10
    if opened.kind == "sqlite":  # no groups: every worker's views hold every session
        assert member.title(other) == "Not the member's"
        return
    with pytest.raises(RuntimeFault, match="not served by this pool member"):
        member.title(other)
    with pytest.raises(RuntimeFault, match="not served by this pool member"):
        member.usage(other)



def test_a_pool_member_at_its_agent_cap_serves_a_refused_wake_once_an_agent_is_free(
        make_runtime: MakeRuntime, opened: OpenedStore) -> None:
    """The group gives a wake once: refused at the cap (every agent parked), it was lost — a
    member's scan goes over its own sessions, and the refused one never was. It is tried again
    once an agent is free, as a worker whose views hold every session does."""
    from terret import RuntimeConfig, ScriptedProvider
    from tests.runtime.kit import calls, other_process, wait_parked

    provider = ScriptedProvider(default=lambda r: (
        calls(("deploy", {"env": "prod"})) if r.messages[-1].text == "deploy" else final("hi")))
    # A deadline to keep: the parked turn holds its agent (none waiting on a person without
    # one is set aside to make room).
    member = make_runtime(provider, config=RuntimeConfig(max_agents=1, approval_max_wait=3600),
                          start=False)
    member.serve_start(group="terret-test-cap")
    parked, waiting = member.create_session(), member.create_session()
    other_process(opened.uri, "inject", str(parked), "deploy", "wake")
    wait_parked(member, parked)
    other_process(opened.uri, "inject", str(waiting), "hello", "wake")  # refused: the cap
    wait_until(lambda: any(a.session_id == parked for a in member.agents), what="the park")
    other_process(opened.uri, "approve", str(parked), member.pending(parked)[0])
    wait_until(lambda: "turn/end" in names(read_log(opened.store, waiting)), timeout=30,
               what="the refused wake served once the agent was free")


def test_a_pool_member_forgets_a_session_it_let_go_and_serves_it_whole_when_it_comes_back(
        make_runtime: MakeRuntime, opened: OpenedStore) -> None:
    """A member's views are in memory: a session it let go (here at its agent cap) leaves them,
    so its memory holds the sessions it serves, not every one it served since it started; woken
    again, the session is read from its first event — the model is sent its whole history."""
    from terret import RuntimeConfig, ScriptedProvider
    from tests.runtime.kit import other_process

    provider = ScriptedProvider(default=lambda r: final(f"re: {r.messages[-1].text}"))
    member = make_runtime(provider, config=RuntimeConfig(max_agents=1), start=False)
    member.serve_start(group="terret-test-forget")
    first, second = member.create_session(), member.create_session()

    def served(sid: object, count: int) -> None:
        wait_until(lambda: names(read_log(opened.store, sid)).count("turn/end") == count,
                   what="the member to serve the wake")

    other_process(opened.uri, "inject", str(first), "one", "wake")
    served(first, 1)
    other_process(opened.uri, "inject", str(second), "two", "wake")  # the cap lets first go
    served(second, 1)
    wait_until(lambda: all(a.session_id != first for a in member.agents), what="first let go")
    if opened.kind != "sqlite":  # a pool member's views hold only what it serves
        wait_until(lambda: [s.id for s in member.views.sessions()] == [str(second)],
                   what="the let-go session to leave the member's views")
        assert member.views.messages(first) == []
        with pytest.raises(RuntimeFault, match="not served by this pool member"):
            member.title(first)
    other_process(opened.uri, "inject", str(first), "three", "wake")
    served(first, 2)
    sent = [r for r in provider.requests if r.messages[-1].text == "three"]
    assert [m.text for m in sent[-1].messages if m.role != "system"] == [
        "one", "re: one", "three"]
    assert member.usage(first)["steps"] == 2  # the replay counted nothing twice


def test_a_pool_member_at_its_cap_sets_a_parked_turn_aside_and_resumes_it_on_its_verdict(
        make_runtime: MakeRuntime, opened: OpenedStore) -> None:
    """A member whose one agent holds a turn parked on an approval serves a new wake: the
    parked turn is set aside (released, open in the log; the member's views forget it), and
    the verdict another process records reaches a member through the group, which resumes
    the turn from the log and runs the call once."""
    from terret import RuntimeConfig, ScriptedProvider
    from tests.runtime.kit import calls, only, other_process, wait_for_event, wait_parked

    def model(r: object) -> object:
        last = r.messages[-1]  # type: ignore[attr-defined]
        if last.role == "user" and last.text == "deploy":
            return calls(("deploy", {"env": "prod"}))
        return final(f"re: {last.text}")

    provider = ScriptedProvider(default=model)
    member = make_runtime(provider, config=RuntimeConfig(max_agents=1), start=False)
    member.serve_start(group="terret-test-aside")
    parked, other = member.create_session(), member.create_session()
    other_process(opened.uri, "inject", str(parked), "deploy", "wake")
    wait_parked(member, parked)
    call_id = member.pending(parked)[0]
    other_process(opened.uri, "inject", str(other), "hello", "wake")
    wait_for_event(opened.store, other, "turn/end")
    wait_until(lambda: member.agent_for_session(parked) is None, what="the park set aside")
    assert "turn/end" not in names(read_log(opened.store, parked))
    other_process(opened.uri, "approve", str(parked), call_id)
    log = wait_for_event(opened.store, parked, "turn/end", timeout=30)
    assert only(log, "turn/end")[0].data["status"] == "completed"
    assert len(only(log, "tool/result")) == 1


def test_a_pool_members_upkeep_reads_a_whole_session_though_the_member_lets_it_go_meanwhile(
        make_runtime: MakeRuntime, opened: OpenedStore) -> None:
    """A member forgets a session it lets go; the compaction of the session's last turn, under
    way when the agent cap let it go, read its forgotten rows: the summarizer was given nothing
    and `session/compacted` recorded a summary of nothing over the whole history. The upkeep
    keeps the session followed while it runs."""
    import time

    from terret import RuntimeConfig, ScriptedProvider
    from tests.runtime.kit import only, other_process, wait_for_event

    seen: list[list[str]] = []

    class Recording:
        def summarize(self, messages: object) -> str:
            seen.append([m.text for m in messages])  # type: ignore[attr-defined]
            return f"summary of {len(seen[-1])} messages"

    member = make_runtime(ScriptedProvider(default=lambda r: final(
        f"re: {r.messages[-1].text}", usage=Usage(500, 5))), summarizer=Recording(),
        config=RuntimeConfig(max_agents=1, compaction_budget=100), start=False)
    member.serve_start(group="terret-test-upkeep")
    first, second = member.create_session(), member.create_session()
    views = member.compactor.upkeep.views
    real = views.last_prompt_tokens

    def slow(sid: object, turn: int) -> int | None:  # the let-go lands mid-upkeep
        value = real(sid, turn)  # type: ignore[arg-type]
        if sid == first:
            other_process(opened.uri, "inject", str(second), "two", "wake")
            wait_until(lambda: member.agent_for_session(first) is None, what="first let go")
            time.sleep(0.3)
        return value

    views.last_prompt_tokens = slow  # type: ignore[method-assign]
    other_process(opened.uri, "inject", str(first), "one", "wake")
    log = wait_for_event(opened.store, first, "session/compacted", timeout=20)
    assert ["one", "re: one"] in seen and [] not in seen, seen
    assert only(log, "session/compacted")[0].data["summary"] == "summary of 2 messages"


def test_a_pool_members_turn_parked_on_its_budget_goes_on_when_the_budget_is_raised(
        make_runtime: MakeRuntime, opened: OpenedStore) -> None:
    """A pool's group may not carry `budget/set` (a group's filter is fixed when it is
    created): a turn parked on its budget keeps its member's agent in a pool — it is not set
    aside, where no raise would reach a worker — and goes on when the budget is raised."""
    import time

    from terret import RuntimeConfig, ScriptedProvider
    from tests.runtime.kit import calls, only, other_process, wait_for_event

    def model(r: object) -> object:
        last = r.messages[-1]  # type: ignore[attr-defined]
        if last.role == "user" and last.text == "spend":
            return calls(("noop", {}), usage=Usage(10, 1, 0.04))
        return final(f"re: {last.text}", usage=Usage(10, 1, 0.04))

    member = make_runtime(ScriptedProvider(default=model),
                          config=RuntimeConfig(max_agents=1, spend_cap=0.05), start=False)
    member.serve_start(group="terret-test-budget")
    parked, other = member.create_session(), member.create_session()
    other_process(opened.uri, "inject", str(parked), "spend", "wake")
    wait_until(lambda: "budget/exceeded" in names(read_log(opened.store, parked)),
               what="the park on the budget")
    other_process(opened.uri, "budget", str(other), "1.0")
    other_process(opened.uri, "inject", str(other), "hello", "wake")
    if opened.kind != "sqlite":  # in a pool: the park holds the member's one agent
        time.sleep(2 * member.supervisor.scan_interval)
        assert member.agent_for_session(parked) is not None
        assert not only(read_log(opened.store, parked), "agent/detached")
    other_process(opened.uri, "budget", str(parked), "1.0")
    log = wait_for_event(opened.store, parked, "turn/end", timeout=20)
    assert only(log, "turn/end")[0].data["status"] == "completed"
    wait_for_event(opened.store, other, "turn/end", timeout=20)
