"""The domain: event catalogue, payloads, the ``Session`` aggregate, the store port, errors.

Imports nothing from the other layers.

Names are imported on first use (PEP 562): importing a light module of the domain (``errors``,
``store``) does not load pydantic and every payload class. The catalogue registers Terret's own
events when it is first imported (``terret.domain.catalogue``), whoever imports it."""

from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING, Any

from terret._lazy import lazy_exports

if TYPE_CHECKING:
    from terret.domain import events as events
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

_LAZY: dict[str, str] = {
    "events": "terret.domain.events",
    "EventCatalogue": "terret.domain.catalogue:EventCatalogue",
    "EventPayload": "terret.domain.catalogue:EventPayload",
    "OpaquePayload": "terret.domain.catalogue:OpaquePayload",
    "catalogue": "terret.domain.catalogue:catalogue",
    "event_type": "terret.domain.catalogue:event_type",
    "upcaster": "terret.domain.catalogue:upcaster",
    "RecordedEvent": "terret.domain.codec:RecordedEvent",
    "decode": "terret.domain.codec:decode",
    "encode": "terret.domain.codec:encode",
    "SessionRepository": "terret.domain.repository:SessionRepository",
    "MAX_STEPS": "terret.domain.session:MAX_STEPS",
    "Session": "terret.domain.session:Session",
    "AppendResult": "terret.domain.store:AppendResult",
    "CaughtUp": "terret.domain.store:CaughtUp",
    "Checkpoint": "terret.domain.store:Checkpoint",
    "EventStore": "terret.domain.store:EventStore",
    "NewRecord": "terret.domain.store:NewRecord",
    "StoredRecord": "terret.domain.store:StoredRecord",
    "StreamState": "terret.domain.store:StreamState",
    "Subscription": "terret.domain.store:Subscription",
    "session_stream": "terret.domain.store:session_stream",
}
"""Each public name and where it lives: ``module:attribute``, or a submodule."""

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


__getattr__, __dir__ = lazy_exports(globals(), _LAZY)


class _Domain(types.ModuleType):
    """``terret.domain.catalogue`` stays the process-wide catalogue object, as when this package
    imported it eagerly: the import system binds a submodule to its package's attribute when it
    is first imported, which would otherwise replace the object by the module of that name."""

    @property
    def catalogue(self) -> Any:
        from terret.domain.catalogue import catalogue

        return catalogue

    @catalogue.setter
    def catalogue(self, value: Any) -> None:
        pass  # the submodule being bound: the object stays


sys.modules[__name__].__class__ = _Domain
