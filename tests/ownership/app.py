"""The app the ownership tests serve: ``terret serve --app tests.ownership.app:app``.

A scripted model that, for each user message, calls the ``work`` tool once and then answers;
``work`` sleeps ``OWNERSHIP_TOOL_SECONDS`` (default 2) and appends one line per execution to
``OWNERSHIP_RUNS`` (``<call id> <pid>``), so a test can count executions across processes.
``OWNERSHIP_TTL`` sets the lease TTL (default 3 s), ``OWNERSHIP_APPROVAL=1`` makes ``work``
ask for approval."""

from __future__ import annotations

import os
import time

from pydantic import BaseModel

from terret import (
    AgentDefinition,
    CallContext,
    Reply,
    RuntimeConfig,
    ScriptedProvider,
    StaticResolver,
    call,
    tool,
)
from terret.cli._app import App
from terret.runtime.model import ModelRequest


class NoArgs(BaseModel):
    pass


APPROVAL = "always" if os.environ.get("OWNERSHIP_APPROVAL") == "1" else "never"


@tool(args=NoArgs, approval=APPROVAL)  # type: ignore[arg-type]
def work(args: NoArgs, ctx: CallContext) -> str:
    """Takes a while, and records each execution."""
    with open(os.environ["OWNERSHIP_RUNS"], "a") as f:
        f.write(f"start {ctx.call_id} {os.getpid()}\n")
    time.sleep(float(os.environ.get("OWNERSHIP_TOOL_SECONDS", "2")))
    with open(os.environ["OWNERSHIP_RUNS"], "a") as f:
        f.write(f"end {ctx.call_id} {os.getpid()}\n")
    return "worked"


def _reply(request: ModelRequest) -> Reply:
    users = sum(1 for m in request.messages if m.role == "user")
    if request.messages and request.messages[-1].role == "tool":
        return Reply(text=f"done {users}")
    return Reply(tool_calls=[call("work", {}, f"c-{users}")])


def app() -> App:
    provider = ScriptedProvider(name="scripted", default=_reply)
    ttl = float(os.environ.get("OWNERSHIP_TTL", "3"))
    return App(resolver=StaticResolver({"scripted": provider}),
               agents=[AgentDefinition(tools=[work], allow=["*"])],
               config=RuntimeConfig(roles={"main": "scripted:default"}, lease_ttl=ttl))
