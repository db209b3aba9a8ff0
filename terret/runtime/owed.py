"""Whether a process may serve an open turn that owes calls (R32): its release defines each
tool the calls name, and takes the arguments a person was asked about. Asked by a spawn's take
of a session and by an agent taking its session back."""

from __future__ import annotations

from pydantic import ValidationError

from terret.domain import errors
from terret.domain.events import ToolCallData
from terret.domain.payloads import describe_validation
from terret.domain.session import Session
from terret.runtime.definition import AgentDefinition


def require_owed_tools(session: Session, definition: AgentDefinition) -> None:
    """An open turn whose calls still owed name a tool this definition lacks was written by an
    app that has it (the agent's name alone matches: the CLI's default app and an embedded
    app's both define ``default``). Served here, the call would be answered "unknown tool" —
    an approved or re-run call silently never run — so the session is refused, nothing
    written, and left to a process whose app defines the tool. So is one owing a call that a
    person was asked about (an approval, a call in doubt) with arguments this app's tool no
    longer takes (a release that changed its arguments): "invalid arguments" would drop it."""
    if not session.turn_open or session.state.cancel_requested:
        return  # a cancelled turn runs no call: its resume closes it, the calls answered
    tools = {t.name: t for t in definition.tools}
    owed = session.owed_calls()
    missing = sorted({c.name for c in owed} - tools.keys())
    if missing:
        raise errors.ConfigurationError(
            f"session {session.id}: its open turn owes a call to {', '.join(map(repr, missing))}, "
            f"a tool agent {session.state.agent!r} does not define here; it is left to a process "
            "whose app defines it (--app), or close the turn with a cancel")
    for call in owed:
        if not _run_on_a_persons_word(session, call):
            continue
        try:
            tools[call.name].args.model_validate(call.args)
        except ValidationError as exc:
            raise errors.ConfigurationError(
                f"session {session.id}: its open turn owes call {call.id} to {call.name!r}, "
                "which a person was asked about, with arguments this app's tool does not take "
                f"({describe_validation(exc, 'arguments')}); it is left to a process whose app "
                "takes them (--app), or close the turn with a cancel") from None


def _run_on_a_persons_word(session: Session, call: ToolCallData) -> bool:
    """Whether the call waits for a person's approval, or is to run on one: approved, or in
    doubt with a verdict to re-run it. (A denied or skipped call runs nothing; a call in doubt
    not yet decided is parked as it is, and decided without the app.)"""
    if call.id in session.state.pending:
        return True
    verdict = session.verdict_for(call.id, call.name, call.args)
    doubt = session.doubt_verdict_for(call.id, call.name, call.args)
    return (verdict is not None and verdict.verdict == "approved") or (
        doubt is not None and doubt.verdict == "rerun")
