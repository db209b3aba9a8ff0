"""Terret: long-lived LLM agent sessions on an event store.

The public surface is re-exported here; modules behind it are private unless documented.
"""

from terret.adapters.stores import MemoryStore, SQLiteStore, open_store
from terret.domain import (
    MAX_STEPS,
    EventPayload,
    OpaquePayload,
    RecordedEvent,
    Session,
    SessionRepository,
    StreamState,
    catalogue,
    event_type,
    upcaster,
)
from terret.domain import errors as errors
from terret.domain.events import Actor
from terret.domain.messages import Message, ToolCall, Usage
from terret.runtime import (
    AgentDefinition,
    CallContext,
    FixedSummarizer,
    Reply,
    Runtime,
    RuntimeConfig,
    ScriptedProvider,
    StaticResolver,
    Tool,
    TurnResult,
    call,
    tool,
)

__all__ = [
    "MAX_STEPS",
    "MemoryStore",
    "SQLiteStore",
    "open_store",
    "Actor",
    "AgentDefinition",
    "CallContext",
    "FixedSummarizer",
    "Reply",
    "Runtime",
    "RuntimeConfig",
    "ScriptedProvider",
    "StaticResolver",
    "Tool",
    "TurnResult",
    "call",
    "tool",
    "EventPayload",
    "Message",
    "OpaquePayload",
    "RecordedEvent",
    "Session",
    "SessionRepository",
    "StreamState",
    "ToolCall",
    "Usage",
    "catalogue",
    "errors",
    "event_type",
    "upcaster",
]
