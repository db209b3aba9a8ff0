"""The event catalogue: wire names, schema versions, payload models, upcasters.

Terret's own events and users' extension events register in the same catalogue and are treated
alike by the stores, the subscriptions, the projections and the CLI. Importing this module
registers Terret's own events (``terret.domain.events``), so whoever reads the catalogue finds
them; the machinery lives in ``terret.domain.payloads``, which imports no event (no cycle).
"""

from __future__ import annotations

import terret.domain.events  # noqa: F401 - registers Terret's own events
from terret.domain.payloads import (
    EventCatalogue,
    EventPayload,
    OpaquePayload,
    Upcaster,
    catalogue,
    creating,
    event_type,
    text_problem,
    upcaster,
)

__all__ = [
    "EventCatalogue",
    "EventPayload",
    "OpaquePayload",
    "Upcaster",
    "catalogue",
    "creating",
    "event_type",
    "text_problem",
    "upcaster",
]
