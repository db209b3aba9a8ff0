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
from tests.runtime.kit import final, only, read_log


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
