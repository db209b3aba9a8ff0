"""Pre-step hooks (R3 ``rejected``) and the per-session spend budget (R21, beyond)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import get_args
from uuid import UUID

from terret.domain.errors import ConfigurationError
from terret.domain.events import ActorKind, reason_problem
from terret.domain.money import cost_figure
from terret.domain.session import SessionState


@dataclass(frozen=True)
class StepClaim:
    """What a pre-step hook is asked about: the step about to start and its model spec."""

    session_id: UUID
    turn: int
    step: int
    model: str


@dataclass(frozen=True)
class Refusal:
    """A pre-step hook's refusal: the turn ends ``rejected`` with ``by: {actor, id}``.
    ``actor`` is one of the log's actor kinds (``operator``, ``budget``, ``system``, …);
    another is a ``ConfigurationError`` here, where the hook's author sees it, not a turn
    that fails on every step."""

    actor: str
    reason: str
    id: str | None = None

    def __post_init__(self) -> None:
        kinds = get_args(ActorKind)
        if self.actor not in kinds:
            raise ConfigurationError(f"Refusal actor {self.actor!r} is not one of "
                                     f"{', '.join(kinds)}; name who refused with id=")
        # Checked here, where the hook's author sees it: the reason goes into the turn/end
        # (and its start into every call the turn stops), which must fit one append.
        problem = ("a reason is text" if not isinstance(self.reason, str)
                   else reason_problem(self.reason))
        if problem is not None:
            raise ConfigurationError(f"Refusal reason: {problem}")


PreStepHook = Callable[[StepClaim], Refusal | None]


@dataclass(frozen=True)
class BudgetCheck:
    """Where a session stands against its budget: the ``limit`` in force, what it has
    ``spent`` (every model call whose reply is in the log) and the ``estimate`` of its next
    model call."""

    limit: float
    spent: float
    estimate: float

    @property
    def exceeded(self) -> bool:
        """Spent already, or passed by the next call. Compared as cost figures (rounded to
        ``COST_DIGITS`` places): 0.2 + 0.1 is 0.30000000000000004 as floats, and a step that
        lands exactly on a budget of 0.3 does not pass it."""
        spent, limit = cost_figure(self.spent), cost_figure(self.limit)
        return spent >= limit or cost_figure(self.spent + self.estimate) > limit


class BudgetGuard:
    """The spend budget of a session (R21, beyond): its own (the last ``budget/set``), else
    the deployment's ``default`` (``RuntimeConfig.spend_cap``). Before each step the loop asks
    it; when what the session spent plus the estimate of the next model call (the most
    expensive call so far in the session) would pass the limit, the turn parks on its budget
    instead of spending. Decided on the session aggregate caught up with the store (R30): its
    cost is summed from the durable usage of the replies in the log."""

    def __init__(self, default: float | None = None) -> None:
        self.default = default

    def limit(self, state: SessionState) -> float | None:
        return state.budget if state.budget_set else self.default

    def keeps_parked(self, state: SessionState) -> bool:
        """Whether the open turn is parked on its budget and no budget recorded since covers
        its next step: a worker resuming it would only park again."""
        if state.budget_wait is None or not state.turn_open or state.cancel_requested:
            return False
        check = self.check(state)
        return check is not None and check.exceeded

    def check(self, state: SessionState) -> BudgetCheck | None:
        """None when the session has no budget (its own or a default)."""
        limit = self.limit(state)
        if limit is None:
            return None
        # Figures as every other reading shows them: 0.2 + 0.1 spent is 0.3.
        return BudgetCheck(limit, cost_figure(state.total_cost), cost_figure(state.dearest_call))
