"""A tool or hook defined wrong is refused where it is defined, with a ConfigurationError — a
misspelt approval mode ("Always") asked nobody and ran the gated tool (it failed open); a hook
returning False failed the turn with an AttributeError."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from terret import CallContext, tool
from terret.domain.errors import ConfigurationError
from tests.runtime.conftest import MakeRuntime
from tests.runtime.kit import final, only, read_log, wait_until


class DeployArgs(BaseModel):
    env: str


def _deploy(args: DeployArgs, ctx: CallContext) -> str:
    return f"deployed {args.env}"


@pytest.mark.parametrize(("options", "says"), [
    ({"approval": "Always"}, "approval is 'never', 'always' or 'policy'"),
    ({"approval": None}, "approval is"),
    ({"args": dict}, "args is a pydantic model class"),
    ({"mutating": "yes"}, "mutating is True or False"),
    ({"idempotent": 0}, "idempotent is True or False"),
])
def test_a_tool_defined_wrong_is_refused_at_its_definition(options: dict[str, Any],
                                                           says: str) -> None:
    with pytest.raises(ConfigurationError, match=says):
        tool(**{"args": DeployArgs, **options})(_deploy)


def test_a_hook_returning_something_else_than_a_refusal_is_said_so(
        make_runtime: MakeRuntime, store) -> None:
    def lenient(claim: object) -> bool:
        return False  # meant as "do not refuse"

    rt = make_runtime([final("never asked")], pre_step=[lenient])
    sid = rt.create_session()
    with pytest.raises(ConfigurationError, match="returns None or a terret.Refusal"):
        rt.run_turn(sid, "hello")
    (end,) = only(read_log(store, sid), "turn/end")
    assert end.data["status"] == "failed" and "ConfigurationError" in end.data["error"]


@pytest.mark.parametrize("options", [
    {"spend_cap": -1}, {"spend_cap": float("nan")}, {"spend_cap": float("inf")},
    {"wait_timeout": 0}, {"tool_timeout": -1}, {"tool_timeout": "3"}, {"max_steps": "5"},
    {"max_steps": 0}, {"max_agents": -1}, {"approval_max_wait": -5}, {"lease_ttl": 0},
    {"roles": "scripted:x"}, {"compaction_budget": 0}, {"roles": {"main": "nocolon"}},
    {"roles": {"Main": "scripted:x"}}, {"lease_ttl": float("inf")}, {"lease_ttl": 1e12},
    {"wait_timeout": float("inf")}, {"wait_timeout": 1e12}, {"lease_ttl": 10**400},
    {"tool_timeout": 10**400}, {"approval_max_wait": 10**400}, {"spend_cap": 10**400},
    {"lease_ttl": -10**400}, {"lease_ttl": 0.001}, {"lease_ttl": 0.49},
    {"roles": {"main": "openai-compatible:m@http://bob:SECRETpw@127.0.0.1:8000/v1"}},
])
def test_a_runtime_config_value_no_turn_could_use_is_refused_when_made(
        options: dict[str, Any]) -> None:
    """Each was accepted, then failed every turn (a negative cap, a zero wait, a lease without
    end: its end is a clock time), switched a limit off silently (a NaN cap), or raised an
    untyped TypeError or OverflowError later (a wait of 1e12 seconds)."""
    from terret import RuntimeConfig

    (name,) = options
    with pytest.raises(ConfigurationError, match=f"RuntimeConfig.{name}[ :]") as info:
        RuntimeConfig(**options)
    assert "SECRET" not in str(info.value)  # a spec with a key is refused, never quoted
    RuntimeConfig(tool_timeout=float("inf"), spend_cap=0, approval_max_wait=0.3,
                  lease_ttl=366 * 86400, wait_timeout=366 * 86400.0)  # all fine


def test_the_views_take_a_session_id_in_every_form_the_runtime_takes(
        make_runtime: MakeRuntime) -> None:
    """``session-<UPPER-CASE UUID>`` read as no session (usage 0, no status) while
    ``Runtime.usage`` found it; junk raised ValueError/AttributeError, not SessionNotFound."""
    from terret.domain.errors import SessionNotFound

    rt = make_runtime([final("hi")])
    sid = rt.create_session()
    rt.run_turn(sid, "hello")
    wait_until(lambda: rt.views.usage(sid).steps == 1, what="the usage view")
    for form in (sid, str(sid), f"session-{sid}", f"session-{str(sid).upper()}",
                 f" {sid} "):
        assert rt.views.usage(form).steps == 1, form
        assert rt.views.status(form) is not None, form
    for junk in ("nope", "session-nope", None, 7):
        with pytest.raises(SessionNotFound):
            rt.views.usage(junk)  # type: ignore[arg-type]


def test_an_agent_with_two_tools_of_one_name_is_refused() -> None:
    from terret import AgentDefinition

    first = tool("deploy", args=DeployArgs)(_deploy)
    second = tool("deploy", args=DeployArgs)(_deploy)
    with pytest.raises(ConfigurationError, match="two tools are named 'deploy'"):
        AgentDefinition(tools=[first, second])


@pytest.mark.parametrize("views", [None, 3, b"views.db"])
def test_views_that_are_not_a_path_or_a_view_store_are_refused(views: Any, store) -> None:
    """``Runtime(views=None)`` read as "the default" and failed in pathlib with a TypeError."""
    from terret import Runtime, StaticResolver

    with pytest.raises(ConfigurationError, match="views is a SQLite file's path"):
        Runtime(store, resolver=StaticResolver(), views=views)


def test_views_given_as_a_path_object_are_that_file(make_runtime: MakeRuntime, tmp_path) -> None:
    rt = make_runtime(views=tmp_path / "views.db")
    rt.run_turn(rt.create_session(), "hi")
    assert (tmp_path / "views.db").exists()


def test_two_agent_definitions_of_one_name_are_refused() -> None:
    """The last one won, silently: ``session/started`` recorded its revision, and the other
    definition was never used."""
    from terret import AgentDefinition, Runtime, StaticResolver, open_store
    from terret.domain.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="two agent definitions named 'x'"):
        Runtime(open_store("memory:"), resolver=StaticResolver(),
                agents=[AgentDefinition(name="x"), AgentDefinition(name="x", revision=2)])
