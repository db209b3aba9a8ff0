"""Tools and the tools pipeline (R8, R9).

A ``Tool`` has a pydantic arguments model (its JSON schema is what the model is shown), an
approval mode and a handler. A call runs through the pipeline: arguments are validated, the
pre-execute waterfall runs (parent context first, then each forked context: the per-agent
allow-list lives there), then the execute stage (the approvals gate, then the handler). Every
failure on the way becomes a tool-result error the model sees; none of them ends the turn.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal
from uuid import UUID

from pydantic import BaseModel, ValidationError

from terret.runtime.model import ToolSpec

ApprovalMode = Literal["never", "policy", "always"]


@dataclass(frozen=True)
class CallContext:
    """What a hook or handler knows about the call it is running."""

    session_id: UUID
    call_id: str
    name: str
    args: dict[str, Any]
    turn: int


Handler = Callable[[Any, CallContext], Any]


@dataclass(frozen=True)
class Tool:
    """A tool definition. ``approval``: ``never`` passes through, ``always`` asks, ``policy``
    asks when ``mutating`` (R8)."""

    name: str
    description: str
    args: type[BaseModel]
    handler: Handler
    approval: ApprovalMode = "never"
    mutating: bool = False

    def needs_approval(self) -> bool:
        return self.approval == "always" or (self.approval == "policy" and self.mutating)

    def spec(self) -> ToolSpec:
        return ToolSpec(self.name, self.description, self.args.model_json_schema())


def tool(
    name: str | None = None,
    *,
    args: type[BaseModel],
    description: str | None = None,
    approval: ApprovalMode = "never",
    mutating: bool = False,
) -> Callable[[Handler], Tool]:
    """Decorator: ``@tool(args=DeployArgs, approval="policy", mutating=True)`` on a handler
    ``def deploy(args: DeployArgs, ctx: CallContext) -> str``."""

    def wrap(fn: Handler) -> Tool:
        return Tool(
            name=name or fn.__name__,
            description=description or (fn.__doc__ or "").strip() or fn.__name__,
            args=args,
            handler=fn,
            approval=approval,
            mutating=mutating,
        )

    return wrap


@dataclass(frozen=True)
class Veto:
    """A pre-execute hook's refusal; surfaces to the model as a tool-result error."""

    reason: str


@dataclass(frozen=True)
class ToolOutcome:
    content: str
    is_error: bool = False


PreExecuteHook = Callable[[Tool, CallContext], Veto | None]


@dataclass
class ToolContext:
    """A node of the context tree: the runtime's root context and one fork per agent.
    ``pre_execute`` hooks run parent first (R9)."""

    parent: ToolContext | None = None
    pre_execute: list[PreExecuteHook] = field(default_factory=list)

    def fork(self) -> ToolContext:
        return ToolContext(parent=self)

    def waterfall(self) -> list[PreExecuteHook]:
        chain = self.parent.waterfall() if self.parent is not None else []
        return chain + list(self.pre_execute)


Gate = Callable[[Tool, CallContext], ToolOutcome | None]
"""The execute stage's gate: returns an outcome to stop the call (a denial), or None to run it."""


class ToolPipeline:
    def __init__(self, tools: Sequence[Tool], context: ToolContext, gate: Gate | None) -> None:
        self.tools = {t.name: t for t in tools}
        self.context = context
        self.gate = gate
        # Tools are immutable: their JSON schemas are built once, not on every model request.
        self._specs = [t.spec() for t in self.tools.values()]

    def specs(self) -> list[ToolSpec]:
        return list(self._specs)

    def run(self, ctx: CallContext) -> ToolOutcome:
        tool = self.tools.get(ctx.name)
        if tool is None:
            return ToolOutcome(f"unknown tool {ctx.name!r}", is_error=True)
        try:
            parsed = tool.args.model_validate(ctx.args)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'arguments'}: {e['msg']}"
                for e in exc.errors()
            )
            return ToolOutcome(f"invalid arguments for {tool.name}: {problems}", is_error=True)
        for hook in self.context.waterfall():
            veto = hook(tool, ctx)
            if veto is not None:
                return ToolOutcome(f"vetoed: {veto.reason}", is_error=True)
        if self.gate is not None and tool.needs_approval():
            stopped = self.gate(tool, ctx)
            if stopped is not None:
                return stopped
        try:
            result = tool.handler(parsed, ctx)
        except Exception as exc:  # a failing tool is the model's problem, not the turn's
            return ToolOutcome(f"{type(exc).__name__}: {exc}", is_error=True)
        return ToolOutcome(_content(result))


def _content(result: Any) -> str:
    if result is None:
        return ""
    if isinstance(result, str):
        return result
    if isinstance(result, BaseModel):
        return result.model_dump_json()
    try:
        return json.dumps(result)
    except (TypeError, ValueError):
        return str(result)
