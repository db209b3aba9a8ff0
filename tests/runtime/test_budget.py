"""Issue 14, item 2: a spend budget that parks the turn instead of failing it. The turn parks
before the step that would pass the budget (``budget/exceeded``, by budget), the park shows in
the status view and the agent's status, a budget raised from another process lets it go on,
a cancel closes it; budgets per session (``budget/set``, commutative) over a per-deployment
default (``RuntimeConfig.spend_cap``). On the SQLite store and the EventStoreDB emulator."""

from __future__ import annotations

from collections.abc import Iterator
from uuid import UUID

import pytest

from terret import Actor, Runtime, RuntimeConfig, ScriptedProvider, Usage
from terret.adapters.providers import EndpointConfig, ModelPrice, ProviderRegistry, ProvidersConfig
from terret.domain.store import EventStore
from tests.providers.conftest import CHAT, FAST_RETRY, FAST_TIMEOUTS
from tests.runtime.conftest import MakeRuntime, OpenedStore
from tests.runtime.kit import (
    Background,
    agent_of,
    calls,
    final,
    names,
    only,
    other_process,
    read_log,
    turn_in_background,
    wait_until,
)
from tests.support.sse_server import Reply, ScriptedServer, openai_usage, text_stream

OPERATOR = Actor(actor="operator", id="tests")


def spender(cost: float = 0.04, steps: int = 3) -> ScriptedProvider:
    """``steps`` replies calling ``noop``, then an answer; each model call costs ``cost``."""
    return ScriptedProvider([calls(("noop", {}), usage=Usage(10, 1, cost))] * steps,
                            default=final("spent", usage=Usage(10, 1, cost)))


def parked_on_budget(rt, store, sid) -> None:  # type: ignore[no-untyped-def]
    wait_until(lambda: only(read_log(store, sid), "budget/exceeded")
               and agent_of(rt, sid).status == "waiting_budget", what="the budget park")


def spending_parked(make_runtime: MakeRuntime, store: EventStore
                    ) -> tuple[Runtime, UUID, Background]:
    """A turn of ``spender()`` parked on a budget of $0.1 (two steps spent, the third would
    pass it)."""
    rt = make_runtime(spender())
    sid = rt.create_session()
    rt.set_budget(sid, 0.1, by=OPERATOR)
    job = turn_in_background(rt, sid, "spend")
    parked_on_budget(rt, store, sid)
    return rt, sid, job


def test_the_turn_parks_on_its_budget_shows_it_and_goes_on_when_another_process_raises_it(
        make_runtime: MakeRuntime, opened: OpenedStore) -> None:
    store = opened.store
    rt, sid, job = spending_parked(make_runtime, store)
    log = read_log(store, sid)
    (park,) = only(log, "budget/exceeded")
    assert park.data == {"turn": 1, "limit": 0.1, "spent": pytest.approx(0.08),
                         "estimate": 0.04, "by": {"actor": "budget"}}
    assert names(log)[-1] == "budget/exceeded"  # the last step's end rode with it, durable
    assert only(log, "step/end")[-1].seq < park.seq
    rt.catch_up_views()
    status = rt.views.status(sid)
    assert status is not None and status.status == "waiting_budget"
    assert status.budget_wait == {"turn": 1, "limit": 0.1, "spent": pytest.approx(0.08),
                                  "estimate": 0.04}
    assert [s.session for s in rt.views.parked_on_budget()] == [status.session]
    check = rt.budget(sid)
    assert check is not None and check.exceeded and check.limit == 0.1
    assert rt.views.sessions(status="waiting_budget")[0].id == str(sid)

    other_process(opened.uri, "budget", str(sid), "0.5")  # the store is the bus
    assert job.join().status == "completed"
    log = read_log(store, sid)
    (_, raised) = only(log, "budget/set")
    assert raised.data["limit"] == 0.5 and raised.data["by"]["actor"] == "operator"
    after = [e.name for e in log if e.seq > park.seq]
    assert after[:2] == ["budget/set", "step/start"]  # it went on with its next step
    assert rt.usage(sid)["cost"] == pytest.approx(0.16)
    rt.catch_up_views()
    assert rt.views.status(sid).status == "idle"  # type: ignore[union-attr]
    assert rt.views.parked_on_budget() == []


def test_the_step_after_a_budget_park_uses_the_model_set_while_it_waited(
        make_runtime: MakeRuntime, opened: OpenedStore) -> None:
    """The remedy for a blown budget — a cheaper model beside a raised budget, both from
    another process — applies to the very next step: its model was read before the wait."""
    store = opened.store
    _, sid, job = spending_parked(make_runtime, opened.store)
    other_process(opened.uri, "model", str(sid), "main", "scripted:cheaper")
    other_process(opened.uri, "budget", str(sid), "0.5")
    assert job.join().status == "completed"
    log = read_log(store, sid)
    (park,) = only(log, "budget/exceeded")
    after = [e.data["model"] for e in only(log, "step/start") if e.seq > park.seq]
    assert after and set(after) == {"scripted:cheaper"}, after


