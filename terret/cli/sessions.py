"""``terret sessions …``: list, show, new, close, purge."""

from __future__ import annotations

import dataclasses
import sys
import time
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple
from uuid import UUID

import click

from terret.cli._context import MODEL_SPEC, SESSION, WHEN, CliContext, note, operator
from terret.cli._format import (
    actor_text,
    ago,
    as_json,
    money,
    parked_json,
    plural,
    table,
    when,
)
from terret.cli._params import (
    AGENT_NAME,
    SEARCH_TEXT,
    TEXT,
    Choice,
    IntRange,
    checked_first,
    recordable_reason,
)
from terret.domain.money import cost_figure

if TYPE_CHECKING:  # the projections are loaded when a command reads the views
    from terret.projections.approvals import PendingApproval
    from terret.projections.sessions import SessionSummary
    from terret.projections.status import SessionStatus
    from terret.projections.usage import UsageTotals

STATUSES = ("idle", "running", "waiting_approval", "waiting_in_doubt", "waiting_budget",
            "closed")
LIST_READS = ("sessions", "status", "title", "usage")
SHOW_READS = (*LIST_READS, "approvals", "policy", "models")


@click.group("sessions")
def sessions() -> None:
    """List, inspect, create, close and purge sessions."""


@sessions.command("list")
@click.option("--status", type=Choice(STATUSES), help="Only sessions in this state.")
@click.option("--agent", type=AGENT_NAME, default=None, help="Only sessions of this agent.")
@click.option("--title", "title_part", type=SEARCH_TEXT, default=None, metavar="TEXT",
              help="Only sessions whose title holds TEXT (any case).")
@click.option("--since", type=WHEN, default=None,
              help="Only sessions active since WHEN: a date (2026-12-01, 2026-12-01T09:30) "
                   "or a duration back from now (30s, 15m, 2h, 3d, 1w).")
@click.option("--until", type=WHEN, default=None, help="Only sessions last active by WHEN.")
@click.option("--limit", type=IntRange(min=1), default=None, help="At most N sessions.")
@click.option("--offset", type=IntRange(min=0), default=0, show_default=True,
              help="Leave out the first N (paging, with --limit).")
@click.pass_obj
def list_sessions(obj: CliContext, status: str | None, agent: str | None,
                  title_part: str | None, since: float | None, until: float | None,
                  limit: int | None, offset: int) -> None:
    """List sessions, most recently active first."""
    from terret.cli._owners import owner_cell

    views = obj.views(reads=LIST_READS)
    found = views.sessions(status=status, limit=None if limit is None else limit + 1,
                           agent=agent, title=title_part, since=since, until=until,
                           offset=offset)
    more = limit is not None and len(found) > limit
    found = found[:limit]
    live = None
    if any(_owner_of(s) for s in found):  # the worker registry: only when someone owns one
        from terret.cli._owners import Liveness

        live = Liveness(obj.store())
    owners = [live.owner(_owner_of(s)) if live is not None else None for s in found]
    if more:
        note(f"showing {offset + 1}–{offset + len(found)}; more with --offset "
             f"{offset + len(found)}")
    if obj.json_output:  # build only the output asked for: this is the 10,000-row command
        obj.emit([{**s.as_dict(), "owner": o} for s, o in zip(found, owners, strict=True)])
        return
    now = time.time()
    rows = [[s.id, s.status, _turn_cell(s.last_turn), owner_cell(o), str(s.events),
             money(s.spent), ago(s.last_activity, now), (s.title or "")[:40]]
            for s, o in zip(found, owners, strict=True)]
    obj.emit(None, table(rows, ["ID", "STATUS", "LAST TURN", "OWNER", "EVENTS", "COST",
                                "ACTIVE", "TITLE"])
             if rows else "no sessions")


def _owner_of(summary: SessionSummary) -> dict[str, Any] | None:
    """The owner its log names, none for a closed session: it runs nothing more, and its owner
    lets it go when the close reaches it (``agent/detached``, reason ``session closed``)."""
    return None if summary.closed else summary.owner


def _turn_cell(last: dict[str, Any] | None) -> str:
    if last is None:
        return "-"
    by = last.get("by")
    return f"{last['turn']} {last['status']}" + (f" by {by['actor']}" if by else "")


