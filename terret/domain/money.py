"""Costs as figures: what a model call cost, summed over many calls, carries the float's error
(0.1 + 0.2 is 0.30000000000000004). Every figure Terret shows or returns is rounded one way."""

from __future__ import annotations

COST_DIGITS = 10
"""Decimal places of a cost figure: far below a token's price, above a float sum's error."""


def cost_figure(cost: float) -> float:
    """``cost`` rounded to ``COST_DIGITS`` places (``-0.0`` shown as ``0.0``)."""
    return round(cost, COST_DIGITS) + 0.0
