"""The commands a step records: functions of the :class:`~terret.domain.session.Session`
that the turn loop (:mod:`terret.runtime.agent`) hands to its writer, each one append."""

from __future__ import annotations

from collections.abc import Collection

from terret.domain.events import Actor, ToolCallData, TurnStatus, UsageData
from terret.domain.session import Session
from terret.runtime.model import ModelReply
from terret.runtime.stops import TurnCancelled


def open_step(spec: str, max_steps: int, s: Session) -> int:
    if s.state.cancel_requested:  # folded in on a conflict: the cancel wins (R13)
        raise TurnCancelled("cancel requested")
    step = s.start_step(spec, max_steps=max_steps)
    s.take_inbox()
    return step


def answer(text: str, calls: list[ToolCallData], spec: str, usage: UsageData | None,
            s: Session) -> TurnStatus | None:
    """Record the reply with the model call's usage (durable with it: a cancel, a kill or a
    resume later cannot lose it); a final one ends the step and the turn in the same append (a
    crash leaves the step open, and resume asks again). A cancel recorded while the model
    answered wins here, at the step's boundary (R13): the reply and its usage are kept, its
    calls answered as not run, and the turn closes cancelled."""
    s.record_assistant(text, calls, model=spec, usage=usage)
    if s.state.cancel_requested:
        for c in calls:
            s.record_tool_result(c.id, c.name, f"{c.name} was not run: the turn was "
                                 "cancelled", is_error=True)
        s.end_step()
        end_cancelled(s)
        return "cancelled"
    if calls:
        return None
    s.end_step()
    s.end_turn("completed")
    return "completed"


def record_result(call: ToolCallData, content: str, is_error: bool, s: Session, *,
                   close_step: bool = False, resumed: bool = False) -> None:
    s.record_tool_result(call.id, call.name, content, is_error=is_error)
    if close_step:
        s.end_step(resumed=resumed)


def usage_of(reply: ModelReply) -> UsageData | None:
    if reply.usage is None:
        return None
    return UsageData(prompt_tokens=reply.usage.prompt_tokens,
                     completion_tokens=reply.usage.completion_tokens, cost=reply.usage.cost)


def end_cancelled(s: Session, unsure: Collection[str] = ()) -> None:
    """Close the turn cancelled, attributed to whoever recorded the cancel (a local cancel
    event without a recorded one is this process stopping the turn: no actor). ``unsure``:
    see ``Session.end_turn``."""
    by = Actor(**s.state.cancel_by) if s.state.cancel_by else None
    s.end_turn("cancelled", reason=s.state.cancel_reason, by=by, unsure=unsure)