def last_turn_text(last: dict[str, Any] | None, now: float | None = None) -> str:
    """``2 cancelled 3 h ago by operator (alice): change freeze``."""
    if last is None:
        return "none ended yet"
    text = f"{last['turn']} {last['status']} {ago(last.get('ended'), now)}"
    if last.get("by"):
        text += f" by {actor_text(last['by'])}"
    if last.get("reason"):
        text += f": {last['reason']}"
    return text


@sessions.command("show")
@click.argument("session_id", type=SESSION)
@click.pass_obj
def show(obj: CliContext, session_id: UUID) -> None:
    """Title, status, how its last turn ended, owner, open turn, pending approvals, usage and
    policy of one session."""
    from terret.cli._owners import Liveness
    from terret.domain.errors import ViewsBehind
    from terret.domain.store import session_stream
    from terret.projections.status import status_of

    obj.require_session(session_id)
    views = obj.views(reads=SHOW_READS, session=session_id)
    summary = views.summary(session_id)
    status = views.status(session_id)
    state = views.state(session_id)
    if status is None or state is None:
        # The status view has not reached the session (it halted on an earlier event): the
        # log's own fold says the same, and the stale warning says why the views are behind.
        state = obj.session_state(session_id)
        status = status_of(session_stream(session_id), state)
        if summary is not None:  # its status and owner joined from that view: the fold's
            owner = state.owner.to_dict() if state.owner is not None else None
            summary = dataclasses.replace(summary, status=status.status, owner=owner)
    if summary is None:
        raise ViewsBehind(f"session {session_id} is in the log, but the sessions view has not "
                          "reached it" + (f" ({obj.stale.line().split(': ', 1)[1]})"
                                          if obj.stale is not None else ""))
    shown = _Shown(summary, status, state, views.pending(session_id), views.policy(session_id),
                   Liveness(obj.store()).owner(_owner_of(summary)))
    data = _show_data(shown, views.roles(session_id), views.usage_by_model(session_id),
                      views.upkeep_usage(session_id))
    now = time.time()
    lines = [*_head_lines(shown, now), *_activity_lines(shown, data, now),
             *_waiting_lines(shown), *_budget_lines(shown), *_turn_lines(shown, data)]
    obj.emit(data, "\n".join(lines))


class _Shown(NamedTuple):
    """What ``sessions show`` read of one session."""

    summary: SessionSummary
    status: SessionStatus
    state: Any
    pending: list[PendingApproval]
    policy: list[str] | None
    owner: dict[str, Any] | None


def _show_data(s: _Shown, roles: dict[str, str], usage_by_model: dict[str, UsageTotals],
               upkeep: dict[str, UsageTotals]) -> dict[str, Any]:
    """The session as ``sessions show --json`` prints it."""
    status = s.status
    return {
        **s.summary.as_dict(),
        "agent_revision": s.state.agent_revision,
        "owner": s.owner,
        "open_turn": status.turn if status.turn_open else None,
        "step": status.step, "step_open": status.step_open,
        "owed_calls": status.owed, "cancel_requested": status.cancel_requested,
        "cancel": ({"by": s.state.cancel_by, "reason": s.state.cancel_reason}
                   if status.cancel_requested else None),
        "inbox": status.inbox, "resumable": _resumable(s),
        "pending_approvals": [{"call_id": p.call_id, "tool": p.name, "args": p.args}
                              for p in s.pending],
        "policy": s.policy, "models": roles,
        "usage_by_model": {k: v.as_dict() for k, v in usage_by_model.items()},
        "upkeep_usage": {k: v.as_dict() for k, v in upkeep.items()},
        "in_doubt_calls": [{"call_id": c["id"], "tool": c["name"], "args": c["args"]}
                           for c in status.in_doubt],
        "budget": {"limit": status.budget, "spent": cost_figure(status.cost),
                   "parked": parked_json(status.budget_wait)},
    }


def _live_owner(s: _Shown) -> bool:
    return s.owner is not None and s.owner.get("lease") == "live"


def _resumable(s: _Shown) -> bool:
    """Whether a process may resume the open turn (``terret resume``, ``serve`` at start): not
    while a worker with a live lease owns the session — it runs the turn, and a resume
    elsewhere is refused with ``SessionOwned``."""
    return s.status.resumable and not s.status.closed and not _live_owner(s)


