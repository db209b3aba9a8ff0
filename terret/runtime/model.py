"""The model port: what the loop asks a model provider for, and what it gets back."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from terret.domain.errors import ProviderError
from terret.domain.messages import Message, ToolCall, Usage


@dataclass(frozen=True)
class ToolSpec:
    """A tool as the model is shown it: name, description, JSON schema of its arguments."""

    name: str
    description: str
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ModelRequest:
    """One chat request. ``model`` is the provider's own model id (no ``provider:`` prefix)."""

    model: str
    messages: Sequence[Message]
    tools: Sequence[ToolSpec] = ()


@dataclass(frozen=True)
class ModelReply:
    """The complete assistant message a request produced, with the usage the provider reported."""

    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    usage: Usage | None = None
    finish_reason: str | None = None


TextSink = Callable[[str], None]


def checked_reply(provider: str, reply: object) -> ModelReply:
    """``reply`` if it is a ``ModelReply`` of the declared types; ``ProviderError`` otherwise —
    a provider of your own that returned None, a dict, or a reply with ``text=None`` or calls
    as dicts, failed the turn with an ``AttributeError`` deep in the loop."""
    if not isinstance(reply, ModelReply):
        raise ProviderError(provider, f"complete() returned {type(reply).__name__}, not a "
                            "ModelReply")
    wrong = []
    if not isinstance(reply.text, str):
        wrong.append(f"its text is {type(reply.text).__name__}, not str")
    if not isinstance(reply.tool_calls, tuple | list) or not all(
            isinstance(c, ToolCall) for c in reply.tool_calls):
        wrong.append("its tool_calls are not a tuple of ToolCall")
    if reply.usage is not None and not isinstance(reply.usage, Usage):
        wrong.append(f"its usage is {type(reply.usage).__name__}, not a Usage or None")
    if wrong:
        raise ProviderError(provider, f"complete() returned a ModelReply whose {'; '.join(wrong)}"
                            .replace("whose its ", "whose "))
    return reply


@runtime_checkable
class ModelProvider(Protocol):
    """A chat model. Implementations: the scripted provider (tests, demo) and the HTTP providers.

    ``complete`` streams when it can: each text delta is passed to ``on_text`` as it arrives.
    Setting ``cancel`` asks the provider to abandon an in-flight stream (it then raises
    :class:`terret.domain.errors.ModelCancelled`); a reply that was complete when it noticed
    is returned, so that its usage is recorded.
    """

    name: str

    def complete(
        self,
        request: ModelRequest,
        *,
        on_text: TextSink | None = None,
        cancel: threading.Event | None = None,
    ) -> ModelReply: ...


@runtime_checkable
class ModelResolver(Protocol):
    """Turns a ``provider:model`` spec into the provider to call and its own model id."""

    def resolve(self, spec: str) -> tuple[ModelProvider, str]: ...


class StaticResolver:
    """Resolves specs against a fixed set of providers, by the part before the colon."""

    def __init__(self, providers: dict[str, ModelProvider] | None = None) -> None:
        self.providers: dict[str, ModelProvider] = dict(providers or {})

    def add(self, provider: ModelProvider, name: str | None = None) -> None:
        self.providers[name or provider.name] = provider

    def resolve(self, spec: str) -> tuple[ModelProvider, str]:
        from terret.domain.errors import ConfigurationError

        prefix, sep, model = spec.partition(":")
        provider = self.providers.get(prefix)
        if not sep or provider is None:
            known = ", ".join(sorted(self.providers)) or "none"
            raise ConfigurationError(f"no provider for model spec {spec!r} (known: {known})")
        return provider, model


