"""``terret approvals list``, ``approve``, ``deny``: verdicts from any process (the store is the
bus: a parked turn in ``terret serve`` resumes when the verdict reaches its subscription)."""

from __future__ import annotations

from uuid import UUID

import click

from terret._text import cut
from terret.cli._context import SESSION, CliContext
from terret.cli._format import as_json, table
from terret.cli._verdicts import approvals as approvals_verdicts


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
    views = obj.views(reads=("approvals", "status"), session=session_id)
    found = views.pending(session_id)
    # A request whose turn's cancel is recorded waits on nothing: closing the turn denies it,
    # and a verdict is refused.
    cancelling = {session for session in {p.session for p in found}
                  if (status := views.status(session)) is not None and status.cancel_requested}
    waits = ["cancel" if p.session in cancelling else "approval" for p in found]
    data = [{"session": p.session.removeprefix("session-"), "call_id": p.call_id,
             "tool": p.name, "args": p.args, "turn": p.turn, "waiting": waiting}
            for p, waiting in zip(found, waits, strict=True)]
    rows = [[p.session.removeprefix("session-"), p.call_id, p.name, cut(as_json(p.args), 60),
             waiting] for p, waiting in zip(found, waits, strict=True)]
    doubts = in_doubt_rows(obj, session_id)
    data += doubts
    rows += in_doubt_table_rows(doubts)
    obj.emit(data, table(rows, ["SESSION", "CALL", "TOOL", "ARGS", "WAITING"]) if rows
             else "no pending approvals")




_VERDICTS = approvals_verdicts()

approve = _VERDICTS.command(
    "approve", "approved", "Approve a parked tool call of the session's open turn.",
    module=__name__, reason_required=False, reason_help="Recorded with the verdict.")

deny = _VERDICTS.command(
    "deny", "denied", "Deny a parked tool call; the model sees the denial as the tool's result.",
    module=__name__, reason_required=True, reason_help="Shown to the model and recorded.")


def register(cli: click.Group) -> None:
    cli.add_command(approvals)
    cli.add_command(approve)
    cli.add_command(deny)
