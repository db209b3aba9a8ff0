"""Beats of two releases on one registry: a newer field an older release's beat lacks reads as
"does not say", which counts as the old behaviour — an older worker is taken as following the
log and as defining every agent, so the preference never passes it over for lack of a field."""

from __future__ import annotations

import json

from terret.domain.workers import WorkerBeat
from terret.runtime.ownership import LiveWorker

OLD_BEAT = {"worker": "w1", "host": "h", "pid": 7, "started": 1.0, "at": 2.0, "ttl": 15.0,
            "sessions": ["s1"]}


def test_a_beat_of_an_older_release_says_nothing_of_its_agents() -> None:
    beat = WorkerBeat.from_json(json.dumps(OLD_BEAT))
    assert beat.agents is None and beat.follows is None
    old = LiveWorker(beat.worker, beat.follows is not False, beat.agents)
    assert old.defines("default") and old.defines("billing")


def test_a_beat_names_its_apps_agents_and_is_read_back() -> None:
    beat = WorkerBeat(worker="w2", host="h", pid=8, started=1.0, at=2.0, ttl=15.0,
                      follows=True, agents=("billing", "ops"))
    read = WorkerBeat.from_json(beat.to_json())
    assert read == beat
    worker = LiveWorker(read.worker, True, read.agents)
    assert worker.defines("ops") and not worker.defines("default") and worker.defines(None)
    # A damaged field reads as "does not say", never as "defines nothing".
    odd = WorkerBeat.from_json(json.dumps({**OLD_BEAT, "agents": "ops"}))
    assert odd.agents is None


def test_a_beat_says_whether_its_worker_serves_and_an_older_one_is_taken_as_serving() -> None:
    """Only serving workers are preferred for a free session: a web app's request worker,
    preferred, never tried, and held the session up until the grace ran out."""
    old = WorkerBeat.from_json(json.dumps(OLD_BEAT))
    assert old.serves is None
    assert LiveWorker(old.worker, True, old.agents, old.upkeep, old.serves is not False).serves
    beat = WorkerBeat(worker="w3", host="h", pid=9, started=1.0, at=2.0, ttl=15.0,
                      follows=False, agents=("ops",), serves=False)
    assert WorkerBeat.from_json(beat.to_json()) == beat
