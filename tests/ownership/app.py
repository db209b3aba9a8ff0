"""The app the ownership tests serve: ``terret serve --app tests.ownership.app:app``.

A scripted model that, for each user message, calls a tool ``OWNERSHIP_CALLS`` times (default
1), one call per step, then answers; the first call is to ``gated`` (which asks for approval)
when the message says "gated". The tools sleep ``OWNERSHIP_TOOL_SECONDS`` (default 2) and append
one line per execution to ``OWNERSHIP_RUNS`` (``start|end <session> <call id> <pid>``), so a test
can count executions across processes; their results and the model's texts name the pid that
produced them, so a test can tell which worker wrote what. ``OWNERSHIP_TTL`` sets the lease TTL
(default 3 s). ``OWNERSHIP_IDEMPOTENT=0`` makes ``work`` a tool that may not run twice (a
``tool/started`` before it runs, in doubt after a crash), ``OWNERSHIP_KEYS`` names a file each
execution appends ``<call id> <idempotency key>`` to, ``OWNERSHIP_USAGE=1`` makes every
reply report ``USAGE``, and ``OWNERSHIP_COMPACT_BUDGET`` sets the compaction budget (a fixed
summarizer, no model call). ``OWNERSHIP_UPKEEP_SECONDS`` makes the titler and the summarizer
take that long, and name the pid that made them (a test kills a worker in its upkeep);
``OWNERSHIP_TITLES`` names a file the titler appends its pid to each time it is asked.
``OWNERSHIP_REVISION`` sets the agent definition's revision (default 1), ``OWNERSHIP_AGENT``
its name (default ``default``: another makes the app another app's)."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

from pydantic import BaseModel

from terret import (
    AgentDefinition,
    CallContext,
    FixedSummarizer,
    Reply,
    RuntimeConfig,
    ScriptedProvider,
    StaticResolver,
    Usage,
    call,
    tool,
)
from terret.cli._app import App
from terret.domain.messages import Message
from terret.runtime.model import ModelRequest


class NoArgs(BaseModel):
    pass


def _record(what: str, ctx: CallContext) -> None:
    with open(os.environ["OWNERSHIP_RUNS"], "a") as f:
        f.write(f"{what} {ctx.session_id} {ctx.call_id} {os.getpid()}\n")


IDEMPOTENT = os.environ.get("OWNERSHIP_IDEMPOTENT") != "0"
USAGE = Usage(prompt_tokens=100, completion_tokens=10, cost=0.01)


def _work(ctx: CallContext) -> str:
    if os.environ.get("OWNERSHIP_KEYS"):
        with open(os.environ["OWNERSHIP_KEYS"], "a") as f:
            f.write(f"{ctx.call_id} {ctx.idempotency_key}\n")
    _record("start", ctx)
    time.sleep(float(os.environ.get("OWNERSHIP_TOOL_SECONDS", "2")))
    _record("end", ctx)
    return f"worked by {os.getpid()}"


@tool(args=NoArgs, idempotent=IDEMPOTENT)
def work(args: NoArgs, ctx: CallContext) -> str:
    """Takes a while, and records each execution."""
    return _work(ctx)


@tool(args=NoArgs, approval="always")
def gated(args: NoArgs, ctx: CallContext) -> str:
    """Takes a while once a human approved it, and records each execution."""
    return _work(ctx)


def _reply(request: ModelRequest) -> Reply:
    users = [m.text for m in request.messages if m.role == "user"]
    turn = len(users)
    done = 0  # the calls of this turn already answered
    for m in reversed(request.messages):
        if m.role == "user":
            break
        done += m.role == "tool"
    usage = USAGE if os.environ.get("OWNERSHIP_USAGE") == "1" else None
    if done >= int(os.environ.get("OWNERSHIP_CALLS", "1")):
        return Reply(text=f"done {turn} by {os.getpid()}", usage=usage)
    name = "gated" if done == 0 and "gated" in users[-1] else "work"
    return Reply(text=f"step by {os.getpid()}", usage=usage,
                 tool_calls=[call(name, {}, f"c-{turn}" + (f"-{done + 1}" if done else ""))])


UPKEEP_SECONDS = float(os.environ.get("OWNERSHIP_UPKEEP_SECONDS", "0"))


class SlowTitler:
    def title(self, messages: Sequence[Message]) -> str:
        if os.environ.get("OWNERSHIP_TITLES"):
            with open(os.environ["OWNERSHIP_TITLES"], "a") as f:
                f.write(f"{os.getpid()}\n")
        time.sleep(UPKEEP_SECONDS)
        return f"titled by {os.getpid()}"


class SlowSummarizer(FixedSummarizer):
    def summarize(self, messages: Sequence[Message]) -> str | None:
        time.sleep(UPKEEP_SECONDS)
        summary = super().summarize(messages)
        return None if summary is None else f"summarized by {os.getpid()}\n{summary}"


def app() -> App:
    provider = ScriptedProvider(name="scripted", default=_reply)
    ttl = float(os.environ.get("OWNERSHIP_TTL", "3"))
    budget = os.environ.get("OWNERSHIP_COMPACT_BUDGET")
    return App(resolver=StaticResolver({"scripted": provider}),
               agents=[AgentDefinition(tools=[work, gated], allow=["*"],
                                       name=os.environ.get("OWNERSHIP_AGENT", "default"),
                                       revision=int(os.environ.get("OWNERSHIP_REVISION", "1")))],
               config=RuntimeConfig(roles={"main": "scripted:default"}, lease_ttl=ttl,
                                    compaction_budget=int(budget) if budget else None),
               summarizer=SlowSummarizer() if UPKEEP_SECONDS else FixedSummarizer(),
               titler=SlowTitler() if UPKEEP_SECONDS else None)