def _head_lines(s: _Shown, now: float) -> list[str]:
    """Which session, its status, and how its last turn ended."""
    summary, status, last = s.summary, s.status, s.summary.last_turn
    lines = [
        f"session   {summary.id}",
        f"title     {summary.title or '(untitled)'}",
        f"agent     {summary.agent} (revision {s.state.agent_revision})",
        f"status    {summary.status}"
        + (f" (turn {status.turn}, step {status.step}{' open' if status.step_open else ''})"
           if status.turn_open else "")
        # The log says the turn runs; no live worker does (its process died or left it).
        + (" — no live worker runs it" if summary.status == "running" and _resumable(s)
           else ""),
        f"last turn {last_turn_text(last, now)}",
    ]
    if last is not None and last.get("error"):
        first, *rest = str(last["error"]).splitlines() or [""]
        lines.append(f"error     {first}")
        lines.extend(f"          {line}" for line in rest)
    return lines


def _activity_lines(s: _Shown, data: dict[str, Any], now: float) -> list[str]:
    """Its owner, events, policy, models and usage."""
    from terret.cli._owners import owner_text

    summary = s.summary
    lines = [
        f"owner     {owner_text(s.owner, now)}",
        f"events    {summary.events}   created {when(summary.created)} "
        f"({ago(summary.created, now)})   last activity {when(summary.last_activity)} "
        f"({ago(summary.last_activity, now)})",
        f"policy    {policy_text(s.policy)}",
        f"models    {models_text(data['models'])}",
        f"usage     {usage_text(summary.usage.as_dict())}",
    ]
    for model_spec, used in sorted(data["usage_by_model"].items()):
        lines.append(f"  {model_spec}: {usage_text(used)}")
    for purpose, used in sorted(data["upkeep_usage"].items()):
        lines.append(f"upkeep    {purpose}: {usage_text(used, 'call')}")
    return lines


def _waiting_lines(s: _Shown) -> list[str]:
    """What the open turn waits on: owed calls, queued input, approvals, calls in doubt."""
    status = s.status
    lines: list[str] = []
    for call in status.owed:
        lines.append(f"owed      {call['id']}: {call['name']} {as_json(call['args'])}")
    if status.inbox:
        lines.append(f"inbox     {status.inbox} never taken (the session is closed)"
                     if status.closed else f"inbox     {status.inbox} queued")
    waits = ("cancel requested: closing the turn denies it" if status.cancel_requested
             else "pending")
    for p in s.pending:
        lines.append(f"approval  {p.call_id}: {p.name} {as_json(p.args)}  ({waits})")
    for c in status.in_doubt:
        lines.append(f"in doubt  {c['id']}: {c['name']} {as_json(c['args'])}  (started, no "
                     f"result: `terret in-doubt rerun|skip {s.summary.id} {c['id']}`)")
    return lines


def _budget_lines(s: _Shown) -> list[str]:
    status = s.status
    lines = ["budget    " + (f"{money(status.budget)} (its own)" if status.budget is not None
                             else "the deployment's default") + f", spent {money(status.cost)}"]
    if status.budget_wait is not None:
        wait = status.budget_wait
        lines.append(f"parked    on its budget: spent {money(wait['spent'])} of "
                     f"{money(wait['limit'])} (`terret budget set {s.summary.id} AMOUNT`)")
    return lines


def _turn_lines(s: _Shown, data: dict[str, Any]) -> list[str]:
    """A cancel requested, and whether the open turn can be resumed."""
    lines: list[str] = []
    if s.status.cancel_requested:
        by = actor_text(s.state.cancel_by)
        lines.append("cancel    requested" + (f" by {by}" if by else "")
                     + (f": {s.state.cancel_reason}" if s.state.cancel_reason else ""))
    if s.status.resumable and not s.status.closed and _live_owner(s):
        assert s.owner is not None
        lines.append(f"resumable no: worker {s.owner.get('worker')} (live) runs the turn; "
                     "`terret resume` elsewhere is refused")
    elif data["resumable"] and s.state.waits_on_a_person():
        lines.append("resumable yes, once decided: it waits on a verdict (above), and `terret "
                     "serve` takes it when one is recorded (`terret resume "
                     f"{s.summary.id}` waits for it here)")
    elif data["resumable"]:
        lines.append(f"resumable yes (`terret resume {s.summary.id}`, or `terret serve`)")
    return lines


def models_text(roles: dict[str, str]) -> str:
    """The model roles the session recorded (``session/started``, ``model/set``); the roles it
    did not record are the serving app's (its ``RuntimeConfig.roles``)."""
    if not roles:
        return "(none recorded: the serving app's defaults apply)"
    text = ", ".join(f"{k}={v}" for k, v in sorted(roles.items()))
    if "main" not in roles:
        text += " (main and any other role: the serving app's defaults)"
    return text