def test_a_turn_parked_on_its_budget_is_cancelled_from_another_process(
        make_runtime: MakeRuntime, opened: OpenedStore) -> None:
    rt = make_runtime(spender(), config=RuntimeConfig(spend_cap=0.05))
    sid = rt.create_session()
    job = turn_in_background(rt, sid, "spend")
    parked_on_budget(rt, opened.store, sid)
    other_process(opened.uri, "cancel", str(sid))
    assert job.join().status == "cancelled"
    (end,) = only(read_log(opened.store, sid), "turn/end")
    assert end.data["status"] == "cancelled" and end.data["by"]["actor"] == "operator"
    assert rt.usage(sid)["cost"] == pytest.approx(0.04)  # one call: 0.04 + 0.04 > 0.05


def test_a_raise_that_does_not_cover_the_next_step_keeps_the_turn_parked(
        make_runtime: MakeRuntime, store) -> None:
    rt = make_runtime(spender())
    sid = rt.create_session()
    rt.set_budget(sid, 0.1, by=OPERATOR)
    job = turn_in_background(rt, sid, "spend")
    parked_on_budget(rt, store, sid)
    rt.set_budget(sid, 0.11, by=OPERATOR)  # 0.08 + 0.04 > 0.11: still parked
    wait_until(lambda: only(read_log(store, sid), "budget/set")[1:], what="the raise")
    rt.catch_up_views()
    assert not job.done and agent_of(rt, sid).status == "waiting_budget"
    assert names(read_log(store, sid))[-1] == "budget/set"  # nothing written on the wake
    rt.set_budget(sid, None, by=OPERATOR)  # back to the deployment's default: none
    assert job.join().status == "completed"


def test_a_session_budget_replaces_the_deployment_default_both_ways(
        make_runtime: MakeRuntime, store) -> None:
    rt = make_runtime(spender(cost=0.04, steps=1), config=RuntimeConfig(spend_cap=1.0))
    low, high = rt.create_session(), rt.create_session()
    rt.set_budget(low, 0.0, by=OPERATOR)  # lower than the default: not even one call
    job = turn_in_background(rt, low, "spend")
    parked_on_budget(rt, store, low)
    assert only(read_log(store, low), "budget/exceeded")[0].data["limit"] == 0.0
    assert rt.usage(low)["cost"] == 0.0
    rt.cancel(low, by=OPERATOR)
    assert job.join().status == "cancelled"
    rt.set_budget(high, 5.0, by=OPERATOR)
    assert rt.budget(high).limit == 5.0  # type: ignore[union-attr]
    rt.set_budget(high, None, by=OPERATOR)
    assert rt.budget(high).limit == 1.0  # type: ignore[union-attr]


def test_a_budget_lowered_while_the_turn_runs_parks_it_at_its_next_step(
        make_runtime: MakeRuntime, store, kit) -> None:  # type: ignore[no-untyped-def]
    provider = ScriptedProvider([calls(("slow", {}), usage=Usage(1, 1, 0.04))],
                                default=final(usage=Usage(1, 1, 0.04)))
    rt = make_runtime(provider)
    sid = rt.create_session()
    job = turn_in_background(rt, sid, "go")
    assert kit.entered.wait(15)
    rt.set_budget(sid, 0.05, by=OPERATOR)  # lands while the tool runs: folded in (R5)
    kit.release.set()
    parked_on_budget(rt, store, sid)
    assert not only(read_log(store, sid), "turn/end")
    rt.cancel(sid, by=OPERATOR)
    assert job.join().status == "cancelled"


def test_a_stopped_process_leaves_the_park_and_the_next_one_parks_again_without_a_new_record(
        make_runtime: MakeRuntime, store) -> None:
    rt = make_runtime(spender(), config=RuntimeConfig(spend_cap=0.1))
    sid = rt.create_session()
    job = turn_in_background(rt, sid, "spend")
    parked_on_budget(rt, store, sid)
    rt.close()  # graceful: the turn stays open, parked on its budget in the log
    with pytest.raises(Exception):  # noqa: B017 - TurnSuspended
        job.join()
    before = read_log(store, sid)
    fresh = make_runtime(spender(), config=RuntimeConfig(spend_cap=0.1))
    resumed = Background(lambda: fresh.resume_turn(sid))
    wait_until(lambda: (a := fresh.agent_for_session(sid)) is not None
               and a.status == "waiting_budget", what="the resumed turn parked")
    assert {e.name for e in read_log(store, sid)[len(before):]} <= {
        "agent/detached", "agent/attached"}  # the takeover, and no second budget/exceeded
    fresh.set_budget(sid, 1.0, by=OPERATOR)
    assert resumed.join().status == "completed"
    assert len(only(read_log(store, sid), "budget/exceeded")) == 1


