"""A deterministic model provider: scripted replies, tool calls and usage; it can raise on cue
and block until released. Tests and the demo run on it, and users can use it in their own tests.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from terret.domain.errors import ConfigurationError, ModelCancelled, ProviderError
from terret.domain.messages import ToolCall, Usage
from terret.runtime.model import ModelReply, ModelRequest, TextSink


@dataclass
class Reply:
    """One scripted reply. ``raises`` makes the request fail instead; ``gate`` (a
    ``threading.Event``) makes it block until the test sets it."""

    text: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    usage: Usage | None = None
    raises: BaseException | None = None
    gate: threading.Event | None = None


def call(name: str, args: dict[str, Any] | None = None, id: str | None = None) -> ToolCall:
    """A scripted tool call; ids default to ``call-<n>`` in script order."""
    return ToolCall(id=id or "", name=name, args=dict(args or {}))


class ScriptedProvider:
    """Replies in order; when the script runs out it answers ``default`` (or raises if None).

    ``requests`` keeps every request received (the latest ``keep``, when given), so tests can
    check what the model was shown.
    """

    def __init__(
        self,
        replies: Iterable[Reply] = (),
        *,
        name: str = "scripted",
        default: Reply | Callable[[ModelRequest], Reply] | None = None,
        chunk: int = 8,
        keep: int | None = None,
    ) -> None:
        if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int)
                                 or keep < 0):
            raise ConfigurationError(f"keep is a whole number from 0, or None, not {keep!r}")
        self.name = name
        self._keep = keep
        self._replies: deque[Reply] = deque(_replies(replies))
        if default is not None and not callable(default):
            _replies([default])
        self._default = default
        self._lock = threading.Lock()
        self._counter = 0
        self._chunk = chunk
        self.requests: list[ModelRequest] = []

    def script(self, *replies: Reply) -> None:
        checked = _replies(replies)
        with self._lock:
            self._replies.extend(checked)

    @property
    def remaining(self) -> int:
        with self._lock:
            return len(self._replies)

    def complete(
        self,
        request: ModelRequest,
        *,
        on_text: TextSink | None = None,
        cancel: threading.Event | None = None,
    ) -> ModelReply:
        reply, calls = self._next(request)
        if reply.gate is not None:
            while not reply.gate.wait(0.05):
                if cancel is not None and cancel.is_set():
                    raise ModelCancelled(f"{self.name}: request cancelled")
        if reply.raises is not None:
            raise reply.raises
        if on_text is not None:
            self._stream(reply.text, on_text, cancel)
        return ModelReply(text=reply.text, tool_calls=tuple(calls), usage=reply.usage,
                          finish_reason="tool_calls" if calls else "stop")

    def _next(self, request: ModelRequest) -> tuple[Reply, list[ToolCall]]:
        """The scripted reply to ``request`` and its calls, ids given where the script has
        none."""
        with self._lock:
            self.requests.append(request)
            if self._keep is not None and len(self.requests) > self._keep:
                # Each request holds its whole context: a server kept them all, for weeks.
                del self.requests[:len(self.requests) - self._keep]
            reply = self._replies.popleft() if self._replies else None
        if reply is None:
            # Outside the lock: a default that takes its time (a model thinking) holds up
            # no other session's request, as a server's would not.
            if callable(self._default):
                reply = self._default(request)
            elif self._default is not None:
                reply = self._default
            else:
                raise ProviderError(self.name, "the script has no reply left")
        calls = []
        with self._lock:
            for c in reply.tool_calls:
                self._counter += 1
                calls.append(ToolCall(id=c.id or f"call-{self._counter}", name=c.name,
                                      args=c.args))
        return reply, calls

    def _stream(self, text: str, on_text: TextSink, cancel: threading.Event | None) -> None:
        for i in range(0, len(text), self._chunk):
            if cancel is not None and cancel.is_set():
                raise ModelCancelled(f"{self.name}: request cancelled")
            on_text(text[i : i + self._chunk])


def _replies(replies: Iterable[object]) -> list[Reply]:
    """The replies of a script, each a :class:`Reply`: a ``TypeError`` when the script is
    written, not an ``AttributeError`` deep in the turn that reaches it."""
    checked: list[Reply] = []
    for reply in replies:
        if not isinstance(reply, Reply):
            raise TypeError(f"a scripted reply is a terret.Reply (e.g. Reply(text=...)), "
                            f"not {type(reply).__name__}: {reply!r:.80}")
        checked.append(reply)
    return checked
