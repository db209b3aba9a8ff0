"""How a turn is stopped from outside its loop: the two exceptions the tool pipeline, the
approval gate and the turn driver raise and catch. They are typed errors of the domain's
catalogue (``terret.errors``), a caller of ``run_turn`` may meet ``TurnSuspended``. And how a
stopping runtime bounds its last writes (``finish_within``)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from terret.domain.errors import TurnCancelled, TurnSuspended

log = logging.getLogger("terret.runtime")

__all__ = ["MOST_GRACE", "STOP_MARGIN", "STOP_RESERVE", "TurnCancelled", "TurnSuspended",
           "finish_within"]


MOST_GRACE = 366 * 86400.0
"""The longest grace of a stop (``Runtime.close``, ``terret serve --grace``): it becomes a clock
time, as a lease's TTL does."""

STOP_MARGIN = 5.0
"""Seconds a stop may take past its grace for its last writes (the releases, the registry)."""

STOP_RESERVE = 0.5
"""Of the margin, what is kept for the closing that follows the last writes (the views, the
store's connections): with the store down, the last writes take the rest."""


def finish_within(end: float, what: str, work: Callable[[], object],
                  why: str = "the store does not answer") -> bool:
    """Run ``work`` on a thread of its own until the monotonic time ``end``; False (said once,
    with ``why`` it may not have) when it has not finished by then — it is left to run while
    the process lasts. Its error, when it finished with one, is raised here."""
    failed: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as exc:  # handed to the stopping thread
            failed.append(exc)

    thread = threading.Thread(target=run, name=f"terret-stop-{what}", daemon=True)
    thread.start()
    thread.join(max(0.0, end - time.monotonic()))
    if thread.is_alive():
        log.warning("stopping: %s did not finish within the grace (%s); left to this "
                    "worker's lease to expire, as after a crash", what, why)
        return False
    if failed:
        raise failed[0]
    return True

