"""The summarizer port (R19) and the history rendering every summarizer reads."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from terret.domain.messages import Message


@runtime_checkable
class Summarizer(Protocol):
    """Turns a session's model-visible history into a summary.

    Returns ``None`` to decline (compaction is then skipped and retried on the next overweight
    turn). May raise; the automatic compactor isolates the error, a manual ``compact`` raises it.
    """

    def summarize(self, messages: Sequence[Message]) -> str | None: ...


def render_history(messages: Sequence[Message]) -> str:
    """One role-tagged line per message part, tool calls and results included.

    Newlines inside a part are flattened so that an extractive compressor that deletes whole
    lines (Morph's Compact API) can never cut a part in half.
    """
    lines: list[str] = []
    for message in messages:
        if message.role == "tool":
            tag = "tool error" if message.is_error else "tool result"
            lines.append(
                f"[{tag} {message.tool_name or ''}#{message.tool_call_id}] {_flat(message.text)}"
            )
            continue
        if message.text:
            lines.append(f"[{message.role}] {_flat(message.text)}")
        for call in message.tool_calls:
            args = json.dumps(call.args, sort_keys=True, separators=(",", ":"))
            lines.append(f"[{message.role} tool call {call.name}#{call.id}] {args}")
    return "\n".join(lines)


def _flat(text: str) -> str:
    return " ".join(text.splitlines())


class FixedSummarizer:
    """A deterministic summarizer for tests and the demo: keeps the first ``limit`` characters
    of the rendered history. Never declines unless constructed with ``decline=True``."""

    def __init__(self, *, limit: int = 400, decline: bool = False) -> None:
        self.limit = limit
        self.decline = decline
        self.calls = 0

    def summarize(self, messages: Sequence[Message]) -> str | None:
        self.calls += 1
        if self.decline:
            return None
        rendered = render_history(messages)
        return "Summary of earlier conversation:\n" + rendered[: self.limit]
