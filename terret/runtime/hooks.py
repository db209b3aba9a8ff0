"""Pre-step hooks (R3 ``rejected``) and the per-session spend cap (R21, beyond)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from uuid import UUID

from terret.projections.views import Views


@dataclass(frozen=True)
class StepClaim:
    session_id: UUID
    turn: int
    step: int
    model: str


@dataclass(frozen=True)
class Refusal:
    """A pre-step hook's refusal: the turn ends ``rejected`` with ``by: {actor}``."""

    actor: str
    reason: str


PreStepHook = Callable[[StepClaim], Refusal | None]


class BudgetGuard:
    """Rejects the step that would take a session's spend past ``cap``. The next step's cost is
    estimated as the most expensive step so far in the session, so a step is refused before it
    runs rather than after it overspent."""

    def __init__(self, views: Views, cap: float) -> None:
        self.views = views
        self.cap = cap

    def __call__(self, claim: StepClaim) -> Refusal | None:
        by_turn = self.views.usage_by_turn(claim.session_id)
        spent = sum(u.cost for u in by_turn.values())  # as ``views.usage`` sums it, turn by turn
        per_step = max((u.cost / u.steps for u in by_turn.values() if u.steps), default=0.0)
        if spent + per_step > self.cap or spent >= self.cap:
            return Refusal(
                "budget",
                f"spend cap {self.cap:g} reached: spent {spent:g}, "
                f"next step estimated at {per_step:g}",
            )
        return None
