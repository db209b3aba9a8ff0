"""Terret: long-lived LLM agent sessions on an event store.

The public surface is re-exported here; modules behind it are private unless documented.

Names are imported on first use (PEP 562), so ``import terret`` (and the ``terret`` command
line, which starts from it) loads nothing it does not use."""

from __future__ import annotations

from typing import TYPE_CHECKING

from terret._lazy import lazy_exports

__version__ = "0.1.0"

if TYPE_CHECKING:
    from terret.adapters.stores import EventStoreDBStore, MemoryStore, SQLiteStore, open_store
    from terret.domain import (
        MAX_STEPS,
        EventPayload,
        OpaquePayload,
        RecordedEvent,
        Session,
        SessionRepository,
        StreamState,
        event_type,
        upcaster,
    )
    from terret.domain import errors as errors
    from terret.domain.catalogue import catalogue
    from terret.domain.events import Actor
    from terret.domain.messages import Message, ToolCall, Usage
    from terret.projections.registry import register_projection
    from terret.runtime import (
        AgentDefinition,
        CallContext,
        FixedSummarizer,
        Refusal,
        Reply,
        Runtime,
        RuntimeConfig,
        ScriptedProvider,
        SessionOwner,
        StaticResolver,
        StepClaim,
        Tool,
        TurnResult,
        call,
        tool,
    )

_LAZY: dict[str, str] = {
    "EventStoreDBStore": "terret.adapters.stores:EventStoreDBStore",
    "MemoryStore": "terret.adapters.stores:MemoryStore",
    "SQLiteStore": "terret.adapters.stores:SQLiteStore",
    "open_store": "terret.adapters.stores:open_store",
    "MAX_STEPS": "terret.domain:MAX_STEPS",
    "EventPayload": "terret.domain:EventPayload",
    "OpaquePayload": "terret.domain:OpaquePayload",
    "RecordedEvent": "terret.domain:RecordedEvent",
    "Session": "terret.domain:Session",
    "SessionRepository": "terret.domain:SessionRepository",
    "StreamState": "terret.domain:StreamState",
    "catalogue": "terret.domain.catalogue:catalogue",
    "event_type": "terret.domain:event_type",
    "upcaster": "terret.domain:upcaster",
    "register_projection": "terret.projections.registry:register_projection",
    "errors": "terret.domain.errors",
    "Actor": "terret.domain.events:Actor",
    "Message": "terret.domain.messages:Message",
    "ToolCall": "terret.domain.messages:ToolCall",
    "Usage": "terret.domain.messages:Usage",
    "AgentDefinition": "terret.runtime:AgentDefinition",
    "CallContext": "terret.runtime:CallContext",
    "FixedSummarizer": "terret.runtime:FixedSummarizer",
    "Refusal": "terret.runtime:Refusal",
    "Reply": "terret.runtime:Reply",
    "Runtime": "terret.runtime:Runtime",
    "RuntimeConfig": "terret.runtime:RuntimeConfig",
    "ScriptedProvider": "terret.runtime:ScriptedProvider",
    "SessionOwner": "terret.runtime:SessionOwner",
    "StaticResolver": "terret.runtime:StaticResolver",
    "StepClaim": "terret.runtime:StepClaim",
    "Tool": "terret.runtime:Tool",
    "TurnResult": "terret.runtime:TurnResult",
    "call": "terret.runtime:call",
    "tool": "terret.runtime:tool",
}
"""Each public name and where it lives: ``module:attribute``, or a submodule."""

__all__ = [
    "MAX_STEPS",
    "EventStoreDBStore",
    "MemoryStore",
    "SQLiteStore",
    "open_store",
    "Actor",
    "AgentDefinition",
    "CallContext",
    "FixedSummarizer",
    "Refusal",
    "Reply",
    "Runtime",
    "RuntimeConfig",
    "ScriptedProvider",
    "SessionOwner",
    "StaticResolver",
    "StepClaim",
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
    "register_projection",
    "upcaster",
]


__getattr__, __dir__ = lazy_exports(globals(), _LAZY)
