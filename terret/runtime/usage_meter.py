"""Metering the model calls an upkeep makes (R21, R31): the summarizer's and the titler's
utility requests are paid for like a step's, so their usage is recorded too
(``usage/recorded``), with the summary or title they produced when there is one.

The upkeep binds a :class:`~terret.runtime.summarizer.RoleBound` summarizer or titler to the
session's roles through providers that report each reply's usage to a :class:`UsageMeter`; a
port with a resolver of its own, or one that calls no model role (Morph's Compact API, the
fixed summarizer), is not metered.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from terret.domain.events import UpkeepPurpose, UsageData
from terret.domain.session import Session
from terret.runtime.model import (
    ModelProvider,
    ModelReply,
    ModelRequest,
    TextSink,
    checked_reply,
)
from terret.runtime.step_commands import usage_of


@dataclass(frozen=True)
class MeteredCall:
    """One model call's reported usage and the ``provider:model`` spec it asked."""

    model: str
    usage: UsageData


class UsageMeter:
    """Collects the usage of the replies of the providers it hands out, in order."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: list[MeteredCall] = []

    @property
    def calls(self) -> tuple[MeteredCall, ...]:
        with self._lock:
            return tuple(self._calls)

    def metered(self, provider: ModelProvider, spec: str) -> ModelProvider:
        """``provider``, reporting each reply's usage here under ``spec``."""
        return _MeteredProvider(provider, spec, self)

    def add(self, spec: str, reply: ModelReply) -> None:
        usage = usage_of(reply)
        if usage is None:
            return  # the provider reported none: nothing to count
        with self._lock:
            self._calls.append(MeteredCall(spec, usage))

    def record_on(self, purpose: UpkeepPurpose) -> Callable[[Session], None]:
        """A session command recording the calls metered so far, one ``usage/recorded`` each."""
        calls = self.calls

        def record(session: Session) -> None:
            for call in calls:
                session.record_usage(purpose, call.model, call.usage)

        return record


class _MeteredProvider:
    """A provider whose replies are metered; anything else is the wrapped provider's."""

    def __init__(self, provider: ModelProvider, spec: str, meter: UsageMeter) -> None:
        self._provider = provider
        self._spec = spec
        self._meter = meter
        self.name = provider.name

    def complete(self, request: ModelRequest, *, on_text: TextSink | None = None,
                 cancel: threading.Event | None = None) -> ModelReply:
        reply = checked_reply(self.name, self._provider.complete(request, on_text=on_text,
                                                                 cancel=cancel))
        self._meter.add(self._spec, reply)
        return reply

    def __getattr__(self, name: str) -> Any:
        return getattr(self._provider, name)

    def __repr__(self) -> str:
        return f"metered({self._provider!r})"
