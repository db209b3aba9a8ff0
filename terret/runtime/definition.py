"""What an agent is (:class:`AgentDefinition`) and what a turn came to (:class:`TurnResult`):
the values an application gives the runtime and gets back from it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from uuid import UUID

from terret.domain import errors
from terret.domain.events import TurnStatus, validate_agent_name, validate_pattern
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
        """Each field checked when the definition is made (``ConfigurationError`` naming it): a
        ``revision`` of ``"2"`` was recorded as 2 and then refused on every turn, a
        ``max_steps`` of ``"3"`` failed each turn after writing its start."""
        self._check_values()
        # One string is a sequence too: it would become one pattern per character.
        if isinstance(self.allow, str | bytes):
            raise errors.ConfigurationError(
                f"agent {errors.shown(self.name)}: allow is a list of patterns, not one string "
                f"({errors.shown(self.allow)}); write allow=[{self.allow!r}]")
        # A bad name or pattern was met only when a session was created (InvalidPayload).
        checks = [("name", validate_agent_name, self.name),
                  *(("allow", validate_pattern, p) for p in self.allow)]
        for name, check, value in checks:
            try:
                check(value)
            except ValueError as exc:
                raise errors.ConfigurationError(
                    f"agent {errors.shown(self.name)}: {name}: {exc}") from None
        names = [t.name for t in self.tools]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:  # the model calls a tool by name: the last of two would silently win
            raise errors.ConfigurationError(
                f"agent {errors.shown(self.name)}: two tools are named {twice[0]!r}")

    def _check_values(self) -> None:
        what = f"agent {errors.shown(self.name)}"
        if not isinstance(self.name, str):
            raise errors.ConfigurationError(f"AgentDefinition.name is a string, not {what[6:]}")
        if type(self.revision) is not int or self.revision < 1:
            raise errors.ConfigurationError(
                f"{what}: revision is a whole number from 1, not {errors.shown(self.revision)}")
        if self.max_steps is not None and (type(self.max_steps) is not int
                                           or self.max_steps < 1):
            raise errors.ConfigurationError(
                f"{what}: max_steps is a whole number from 1 (None: the runtime's), not "
                f"{errors.shown(self.max_steps)}")
        if not isinstance(self.instructions, str):
            raise errors.ConfigurationError(
                f"{what}: instructions are a string, not {type(self.instructions).__name__}")
        if isinstance(self.tools, str | bytes) or not isinstance(self.tools, Sequence) or any(
                not isinstance(t, Tool) for t in self.tools):
            raise errors.ConfigurationError(
                f"{what}: tools is a list of tools made with @terret.tool (or terret.Tool), not "
                f"{errors.shown(self.tools)}")
        if not isinstance(self.allow, str | bytes) and (
                not isinstance(self.allow, Sequence | set | frozenset)
                or not all(isinstance(p, str) for p in self.allow)):
            # A generator would be used up by the first agent: the next would deny everything.
            raise errors.ConfigurationError(
                f"{what}: allow is a list of patterns (strings), not "
                f"{errors.shown(self.allow)}")
        if not isinstance(self.pre_step, Sequence) or not all(map(callable, self.pre_step)):
            raise errors.ConfigurationError(
                f"{what}: pre_step is a list of hooks (callables), not "
                f"{errors.shown(self.pre_step)}")


@dataclass(frozen=True)
class TurnResult:
    session_id: UUID
    turn: int
    status: TurnStatus
    text: str = ""
