"""The commands a step records: functions of the :class:`~terret.domain.session.Session`
that the turn loop (:mod:`terret.runtime.agent`) hands to its writer, each one append."""

from __future__ import annotations

import logging
import math
from collections.abc import Collection

import pydantic_core

from terret.domain.events import Actor, ToolCallData, TurnStatus, UsageData
from terret.domain.session import Session
from terret.runtime.model import ModelReply
from terret.runtime.stops import TurnCancelled
from terret.runtime.tools import storable

log = logging.getLogger("terret.runtime")


def open_step(spec: str, max_steps: int, s: Session) -> int:
    if s.state.cancel_requested:  # folded in on a conflict: the cancel wins (R13)
        raise TurnCancelled("cancel requested")
    step = s.start_step(spec, max_steps=max_steps)
    s.take_inbox()
    return step


MAX_REPLY_BYTES = 512 * 1024
"""The most a model's reply may take in its ``assistant/message`` (its text and its calls, as
stored): well under the stores' 1 MiB limit, which on EventStoreDB bounds a whole append, so
that what is appended with it fits too — the step's and the turn's ends, and on a cancel an
answer to each of its calls. A longer text is cut to fit, as a tool result is."""


def fitted_reply(text: str, calls: list[ToolCallData], *, name: str
                 ) -> tuple[str, list[ToolCallData], int | None]:
    """The reply as its ``assistant/message`` can hold it: its text cut to fit beside its
    calls; when the calls alone do not fit, none of them (and their size, to refuse the turn
    with — the reply is recorded all the same, for the usage it was billed with)."""
    calls_size = len(pydantic_core.to_json(calls)) if calls else 0
    if calls_size > MAX_REPLY_BYTES // 2:
        return storable(text, name=name, limit=MAX_REPLY_BYTES // 2, what="reply"), [], \
            calls_size
    return storable(text, name=name, limit=MAX_REPLY_BYTES - calls_size, what="reply"), \
        calls, None


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


MOST_TOKENS = 10**12
"""More tokens than any request has had: a count above it is a provider's bug (and past 2**63
it would not fit the views' integers)."""
MOST_COST = 1_000_000.0
"""More than any one model call has cost, in dollars: a cost above it is a provider's bug (one
of 1e300 made every later sum of the session's spend meaningless)."""


def usage_of(reply: ModelReply) -> UsageData | None:
    """The reply's usage as recorded, with a WARNING for a figure no request can have (a
    provider's bug): a count that is not a whole number from 0 to ``MOST_TOKENS`` makes the
    whole usage unknown (0 tokens, no cost: a cost beside a wrong count is not trusted either);
    a cost that is negative, NaN, infinite or above ``MOST_COST`` is dropped (no cost), its
    counts kept — the compaction budget reads the prompt's. The reply was paid for and is
    kept, and what the log holds is what this process counts."""
    usage = reply.usage
    if usage is None:
        return None
    prompt, completion = _count(usage.prompt_tokens), _count(usage.completion_tokens)
    cost = usage.cost if usage.cost is None or _possible_cost(usage.cost) else None
    if prompt is None or completion is None:
        recorded = UsageData(prompt_tokens=0, completion_tokens=0, cost=None)
    else:
        recorded = UsageData(prompt_tokens=prompt, completion_tokens=completion, cost=cost)
        if cost is usage.cost:
            return recorded
    log.warning("the model reported usage no request can have (prompt_tokens=%r, "
                "completion_tokens=%r, cost=%r): recorded as %s", usage.prompt_tokens,
                usage.completion_tokens, usage.cost, recorded.model_dump())
    return recorded


def _possible_cost(cost: object) -> bool:
    # The range first: an int past a float's (a JSON cost of 10**400) overflows isfinite.
    return (not isinstance(cost, bool) and isinstance(cost, int | float)
            and 0 <= cost <= MOST_COST and math.isfinite(cost))


def _count(value: object) -> int | None:
    """A token count as recorded (a whole float is one), or None for one no request has."""
    if isinstance(value, float) and value.is_integer() and abs(value) <= MOST_TOKENS:
        value = int(value)
    return value if type(value) is int and 0 <= value <= MOST_TOKENS else None


def end_cancelled(s: Session, unsure: Collection[str] = ()) -> None:
    """Close the turn cancelled, attributed to whoever recorded the cancel (a local cancel
    event without a recorded one is this process stopping the turn: no actor). ``unsure``:
    see ``Session.end_turn``."""
    by = Actor(**s.state.cancel_by) if s.state.cancel_by else None
    s.end_turn("cancelled", reason=s.state.cancel_reason, by=by, unsure=unsure)
