"""The runtime: turns and steps, tools, durable approvals, resume, compaction, titles, cost,
allow-list, wake-on-stimulus and the agent registry.

Names are imported on first use (PEP 562): importing the package costs nothing."""

from __future__ import annotations

from typing import TYPE_CHECKING

from terret._lazy import lazy_exports

if TYPE_CHECKING:
    from terret.runtime.agent import Agent
    from terret.runtime.allowlist import AllowList
    from terret.runtime.approvals import ApprovalGate, TurnCancelled
    from terret.runtime.config import RuntimeConfig
    from terret.runtime.definition import AgentDefinition, TurnResult
    from terret.runtime.hooks import BudgetGuard, PreStepHook, Refusal, StepClaim
    from terret.runtime.model import (
        ModelProvider,
        ModelReply,
        ModelRequest,
        ModelResolver,
        StaticResolver,
        ToolSpec,
    )
    from terret.runtime.ownership import SessionOwner
    from terret.runtime.runtime import Runtime
    from terret.runtime.scripted import Reply, ScriptedProvider, call
    from terret.runtime.summarizer import FixedSummarizer, Summarizer, render_history
    from terret.runtime.tools import CallContext, Tool, ToolContext, ToolOutcome, Veto, tool

_LAZY: dict[str, str] = {
    "Agent": "terret.runtime.agent:Agent",
    "AgentDefinition": "terret.runtime.definition:AgentDefinition",
    "TurnResult": "terret.runtime.definition:TurnResult",
    "AllowList": "terret.runtime.allowlist:AllowList",
    "ApprovalGate": "terret.runtime.approvals:ApprovalGate",
    "TurnCancelled": "terret.runtime.approvals:TurnCancelled",
    "BudgetGuard": "terret.runtime.hooks:BudgetGuard",
    "PreStepHook": "terret.runtime.hooks:PreStepHook",
    "Refusal": "terret.runtime.hooks:Refusal",
    "StepClaim": "terret.runtime.hooks:StepClaim",
    "ModelProvider": "terret.runtime.model:ModelProvider",
    "ModelReply": "terret.runtime.model:ModelReply",
    "ModelRequest": "terret.runtime.model:ModelRequest",
    "ModelResolver": "terret.runtime.model:ModelResolver",
    "StaticResolver": "terret.runtime.model:StaticResolver",
    "ToolSpec": "terret.runtime.model:ToolSpec",
    "Runtime": "terret.runtime.runtime:Runtime",
    "SessionOwner": "terret.runtime.ownership:SessionOwner",
    "RuntimeConfig": "terret.runtime.config:RuntimeConfig",
    "Reply": "terret.runtime.scripted:Reply",
    "ScriptedProvider": "terret.runtime.scripted:ScriptedProvider",
    "call": "terret.runtime.scripted:call",
    "FixedSummarizer": "terret.runtime.summarizer:FixedSummarizer",
    "Summarizer": "terret.runtime.summarizer:Summarizer",
    "render_history": "terret.runtime.summarizer:render_history",
    "CallContext": "terret.runtime.tools:CallContext",
    "Tool": "terret.runtime.tools:Tool",
    "ToolContext": "terret.runtime.tools:ToolContext",
    "ToolOutcome": "terret.runtime.tools:ToolOutcome",
    "Veto": "terret.runtime.tools:Veto",
    "tool": "terret.runtime.tools:tool",
}
"""Each public name and where it lives: ``module:attribute``, or a submodule."""

__all__ = [
    "Agent",
    "AgentDefinition",
    "AllowList",
    "ApprovalGate",
    "BudgetGuard",
    "CallContext",
    "FixedSummarizer",
    "ModelProvider",
    "ModelReply",
    "ModelRequest",
    "ModelResolver",
    "PreStepHook",
    "Refusal",
    "Reply",
    "Runtime",
    "RuntimeConfig",
    "ScriptedProvider",
    "SessionOwner",
    "StaticResolver",
    "StepClaim",
    "Summarizer",
    "Tool",
    "ToolContext",
    "ToolOutcome",
    "ToolSpec",
    "TurnCancelled",
    "TurnResult",
    "Veto",
    "call",
    "render_history",
    "tool",
]


__getattr__, __dir__ = lazy_exports(globals(), _LAZY)
