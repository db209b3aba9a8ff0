"""The domain: event catalogue, payloads, the ``Session`` aggregate, the store port, errors.

Imports nothing from the other layers.
"""

from terret.domain import events as events  # registers Terret's events in the catalogue
from terret.domain.catalogue import (
    EventCatalogue,
    EventPayload,
    OpaquePayload,
    catalogue,
    event_type,
    upcaster,
)
from terret.domain.codec import RecordedEvent, decode, encode
from terret.domain.repository import SessionRepository
from terret.domain.session import MAX_STEPS, Session
from terret.domain.store import (
    AppendResult,
    CaughtUp,
    Checkpoint,
    EventStore,
    NewRecord,
    StoredRecord,
    StreamState,
    Subscription,
    session_stream,
)

__all__ = [
    "MAX_STEPS",
    "AppendResult",
    "CaughtUp",
    "Checkpoint",
    "EventCatalogue",
    "EventPayload",
    "EventStore",
    "NewRecord",
    "OpaquePayload",
    "RecordedEvent",
    "Session",
    "SessionRepository",
    "StoredRecord",
    "StreamState",
    "Subscription",
    "catalogue",
    "decode",
    "encode",
    "event_type",
    "events",
    "session_stream",
    "upcaster",
]
