"""``terret approvals list``, ``approve``, ``deny``: verdicts from any process (the store is the
bus: a parked turn in ``terret serve`` resumes when the verdict reaches its subscription)."""

from __future__ import annotations

from uuid import UUID

import click

from terret.cli._context import SESSION, CliContext, as_json, operator, table
from terret.cli._params import TEXT


@click.group("approvals")
def approvals() -> None:
    """Pending approvals of open turns."""


@approvals.command("list")
@click.argument("session_id", type=SESSION, required=False)
@click.pass_obj
def list_approvals(obj: CliContext, session_id: UUID | None) -> None:
    """Requests without a verdict in open turns (of one session, or all), and calls in doubt
    waiting for a verdict (`terret in-doubt rerun|skip`)."""
    from terret.cli.budget import in_doubt_rows, in_doubt_table_rows

    if session_id is not None:
        obj.require_session(session_id)
    found = obj.views(reads=("approvals", "status")).pending(session_id)
    data = [{"session": p.session.removeprefix("session-"), "call_id": p.call_id,
             "tool": p.name, "args": p.args, "turn": p.turn, "waiting": "approval"}
            for p in found]
    rows = [[p.session.removeprefix("session-"), p.call_id, p.name, _cut(as_json(p.args), 60),
             "approval"] for p in found]
    doubts = in_doubt_rows(obj, session_id)
    data += doubts
    rows += in_doubt_table_rows(doubts)
    obj.emit(data, table(rows, ["SESSION", "CALL", "TOOL", "ARGS", "WAITING"]) if rows
             else "no pending approvals")


def _cut(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def pending_call(obj: CliContext, session_id: UUID, call_id: str) -> str:
    """``call_id``, or the one call pending in the session's open turn that it is a prefix of
    (as git takes a unique prefix of an object id). An exact id is taken as it is: the command
    refuses it if it is not pending."""
    pending = obj.commands().writer.load(session_id).pending_approvals()
    if call_id in pending or not call_id:
        return call_id
    matches = sorted(c for c in pending if c.startswith(call_id))
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        raise click.BadParameter(f"{call_id!r} is ambiguous: it starts the pending calls "
                                 f"{', '.join(matches)}; give more of it",
                                 param_hint="CALL_ID")
    return call_id


def _resolve(obj: CliContext, session_id: UUID, call_id: str, verdict: str,
             reason: str | None) -> None:
    obj.require_session(session_id)
    call_id = pending_call(obj, session_id, call_id)
    # Refused with ApprovalNotPending unless the call is pending in the open turn (R11).
    obj.commands().resolve(session_id, call_id, verdict, by=operator(), reason=reason)
    obj.emit({"session": str(session_id), "call_id": call_id, "verdict": verdict},
             f"{verdict} {call_id}")


@click.command("approve")
@click.argument("session_id", type=SESSION)
@click.argument("call_id", type=TEXT)
@click.option("--reason", type=TEXT, default=None, help="Recorded with the verdict.")
@click.pass_obj
def approve(obj: CliContext, session_id: UUID, call_id: str, reason: str | None) -> None:
    """Approve a parked tool call of the session's open turn."""
    _resolve(obj, session_id, call_id, "approved", reason)


@click.command("deny")
@click.argument("session_id", type=SESSION)
@click.argument("call_id", type=TEXT)
@click.option("--reason", type=TEXT, required=True, help="Shown to the model and recorded.")
@click.pass_obj
def deny(obj: CliContext, session_id: UUID, call_id: str, reason: str) -> None:
    """Deny a parked tool call; the model sees the denial as the tool's result."""
    if not reason.strip():
        raise click.BadParameter("give the model a reason", param_hint="'--reason'")
    _resolve(obj, session_id, call_id, "denied", reason)


def register(cli: click.Group) -> None:
    cli.add_command(approvals)
    cli.add_command(approve)
    cli.add_command(deny)