# --- an endpoint that reports no cost (OpenAI, vLLM): priced from its config ----------------


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with ScriptedServer() as scripted:
        yield scripted


def _over_http(opened: OpenedStore, server: ScriptedServer,
               prices: dict[str, ModelPrice]) -> Runtime:
    """A runtime whose main model is an OpenAI-style endpoint (usage without cost)."""
    server.repeat(CHAT, Reply.sse(text_stream(["ok"], style="openai",
                                              usage=openai_usage(100_000, 10_000))))
    endpoint = EndpointConfig(base_url=server.url + "/api/v1", prices=prices)
    registry = ProviderRegistry(ProvidersConfig(endpoints={"vllm": endpoint},
                                                retry=FAST_RETRY, timeouts=FAST_TIMEOUTS))
    return Runtime(opened.store, resolver=registry,
                   config=RuntimeConfig(roles={"main": "vllm:acme/m"})).start()


def test_an_endpoint_that_reports_no_cost_is_priced_from_its_config_and_its_budget_parks(
        opened: OpenedStore, server: ScriptedServer) -> None:
    """docs/providers.md, *Prices*: OpenAI and vLLM report tokens, not cost; without prices a
    spend budget counted nothing for them. 100,000 + 10,000 tokens at 1.0 / 2.0 per million
    are 0.12 a call: the second turn would pass a budget of 0.2, so it parks until another
    process raises the budget."""
    rt = _over_http(opened, server, {"acme/m": ModelPrice(prompt=1.0, completion=2.0)})
    try:
        sid = rt.create_session()
        rt.set_budget(sid, 0.2, by=OPERATOR)
        assert rt.run_turn(sid, "one").status == "completed"
        assert rt.usage(sid)["cost"] == pytest.approx(0.12)
        job = turn_in_background(rt, sid, "two")
        parked_on_budget(rt, opened.store, sid)
        (park,) = only(read_log(opened.store, sid), "budget/exceeded")
        assert park.data["spent"] == pytest.approx(0.12)
        other_process(opened.uri, "budget", str(sid), "1.0")
        assert job.join().status == "completed"
        costs = [e.data["usage"]["cost"] for e in only(read_log(opened.store, sid),
                                                       "assistant/message")]
        assert costs == [pytest.approx(0.12)] * 2  # durable with each reply
    finally:
        rt.close()


def test_a_budget_over_a_model_that_reports_no_cost_says_it_counts_nothing(
        opened: OpenedStore, server: ScriptedServer, caplog: pytest.LogCaptureFixture) -> None:
    rt = _over_http(opened, server, {})
    try:
        sid = rt.create_session()
        rt.set_budget(sid, 0.01, by=OPERATOR)
        with caplog.at_level("WARNING", logger="terret"):
            for text in ("one", "two"):
                assert rt.run_turn(sid, text).status == "completed"  # nothing to count
        warned = [r.getMessage() for r in caplog.records if "reported no cost" in r.getMessage()]
        assert len(warned) == 1 and "vllm:acme/m" in warned[0] and "prices" in warned[0]
        assert rt.usage(sid)["cost"] == 0.0
    finally:
        rt.close()


def test_a_budget_over_a_provider_that_reports_no_usage_at_all_says_it_counts_nothing(
        make_runtime: MakeRuntime, caplog: pytest.LogCaptureFixture) -> None:
    """A reply with no usage (a provider of your own, a server sending none) was spent free of
    the budget without the warning a reply without a cost gets."""
    from terret import Reply as Scripted

    rt = make_runtime(ScriptedProvider(default=Scripted(text="ok", usage=None)))
    sid = rt.create_session()
    rt.set_budget(sid, 0.01, by=OPERATOR)
    with caplog.at_level("WARNING", logger="terret"):
        for text in ("one", "two"):
            assert rt.run_turn(sid, text).status == "completed"
    warned = [r.getMessage() for r in caplog.records if "no usage at all" in r.getMessage()]
    assert len(warned) == 1 and "its budget does not count" in warned[0]


def test_a_step_that_lands_exactly_on_the_budget_runs(make_runtime: MakeRuntime,
                                                      opened: OpenedStore) -> None:
    """0.2 + 0.1 is 0.30000000000000004 as floats: a budget of 0.3 parked the third step of
    0.1, which lands on it and does not pass it (docs/runtime.md: the turn parks when the step
    would pass the budget). Costs are compared as cost figures; the fourth call parks."""
    rt = make_runtime(spender(cost=0.1, steps=5))
    sid = rt.create_session()
    rt.set_budget(sid, 0.3, by=OPERATOR)
    job = turn_in_background(rt, sid, "spend")
    parked_on_budget(rt, opened.store, sid)
    log = read_log(opened.store, sid)
    assert len(only(log, "step/end")) == 3
    (park,) = only(log, "budget/exceeded")
    assert park.data["spent"] == pytest.approx(0.3) and park.data["limit"] == 0.3
    rt.cancel(sid, by=OPERATOR)
    assert job.join().status == "cancelled"
