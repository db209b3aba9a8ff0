"""The demo's app with one more tool, ``hold``, that has no timeout: it touches
``$CHAT_RELEASE.started`` and returns only once the file ``$CHAT_RELEASE`` exists, so a test
decides when a running tool call ends (for Ctrl-C in chat while a tool runs). The model calls it
for a message starting with ``hold``, streams a long answer slowly for one starting with
``long``; it raises a RuntimeError for one starting with
``explode`` and a ``ProviderError`` for one starting with ``unavailable``; for one starting with
``give up`` it calls ``give_up``, which raises ``SystemExit`` (``KeyboardInterrupt`` with
``CHAT_GIVE_UP=interrupt``); for one starting with ``slow deploy`` it thinks 1.5 s, then asks
for a deploy (which needs an approval)."""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from terret.cli._app import App
from terret.cli.demo_app import demo_app, demo_model
from terret.domain.errors import ModelCancelled, ProviderError
from terret.domain.messages import Usage
from terret.runtime.model import ModelRequest, StaticResolver
from terret.runtime.scripted import Reply, ScriptedProvider, call
from terret.runtime.tools import CallContext, tool


class HoldArgs(BaseModel):
    what: str


@tool(args=HoldArgs, description="Hold until the test releases it.")
def hold(args: HoldArgs, ctx: CallContext) -> str:
    release = Path(os.environ["CHAT_RELEASE"])
    release.with_suffix(".started").touch()  # the test may interrupt it now
    while not release.exists():
        time.sleep(0.05)
    return f"released {args.what}"


class NoArgs(BaseModel):
    pass


@tool(args=NoArgs, description="Stops the process, as a tool that calls sys.exit would.")
def give_up(args: NoArgs, ctx: CallContext) -> str:
    if os.environ.get("CHAT_GIVE_UP") == "interrupt":
        raise KeyboardInterrupt
    raise SystemExit("the tool gave up")


def model(request: ModelRequest) -> Reply:
    messages = [m for m in request.messages if m.role != "system"]
    last = messages[-1]
    if last.role == "tool" and last.tool_name == "hold":
        return Reply(text=f"Held: {last.text}.", usage=Usage(prompt_tokens=10,
                                                              completion_tokens=3))
    if last.role == "user" and last.text.startswith("explode"):
        # Not a Terret error, and on two lines: chat and serve say it in one.
        raise RuntimeError("the model blew up\n  while answering")
    if last.role == "user" and last.text.startswith("unavailable"):
        raise ProviderError("demo", "503 service unavailable")
    if last.role == "user" and last.text.startswith("give up"):
        return Reply(tool_calls=[call("give_up", {}, id="call-give-up")])
    if last.role == "user" and last.text.startswith("long"):
        return Reply(text=" ".join(["word"] * 100), usage=Usage(prompt_tokens=10,
                                                                completion_tokens=100))
    if last.role == "user" and last.text.startswith("slow deploy"):
        time.sleep(1.5)  # the model thinks: a test types ahead meanwhile
        return Reply(tool_calls=[call("deploy", {"service": "checkout", "version": "v9"},
                                      id="call-deploy")])
    if last.role == "user" and last.text.startswith("hold"):
        return Reply(tool_calls=[call("hold", {"what": last.text[5:] or "it"}, id="call-hold")],
                     usage=Usage(prompt_tokens=10, completion_tokens=3))
    return demo_model(request)


class SlowStream(ScriptedProvider):
    """A reply to a message starting with ``long`` streams one word every 0.1 s (a test can
    press Ctrl-C in the middle of it), and like a network stream, whose buffered bytes still
    arrive after a cancel, it notices a cancel only every ten words."""

    def _stream(self, text: str, on_text: Any, cancel: Any) -> None:
        if not text.startswith("word "):
            return super()._stream(text, on_text, cancel)
        for n, word in enumerate(text.split(" ")):
            if n % 10 == 0 and cancel is not None and cancel.is_set():
                raise ModelCancelled(f"{self.name}: request cancelled")
            on_text(word + " ")
            time.sleep(0.1)


def app() -> App:
    base = demo_app()
    agent = base.agents[0]
    base.agents = [replace(agent, tools=[*agent.tools, hold, give_up],
                           allow=[*agent.allow, "hold", "give_up"])]
    base.resolver = StaticResolver({"demo": SlowStream(name="demo", default=model)})
    return base
