"""What an agent is (:class:`AgentDefinition`) and what a turn came to (:class:`TurnResult`):
the values an application gives the runtime and gets back from it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from uuid import UUID

from terret.domain import errors
from terret.domain.events import TurnStatus
from terret.runtime.hooks import PreStepHook
from terret.runtime.tools import Tool


@dataclass(frozen=True)
class AgentDefinition:
    """What an agent is: instructions, tools, the allow-list floor (R23: deny by default — a
    tool runs only if a pattern allows it), the step cap (R2)."""

    name: str = "default"
    revision: int = 1
    instructions: str = ""
    tools: Sequence[Tool] = ()
    allow: Sequence[str] = ()
    max_steps: int | None = None
    """The step cap of this agent's turns; None takes ``RuntimeConfig.max_steps``."""
    pre_step: Sequence[PreStepHook] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        # One string is a sequence too: it would become one pattern per character.
        if isinstance(self.allow, str | bytes):
            raise errors.ConfigurationError(
                f"agent {errors.shown(self.name)}: allow is a list of patterns, not one string "
                f"({errors.shown(self.allow)}); write allow=[{self.allow!r}]")
        names = [t.name for t in self.tools]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:  # the model calls a tool by name: the last of two would silently win
            raise errors.ConfigurationError(
                f"agent {errors.shown(self.name)}: two tools are named {twice[0]!r}")


@dataclass(frozen=True)
class TurnResult:
    session_id: UUID
    turn: int
    status: TurnStatus
    text: str = ""