def policy_text(policy: list[str] | None) -> str:
    if policy is None:
        return "none recorded (agent floor)"
    return ", ".join(policy) if policy else "(deny all)"


def usage_text(used: dict[str, Any], unit: str = "step") -> str:
    """``300 prompt + 30 completion tokens, $0.750000, 2 steps``."""
    return (f"{used['prompt_tokens']} prompt + {used['completion_tokens']} completion tokens, "
            f"{money(used['cost'])}, {plural(used['steps'], unit)}")


@sessions.command("new")
@click.option("--agent", type=AGENT_NAME, default="default", show_default=True,
              help="Agent definition name.")
@click.option("--model", "main_model", type=MODEL_SPEC, default=None, metavar="SPEC",
              help="Model spec of the main role, e.g. openrouter:openai/gpt-4o.")
@click.pass_obj
def new(obj: CliContext, agent: str, main_model: str | None) -> None:
    """Create a session and print its id."""
    from terret.domain.errors import InvalidPayload

    roles = {"main": main_model} if main_model is not None else {}
    try:
        session_id = obj.commands(create=True).create(agent=agent, roles=roles)
    except InvalidPayload as exc:
        raise click.BadParameter(str(exc), param_hint="'--model'" if exc.field == "roles"
                                 else f"'--{exc.field}'") from None
    obj.emit({"id": str(session_id)}, str(session_id))


@checked_first(recordable_reason("SessionClosed"))
@sessions.command("close")
@click.argument("session_id", type=SESSION)
@click.option("--reason", type=TEXT, default=None, help="Why it is closed (recorded).")
@click.pass_obj
def close(obj: CliContext, session_id: UUID, reason: str | None) -> None:
    """Close a session: it takes no further turns. Refused while a turn is open."""
    obj.require_session(session_id)
    obj.commands().close(session_id, by=operator(), reason=reason)
    obj.emit({"id": str(session_id), "closed": True}, f"closed {session_id}")


@checked_first(recordable_reason("SessionPurged"))
@sessions.command("purge")
@click.argument("session_id", type=SESSION)
@click.option("--reason", type=TEXT, default=None, help="Recorded with the deletion.")
@click.option("--max-age", type=IntRange(min=1), default=None, metavar="SECONDS",
              help="Expire the stream after SECONDS instead of deleting it now (EventStoreDB "
                   "$maxAge).")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.pass_obj
def purge(obj: CliContext, session_id: UUID, reason: str | None, max_age: int | None,
          yes: bool) -> None:
    """Delete a closed session's events (retention). The deletion is recorded."""
    obj.require_session(session_id, expiring=True)  # one expiring part way is deleted now
    commands = obj.commands()
    _refuse_before_asking(obj, session_id, max_age)
    if not yes and not obj.json_output:
        try:
            click.confirm(f"Delete every event of session {session_id}?" if max_age is None
                          else f"Let the events of session {session_id} expire after "
                          f"{max_age}s (the views forget it now)?", abort=True, err=True)
        except click.Abort:
            if not sys.stdin.isatty():  # an answer read from a pipe is not echoed: the
                click.echo(err=True)    # question's line is ended before the error's
            raise
    commands.purge(session_id, by=operator(), reason=reason, max_age=max_age)
    if max_age is not None:
        # Only a store that expires streams itself gets here (SQLite refused the expiry).
        note(f"{session_id} expires after {max_age}s: the server drops its events then; the "
             "views have forgotten it already")
    obj.emit({"id": str(session_id), "purged": max_age is None, "max_age": max_age},
             f"purged {session_id}" if max_age is None else f"retention set on {session_id}")


def _refuse_before_asking(obj: CliContext, session_id: UUID, max_age: int | None) -> None:
    """What the purge would refuse (``terret.runtime.retention``), refused before the question
    is asked: a session not closed, an expiry on a store that does not expire streams itself
    (``EventStore.native_expiry``: SQLite's does not). (A reason it cannot record is refused
    before the session is even looked up: ``checked_first``.)"""
    from terret.runtime.retention import refuse_purge

    refuse_purge(partial(obj.commands().writer.load, session_id), obj.store(), max_age)


def register(cli: click.Group) -> None:
    cli.add_command(sessions)
