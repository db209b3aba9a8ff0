"""``terret chat``: an interactive session in the terminal — streamed text, tool calls, y/n
approvals. The session is an ordinary durable one: quit and come back with its id."""

from __future__ import annotations

import threading
from typing import Any
from uuid import UUID

import click

from terret.cli._context import MODEL_SPEC, SESSION, CliContext, operator
from terret.cli._params import AGENT_NAME
from terret.cli.admin import APP_OPTION, runtime_for
from terret.domain.codec import RecordedEvent
from terret.domain.errors import TerretError
from terret.runtime.runtime import Runtime


def _show_event(sid: UUID, event: RecordedEvent) -> None:
    if event.session_id != sid:
        return
    p: Any = event.payload
    if event.wire_name == "assistant/message":
        for c in p.tool_calls:
            click.secho(f"\n  → {c.name}({c.args})", fg="yellow")
    elif event.wire_name == "tool/result":
        colour = "red" if p.is_error else "green"
        click.secho(f"  ← {p.name}: {p.content[:200]}", fg=colour)
    elif event.wire_name == "session/compacted":
        click.secho("  (history compacted)", dim=True)


def _drive(runtime: Runtime, sid: UUID, work: threading.Thread) -> None:
    """Run the turn in the background; answer approval questions as they come."""
    asked: set[str] = set()
    work.start()
    while work.is_alive():
        agent = runtime.agent_for_session(sid)
        if agent is not None and agent.status == "waiting_approval":
            for approval in runtime.views.pending(sid):
                if approval.call_id in asked:
                    continue
                asked.add(approval.call_id)
                ok = click.confirm(f"\n  approve {approval.name}({approval.args})?",
                                   default=False)
                if ok:
                    runtime.approve(sid, approval.call_id, by=operator())
                else:
                    reason = click.prompt("  reason", default="denied in chat")
                    runtime.deny(sid, approval.call_id, by=operator(), reason=reason)
        work.join(0.05)


@click.command("chat")
@click.argument("session_id", type=SESSION, required=False)
@click.option("--model", "spec", type=MODEL_SPEC, default=None,
              help="Main model spec, e.g. openrouter:openai/gpt-4o (recorded as model/set).")
@click.option("--agent", type=AGENT_NAME, default=None,
              help="Agent definition for a new session.")
@APP_OPTION
@click.pass_obj
def chat(obj: CliContext, session_id: UUID | None, spec: str | None, agent: str | None,
         app_spec: str | None) -> None:
    """Chat with an agent in the terminal; a new session unless SESSION is given.
    Type /quit (or Ctrl-D) to leave; the session stays in the store."""
    obj.store(create=session_id is None)  # an existing session needs an existing store
    if session_id is not None:
        obj.require_session(session_id)
    runtime = runtime_for(obj, app_spec).start()
    if session_id is None:
        name = agent or next(iter(runtime.definitions), "default")
        session_id = runtime.create_session(
            agent=name, roles={"main": spec} if spec is not None else None)
        click.secho(f"session {session_id}", dim=True)
    else:
        if spec is not None:
            runtime.set_model(session_id, "main", spec, by=operator())
    sid = session_id
    live = runtime.agent_for_session(sid) or runtime.spawn_agent(sid)
    live.on_text = lambda text: click.echo(text, nl=False)
    runtime.runner.add_listener(lambda e: _show_event(sid, e),
                                {"assistant/message", "tool/result", "session/compacted"})
    if runtime.resumable(sid):
        click.secho("resuming the open turn…", dim=True)
        _drive(runtime, sid, threading.Thread(target=_guarded(runtime.resume_turn, sid)))
    while True:
        try:
            text = click.prompt(click.style("you", bold=True), prompt_suffix="> ")
        except (EOFError, click.Abort):
            break
        if text.strip() in ("/quit", "/exit"):
            break
        click.secho("agent> ", bold=True, nl=False)
        _drive(runtime, sid, threading.Thread(target=_guarded(runtime.run_turn, sid, text)))
        click.echo()
    click.secho(f"\nbye — resume with: terret chat {sid}", dim=True)


def _guarded(fn: Any, *args: Any) -> Any:
    def run() -> None:
        try:
            fn(*args)
        except TerretError as exc:
            click.secho(f"\n  {type(exc).__name__}: {exc}", fg="red", err=True)

    return run


def register(cli: click.Group) -> None:
    cli.add_command(chat)
