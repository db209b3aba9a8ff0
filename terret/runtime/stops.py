"""How a turn is stopped from outside its loop: the two exceptions the tool pipeline, the
approval gate and the turn driver raise and catch. They are typed errors of the domain's
catalogue (``terret.errors``), a caller of ``run_turn`` may meet ``TurnSuspended``."""

from __future__ import annotations

from terret.domain.errors import TurnCancelled, TurnSuspended

__all__ = ["TurnCancelled", "TurnSuspended"]
