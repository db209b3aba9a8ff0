"""``terret sessions …``: list, show, new, close, purge."""

from __future__ import annotations

import json
import time
from typing import Any
from uuid import UUID

import click

from terret.cli._context import MODEL_SPEC, SESSION, CliContext, note, operator, table
from terret.cli._params import AGENT_NAME, TEXT
from terret.domain.errors import InvalidPayload, RuleViolation, SessionNotFound
from terret.domain.repository import SessionRepository
from terret.domain.session import Session
from terret.runtime.retention import purge_session

STATUSES = ("idle", "running", "waiting_approval", "closed")


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


@click.group("sessions")
def sessions() -> None:
    """List, inspect, create, close and purge sessions."""


@sessions.command("list")
@click.option("--status", type=click.Choice(STATUSES), help="Only sessions in this state.")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="At most N sessions.")
@click.pass_obj
def list_sessions(obj: CliContext, status: str | None, limit: int | None) -> None:
    """List sessions, most recently active first."""
    found = obj.views().sessions(status=status, limit=limit)
    if obj.json_output:  # build only the output asked for: this is the 10,000-row command
        obj.emit([s.as_dict() for s in found])
        return
    rows = [[s.id, s.status, str(s.events), f"{s.usage.cost:.4f}", _when(s.last_activity),
             (s.title or "")[:40]] for s in found]
    obj.emit(None, table(rows, ["ID", "STATUS", "EVENTS", "COST", "LAST ACTIVITY", "TITLE"])
             if rows else "no sessions")


@sessions.command("show")
@click.argument("session_id", type=SESSION)
@click.pass_obj
def show(obj: CliContext, session_id: UUID) -> None:
    """Title, status, open turn, pending approvals, usage and policy of one session."""
    obj.require_session(session_id)
    views = obj.views()
    summary = views.summary(session_id)
    status = views.status(session_id)
    if summary is None or status is None:
        raise SessionNotFound(f"no session {session_id}")
    pending = views.pending(session_id)
    policy = views.policy(session_id)
    data = {
        **summary.as_dict(),
        "open_turn": status.turn if status.turn_open else None,
        "step": status.step, "step_open": status.step_open,
        "owed_calls": status.owed, "cancel_requested": status.cancel_requested,
        "inbox": status.inbox, "resumable": status.resumable and not status.closed,
        "pending_approvals": [{"call_id": p.call_id, "tool": p.name, "args": p.args}
                              for p in pending],
        "policy": policy, "models": views.roles(session_id),
        "usage_by_model": {k: v.as_dict() for k, v in views.usage_by_model(session_id).items()},
    }
    lines = [
        f"session   {summary.id}",
        f"title     {summary.title or '(untitled)'}",
        f"agent     {summary.agent}",
        f"status    {summary.status}"
        + (f" (turn {status.turn}, step {status.step}{' open' if status.step_open else ''})"
           if status.turn_open else ""),
        f"events    {summary.events}   created {_when(summary.created)}   "
        f"last activity {_when(summary.last_activity)}",
        f"policy    {', '.join(policy) if policy is not None else 'none recorded (agent floor)'}",
        f"models    {', '.join(f'{k}={v}' for k, v in sorted(data['models'].items()))}",
        f"usage     {_usage(summary.usage.as_dict())}",
    ]
    for model_spec, used in sorted(data["usage_by_model"].items()):
        lines.append(f"  {model_spec}: {_usage(used)}")
    for call in status.owed:
        lines.append(f"owed      {call['id']}: {call['name']} {json.dumps(call['args'])}")
    if status.inbox:
        lines.append(f"inbox     {status.inbox} queued")
    for p in pending:
        lines.append(f"approval  {p.call_id}: {p.name} {json.dumps(p.args)}  (pending)")
    if status.cancel_requested:
        lines.append("cancel    requested")
    if data["resumable"]:
        lines.append(f"resumable yes (`terret resume {summary.id}`, or `terret serve`)")
    obj.emit(data, "\n".join(lines))


def _usage(used: dict[str, Any]) -> str:
    return (f"{used['prompt_tokens']} prompt + {used['completion_tokens']} completion tokens, "
            f"cost {used['cost']:.4f}, {used['steps']} steps")


@sessions.command("new")
@click.option("--agent", type=AGENT_NAME, default="default", show_default=True,
              help="Agent definition name.")
@click.option("--model", "main_model", type=MODEL_SPEC, default=None, metavar="SPEC",
              help="Model spec of the main role, e.g. openrouter:openai/gpt-4o.")
@click.pass_obj
def new(obj: CliContext, agent: str, main_model: str | None) -> None:
    """Create a session and print its id."""
    roles = {"main": main_model} if main_model is not None else {}
    try:
        session = Session.start(agent=agent, roles=roles)
    except InvalidPayload as exc:
        raise click.BadParameter(str(exc), param_hint="'--model'" if exc.field == "roles"
                                 else f"'--{exc.field}'") from None
    obj.writer(create=True).create(session)
    obj.emit({"id": str(session.id)}, str(session.id))


@sessions.command("close")
@click.argument("session_id", type=SESSION)
@click.option("--reason", type=TEXT, default=None, help="Why it is closed (recorded).")
@click.pass_obj
def close(obj: CliContext, session_id: UUID, reason: str | None) -> None:
    """Close a session: it takes no further turns. Refused while a turn is open."""
    obj.require_session(session_id)
    writer = obj.writer()
    writer.execute(session_id, lambda s: s.close(by=operator(), reason=reason))
    obj.emit({"id": str(session_id), "closed": True}, f"closed {session_id}")


@sessions.command("purge")
@click.argument("session_id", type=SESSION)
@click.option("--reason", type=TEXT, default=None, help="Recorded with the deletion.")
@click.option("--max-age", type=click.IntRange(min=1), default=None, metavar="SECONDS",
              help="Expire the stream after SECONDS instead of deleting it now (EventStoreDB "
                   "$maxAge).")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.pass_obj
def purge(obj: CliContext, session_id: UUID, reason: str | None, max_age: int | None,
          yes: bool) -> None:
    """Delete a closed session's events (retention). The deletion is recorded."""
    obj.require_session(session_id)
    repository = SessionRepository(obj.store())
    if not repository.get(session_id).closed:
        raise RuleViolation(f"session {session_id} is not closed; close it first")
    if not yes and not obj.json_output:
        click.confirm(f"Delete every event of session {session_id}?", abort=True, err=True)
    purge_session(repository, session_id, by=operator(), reason=reason, max_age=max_age)
    if max_age is not None:
        note(f"{session_id} expires after {max_age}s on stores with native expiry "
             "(EventStoreDB); elsewhere purge again without --max-age")
    obj.emit({"id": str(session_id), "purged": max_age is None, "max_age": max_age},
             f"purged {session_id}" if max_age is None else f"retention set on {session_id}")


def register(cli: click.Group) -> None:
    cli.add_command(sessions)
