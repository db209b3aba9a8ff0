"""Read models fed by the store's catch-up subscription, and the runner that feeds them."""

from terret.projections.approvals import PendingApproval, RecordedVerdict
from terret.projections.base import Projection, ViewStore
from terret.projections.runner import ListenerHandle, ProjectionRunner, ProjectionState
from terret.projections.sessions import SessionSummary
from terret.projections.status import SessionStatus
from terret.projections.usage import UsageTotals
from terret.projections.views import Views, default_projections

__all__ = [
    "ListenerHandle",
    "PendingApproval",
    "Projection",
    "ProjectionRunner",
    "ProjectionState",
    "RecordedVerdict",
    "SessionStatus",
    "SessionSummary",
    "UsageTotals",
    "ViewStore",
    "Views",
    "default_projections",
]
