"""A summary may land while a turn runs only when the turn's owner folds it in (R5, R18): a
worker says so in its beats (``folds``); a worker of an older release names nothing there, and
its running turn is left alone — its writer would take the summary for a takeover and stop."""

from __future__ import annotations

import time

from terret.domain.events import FOLDED_BEYOND_SEED, SessionCompacted
from terret.domain.workers import MemoryWorkers, WorkerBeat
from terret.runtime.ownership import WorkerLease

COMPACTED = SessionCompacted.wire_name


def _beat(worker: str, *, folds: tuple[str, ...] = (), age: float = 0.0) -> WorkerBeat:
    # Another host: liveness by the beat's age alone, not by a local pid.
    return WorkerBeat(worker=worker, host="elsewhere", pid=1, started=0.0,
                      at=time.time() - age, ttl=15.0, folds=folds)


def test_a_live_owner_of_an_older_release_does_not_fold_a_summary_in() -> None:
    registry = MemoryWorkers()
    lease = WorkerLease(registry, ttl=15.0)
    registry.beat(_beat("old"))
    registry.beat(_beat("new", folds=FOLDED_BEYOND_SEED))
    registry.beat(_beat("gone-old", age=60.0))
    assert COMPACTED in FOLDED_BEYOND_SEED
    assert lease.folds("old", COMPACTED) is False
    assert lease.folds("new", COMPACTED) is True
    assert lease.folds("gone-old", COMPACTED) is True  # runs nothing: nothing to stop
    assert lease.folds(lease.worker, COMPACTED) is True
    assert lease.folds(None, COMPACTED) is True  # an owner from before workers had names


def test_this_release_says_what_it_folds_in_its_beats() -> None:
    registry = MemoryWorkers()
    lease = WorkerLease(registry, ttl=15.0)
    lease.beat_now()
    beat = registry.latest(lease.worker)
    assert beat is not None and beat.folds == FOLDED_BEYOND_SEED
    assert WorkerBeat.from_json(beat.to_json()).folds == FOLDED_BEYOND_SEED
    old = _beat("old").to_json().replace(b',"folds":[]', b"")  # an older release's beat
    assert b'"folds"' not in old
    assert WorkerBeat.from_json(old).folds == ()
