"""The runtime: turns and steps, tools, durable approvals, resume, compaction, titles, cost,
allow-list, wake-on-stimulus and the agent registry."""

from terret.runtime.agent import Agent, AgentDefinition, TurnResult
from terret.runtime.allowlist import AllowList
from terret.runtime.approvals import ApprovalGate, TurnCancelled
from terret.runtime.hooks import BudgetGuard, PreStepHook, Refusal, StepClaim
from terret.runtime.model import (
    ModelProvider,
    ModelReply,
    ModelRequest,
    ModelResolver,
    StaticResolver,
    ToolSpec,
)
from terret.runtime.runtime import Runtime, RuntimeConfig
from terret.runtime.scripted import Reply, ScriptedProvider, call
from terret.runtime.summarizer import FixedSummarizer, Summarizer, render_history
from terret.runtime.tools import CallContext, Tool, ToolContext, ToolOutcome, Veto, tool

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
