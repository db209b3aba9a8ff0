"""How a turn is stopped from outside its loop: the two exceptions the tool pipeline, the
approval gate and the turn driver raise and catch (a module of its own so that none of them
imports another for them)."""

from __future__ import annotations

from terret.domain.errors import TerretError


class TurnCancelled(TerretError):
    """Raised inside a turn when its cancellation was recorded; the loop closes it cancelled."""


class TurnSuspended(TerretError):
    """The process is stopping: the turn stops at a step boundary (or leaves its parked
    approval) without writing anything, and stays open and resumable."""
