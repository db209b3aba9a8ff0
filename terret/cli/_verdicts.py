"""Verdicts on a waiting tool call — ``approve``/``deny`` (an approval) and ``in-doubt
rerun``/``skip`` (a call in doubt) — built once: the same arguments, the same unique-prefix
call ids (as git takes a unique prefix of an object id), the same output. The domain refuses a
verdict on a call that is not waiting (``ApprovalNotPending``, ``CallNotInDoubt``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from uuid import UUID

import click

from terret.cli._context import SESSION, CliContext, note, operator
from terret.cli._format import as_json
from terret.cli._params import JSON_OBJECT, TEXT, checked_first, recordable_reason
from terret.domain.errors import shown

if TYPE_CHECKING:
    from terret.domain.session import Session


def call_by_prefix(call_id: str, waiting: list[str]) -> str:
    """``call_id``, or the one waiting call it is a prefix of. An exact id, or one that starts
    no waiting call, is taken as it is: the command then refuses it if it is not waiting."""
    if call_id in waiting or not call_id:
        return call_id
    matches = sorted(c for c in waiting if c.startswith(call_id))
    if len(matches) > 1:
        raise click.BadParameter(f"{shown(call_id)} is ambiguous: it starts the waiting calls "
                                 f"{', '.join(matches)}; give more of it",
                                 param_hint="'CALL_ID'")
    return matches[0] if matches else call_id


Record = Callable[[CliContext, UUID, str, str, "str | None", str, "dict[str, Any]"], None]
"""Appends a verdict: ``(obj, session, call_id, verdict, reason, tool, args)``, refused unless
the call waits for that tool and those arguments."""


@dataclass(frozen=True)
class Verdicts:
    """A pair of verdicts on the calls ``waiting`` in a session's open turn: ``yes`` (its
    reason optional) and ``no`` (its reason required: the model is shown it)."""

    waiting: Callable[[Session], dict[str, object]]
    record: Record
    after: Callable[[Session, str, str], None] = lambda session, verdict, tool: None
    """Told what was recorded (the session as read before it, the verdict, the tool)."""
    event: str = "ApprovalResolved"
    """The payload class a verdict is recorded as (its reason checked as that event's)."""

    def decide(self, obj: CliContext, session_id: UUID, call_id: str, verdict: str,
               reason: str | None, tool: str | None, args: dict[str, Any] | None) -> None:
        obj.require_session(session_id)
        session = obj.commands().writer.load(session_id)
        waiting = self.waiting(session)
        call_id = call_by_prefix(call_id, list(waiting))
        call = waiting.get(call_id)
        # Bound to a request: the one named (--tool, --args: what the operator decided on),
        # else the one waiting now — so what is printed is what was decided, even when a
        # model asked again under the same id since it was listed.
        tool = tool if tool is not None else getattr(call, "name", None)
        if args is None and tool == getattr(call, "name", None):
            args = getattr(call, "args", None)
        self.record(obj, session_id, call_id, verdict, reason, tool or "", args or {})
        self.after(session, verdict, tool or "")
        obj.emit({"session": str(session_id), "call_id": call_id, "verdict": verdict,
                  "tool": tool, "args": args},
                 f"{verdict} {call_id}: {tool} {as_json(args or {})}")

    def command(self, name: str, verdict: str, doc: str, *, module: str, reason_required: bool,
                reason_help: str) -> click.Command:
        """The command ``name`` recording ``verdict``, ``doc`` its help; ``module`` is the one
        that registers it (``terret.cli.COMMANDS``)."""
        decide = self.decide

        @click.argument("session_id", type=SESSION)
        @click.argument("call_id", type=TEXT)
        # No default when required: click takes an explicit one as given.
        @click.option("--reason", type=TEXT, required=reason_required, help=reason_help)
        @click.option("--tool", type=TEXT, default=None, metavar="NAME",
                      help="Only if the call waits for this tool (as listed).")
        @click.option("--args", "args", type=JSON_OBJECT, default=None, metavar="JSON",
                      help="Only if the call waits with these arguments (a JSON object, as "
                           "listed); needs --tool.")
        @click.pass_obj
        def run(obj: CliContext, session_id: UUID, call_id: str, reason: str | None,
                tool: str | None, args: dict[str, Any] | None) -> None:
            decide(obj, session_id, call_id, verdict, reason, tool, args)

        def check(values: dict[str, Any]) -> None:
            if reason_required and not (values.get("reason") or "").strip():
                raise click.BadParameter("give the model a reason", param_hint="'--reason'")
            if values.get("args") is not None and values.get("tool") is None:
                raise click.BadParameter("--args needs --tool", param_hint="'--args'")

        run.__doc__, run.__module__ = doc, module
        return checked_first(check, recordable_reason(self.event))(
            click.command(name)(run))


def approvals() -> Verdicts:
    def record(obj: CliContext, sid: UUID, call_id: str, verdict: str, reason: str | None,
               tool: str, args: dict[str, Any]) -> None:
        # Refused with ApprovalNotPending unless the call is pending in the open turn (R11),
        # for that tool and those arguments.
        obj.commands().resolve(sid, call_id, verdict, by=operator(), reason=reason,
                               name=tool, args=args)

    return Verdicts(lambda s: dict(s.pending_approvals()), record, _vetoed_when_run)


def _vetoed_when_run(session: Session, verdict: str, tool: str) -> None:
    """An approval the session's policy will veto (R9: an approved call goes through the
    allow-list again — a policy set while it waited applies): said, or the operator reads
    "approved" and the call never runs. A session with no policy of its own has its app's
    floor, which this command does not know: nothing is said then."""
    import fnmatch

    patterns = session.state.policy
    if verdict != "approved" or patterns is None:
        return
    if not any(fnmatch.fnmatchcase(tool, p) for p in patterns):
        note(f"note: the session's policy does not allow {tool}: the call will be vetoed when "
             f"it runs (`terret policy show {session.id}`)")


def in_doubt() -> Verdicts:
    def record(obj: CliContext, sid: UUID, call_id: str, verdict: str, reason: str | None,
               tool: str, args: dict[str, Any]) -> None:
        # Refused with CallNotInDoubt unless the call is in doubt in the open turn, for that
        # tool and those arguments.
        obj.commands().resolve_in_doubt(sid, call_id, verdict, by=operator(), reason=reason,
                                        name=tool, args=args)

    return Verdicts(lambda s: dict(s.in_doubt()), record, event="InDoubtResolved")
