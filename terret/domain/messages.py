"""Provider-neutral message objects: what the model sees, built by the messages projection."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

Role = Literal["system", "user", "assistant", "tool"]


@dataclass(frozen=True)
class ToolCall:
    """One tool call the model asked for."""

    id: str
    name: str
    args: dict[str, Any] = field(default_factory=dict)


MAX_ARGUMENT_DEPTH = 190
"""The deepest tool-call arguments accepted, in levels of JSON objects and arrays, the
arguments object itself being level 1. Deeper arguments could not be recorded, or not read back
(the JSON parser that decodes a stored event stops at 200 levels, the event's own among them),
so a reply's call holding them is malformed, whichever provider made it."""


def args_too_deep(args: Any) -> bool:
    """Whether ``args`` is nested more than :data:`MAX_ARGUMENT_DEPTH` levels deep: walked a
    level at a time, without recursion."""
    level: list[Any] = [args]
    for _ in range(MAX_ARGUMENT_DEPTH):
        level = [
            item
            for container in level
            for item in (container.values() if isinstance(container, dict) else container)
            if isinstance(item, dict | list | tuple)
        ]
        if not level:
            return False
    return True


def distinct_ids(calls: Sequence[ToolCall]) -> tuple[ToolCall, ...]:
    """The calls, each with an id of its own: one a provider gave twice in a reply (a
    provider's bug) is told apart (``-2``, ``-3``), since a result answers a call by id and the
    log refuses a reply whose calls share one."""
    out = list(calls)
    seen: set[str] = set()
    for n, call in enumerate(out):
        if call.id in seen:
            suffix = 2
            while f"{call.id}-{suffix}" in seen:
                suffix += 1
            out[n] = ToolCall(id=f"{call.id}-{suffix}", name=call.name, args=call.args)
        seen.add(out[n].id)
    return tuple(out)


@dataclass(frozen=True)
class Usage:
    """Token usage (and cost, when the provider reports it) of one model request."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float | None = None


@dataclass(frozen=True)
class Message:
    """One message of a conversation, independent of any provider's wire format.

    ``role == "tool"`` carries a tool result: ``tool_call_id`` names the call it answers.
    """

    role: Role
    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    tool_name: str | None = None
    is_error: bool = False
