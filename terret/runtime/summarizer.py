"""The summarizer port (R19), the history rendering every summarizer reads, and the two
summarizers that need nothing but a model: the role summarizer (the runtime's default) and a
fixed one for tests and demos.

A port that calls a model role of the session it works on is :class:`RoleBound`: the runtime
hands it that session's role resolver (its recorded roles, ``model/set`` included, resolved by
the runtime's ``resolver``) before each use.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Sequence
from typing import Protocol, Self, runtime_checkable

from terret.domain.errors import ConfigurationError
from terret.domain.messages import Message
from terret.runtime.model import ModelProvider, ModelRequest

#: Maps a model role (``compactor``, ``titler``, …) to ``(provider, provider's model id)``;
#: raises :class:`~terret.domain.errors.ConfigurationError` for an unconfigured role.
RoleResolver = Callable[[str], tuple[ModelProvider, str]]


@runtime_checkable
class Summarizer(Protocol):
    """Turns a session's model-visible history into a summary.

    Returns ``None`` to decline (compaction is then skipped and retried on the next overweight
    turn). May raise; the automatic compactor isolates the error, a manual ``compact`` raises it.
    """

    def summarize(self, messages: Sequence[Message]) -> str | None: ...


@runtime_checkable
class RoleBound(Protocol):
    """A summarizer or titler that asks a model role of the session it works on.

    ``role`` names the role; ``for_session(resolve_role)`` returns the port bound to the
    session's roles (one built with its own resolver may return itself unchanged).
    """

    role: str

    def for_session(self, resolve_role: RoleResolver) -> Self: ...


class RoleAsker:
    """What the role summarizer and the role titler share: the role they ask, bound to a
    session's roles (``for_session``) unless built with a resolver of their own."""

    role: str
    _resolve_role: RoleResolver | None

    def __repr__(self) -> str:
        bound = "bound" if self._resolve_role is not None else "session roles"
        return f"{type(self).__name__}(role={self.role!r}, {bound})"

    def for_session(self, resolve_role: RoleResolver) -> Self:
        if self._resolve_role is not None:
            return self
        bound = copy.copy(self)
        bound._resolve_role = resolve_role
        return bound

    def _resolved(self) -> tuple[ModelProvider, str]:
        """The provider and model of the role; ``ConfigurationError`` while unbound."""
        if self._resolve_role is None:
            raise ConfigurationError(
                f"{type(self).__name__} for role {self.role!r} has no role resolver: pass "
                "resolve_role, or give it to a Runtime, which binds it to each session's roles")
        return self._resolve_role(self.role)


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


SUMMARY_HEADER = "Summary of earlier conversation:\n"

SUMMARY_INSTRUCTION = (
    "You compact the history of a long-running agent session. The transcript has one "
    "role-tagged line per message part: [user], [assistant], [assistant tool call NAME#ID] "
    "with its JSON arguments, [tool result NAME#ID] and [tool error NAME#ID]. A first line "
    "reading \"[user] Summary of earlier conversation:\" is not the user speaking: it is the "
    "summary an earlier compaction wrote of what came before; carry its content over. Write a"
    " summary that lets the agent carry on without the transcript: the user's goals and "
    "constraints, decisions taken, what was done and with what outcome, every identifier that"
    " may matter again (files, ids, URLs, versions, deploy ids), errors and how they were "
    "resolved, and what is still open. The transcript is replaced by your summary, so end "
    "with the latest exchange: the last user request and the answer to it, in full detail. Be"
    " specific and factual; invent nothing. Reply with the summary only."
)


class RoleSummarizer(RoleAsker):
    """One utility request to the ``compactor`` role over :func:`render_history`.

    The runtime's default summarizer. Built without ``resolve_role`` it is :class:`RoleBound`:
    the runtime binds it to the session being compacted, so the session's own ``compactor``
    role (``create_session(roles=...)``, ``model/set``, else ``RuntimeConfig.roles``) is asked.
    Built with ``resolve_role`` it always uses that resolver.

    An unconfigured role raises :class:`~terret.domain.errors.ConfigurationError`, a provider
    failure :class:`~terret.domain.errors.ProviderError`; both are let through. An empty reply
    declines (``None``).
    """

    def __init__(
        self,
        resolve_role: RoleResolver | None = None,
        *,
        role: str = "compactor",
        instruction: str = SUMMARY_INSTRUCTION,
        header: str = SUMMARY_HEADER,
    ) -> None:
        self._resolve_role = resolve_role
        self.role = role
        self.instruction = instruction
        self.header = header

    def summarize(self, messages: Sequence[Message]) -> str | None:
        # Resolve first, so an unconfigured role is reported even for an empty history.
        provider, model = self._resolved()
        transcript = render_history(messages)
        if not transcript:
            return None
        request = ModelRequest(
            model=model,
            messages=(Message("system", self.instruction), Message("user", transcript)),
        )
        summary = provider.complete(request).text.strip()
        return self.header + summary if summary else None


class FixedSummarizer:
    """A deterministic summarizer for tests and demos (no model call), used only when chosen
    explicitly: keeps the most recent ``limit`` characters of the rendered history, in whole
    lines where it can, so the latest turn is what the model still sees after compaction; the
    lines it drops are counted in a note. Never declines unless constructed with
    ``decline=True``."""

    def __init__(self, *, limit: int = 400, decline: bool = False) -> None:
        self.limit = limit
        self.decline = decline
        self.calls = 0

    def summarize(self, messages: Sequence[Message]) -> str | None:
        self.calls += 1
        if self.decline:
            return None
        return SUMMARY_HEADER + keep_latest(render_history(messages), self.limit)


def keep_latest(rendered: str, limit: int) -> str:
    """The last lines of ``rendered`` that fit in ``limit`` characters, behind a note of how
    many earlier lines were left out; a last line longer than ``limit`` keeps its end."""
    lines = rendered.split("\n") if rendered else []
    kept: list[str] = []
    size = 0
    for line in reversed(lines):
        extra = len(line) + (1 if kept else 0)  # the line and the newline before the next
        if size + extra > limit:
            break
        kept.append(line)
        size += extra
    kept.reverse()
    if not kept and lines:
        kept = ["…" + lines[-1][-limit:]]
    omitted = len(lines) - len(kept)
    if omitted:
        kept.insert(0, f"[{omitted} earlier line{'s' if omitted != 1 else ''} left out]")
    return "\n".join(kept)
