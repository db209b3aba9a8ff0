"""Read models fed by the store's catch-up subscription, and the runner that feeds them.

Names are imported on first use (PEP 562): importing the package costs nothing."""

from __future__ import annotations

from typing import TYPE_CHECKING

from terret._lazy import lazy_exports

if TYPE_CHECKING:
    from terret.projections._typed import handler
    from terret.projections.approvals import PendingApproval, RecordedVerdict
    from terret.projections.base import Projection, TypedProjection, ViewStore
    from terret.projections.registry import (
        register_projection,
        registered_projections,
        unregister_projection,
    )
    from terret.projections.runner import ListenerHandle, ProjectionRunner, ProjectionState
    from terret.projections.sessions import SessionSummary
    from terret.projections.status import SessionStatus
    from terret.projections.usage import UsageTotals
    from terret.projections.views import Views, default_projections

_LAZY: dict[str, str] = {
    "PendingApproval": "terret.projections.approvals:PendingApproval",
    "RecordedVerdict": "terret.projections.approvals:RecordedVerdict",
    "Projection": "terret.projections.base:Projection",
    "TypedProjection": "terret.projections.base:TypedProjection",
    "handler": "terret.projections._typed:handler",
    "ViewStore": "terret.projections.base:ViewStore",
    "ListenerHandle": "terret.projections.runner:ListenerHandle",
    "ProjectionRunner": "terret.projections.runner:ProjectionRunner",
    "ProjectionState": "terret.projections.runner:ProjectionState",
    "SessionSummary": "terret.projections.sessions:SessionSummary",
    "SessionStatus": "terret.projections.status:SessionStatus",
    "UsageTotals": "terret.projections.usage:UsageTotals",
    "Views": "terret.projections.views:Views",
    "default_projections": "terret.projections.views:default_projections",
    "register_projection": "terret.projections.registry:register_projection",
    "registered_projections": "terret.projections.registry:registered_projections",
    "unregister_projection": "terret.projections.registry:unregister_projection",
}
"""Each public name and where it lives: ``module:attribute``, or a submodule."""

__all__ = [
    "ListenerHandle",
    "PendingApproval",
    "Projection",
    "ProjectionRunner",
    "ProjectionState",
    "RecordedVerdict",
    "SessionStatus",
    "SessionSummary",
    "TypedProjection",
    "UsageTotals",
    "ViewStore",
    "Views",
    "default_projections",
    "handler",
    "register_projection",
    "registered_projections",
    "unregister_projection",
]


__getattr__, __dir__ = lazy_exports(globals(), _LAZY)
