"""Worker liveness (R28, R29): the port behind leases.

A session's owner is a durable fact in its log (``agent/attached`` names the worker), but the
owner's *liveness* is not: writing a heartbeat into session streams would make an idle session's
log grow with time. Each worker instead beats into a small, bounded registry kept beside the log
(a table in the SQLite file, one capped stream on EventStoreDB). A session is owned while its
log says so and its owner's latest beat is younger than the owner's lease TTL; past that, any
live worker may take it over with an expected-version append, which fences the old owner out.
"""

from __future__ import annotations

import json
import threading
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class WorkerBeat:
    """One heartbeat: who, where, since when, as of when (wall-clock seconds), for how long it
    holds (``ttl``), and the sessions the worker owns at that moment (for operators)."""

    worker: str
    host: str
    pid: int
    started: float
    at: float
    ttl: float
    sessions: tuple[str, ...] = field(default_factory=tuple)
    proc_start: int | None = None
    """The process's start time as the OS counts it (Linux: clock ticks since boot), so a pid
    reused by another process is not taken for the worker."""
    upkeep: tuple[str, ...] = ()
    """The between-turn upkeep (``title``, ``compaction``) the worker does for the turns it
    runs, following the log (a started ``Runtime``): others leave that to it."""
    folds: tuple[str, ...] = ()
    """The events beyond R5's seed list its running turns fold in (wire names): what another
    process may append while such a turn runs. A worker of an older release names none."""
    follows: bool | None = None
    """Whether the worker follows the log (a started ``Runtime``): it hears of a wake on a
    session it holds. False: it serves nothing (a runtime never started, one stopping); None:
    a worker of an older release, which does not say (taken as following)."""
    agents: tuple[str, ...] | None = None
    """The names of the agents the worker's app defines: the sessions it can serve. None: a
    worker of an older release, which does not say (taken as defining every agent)."""
    serves: bool | None = None
    """Whether the worker serves (``serve_start``, ``terret serve``): it takes free sessions,
    wakes, handoffs and takeovers. False: a runtime that only runs the turns asked of it (a web
    app's request worker, started or not); None: an older release (taken as serving)."""

    def alive(self, now: float) -> bool:
        return now - self.at <= self.ttl

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes | str) -> WorkerBeat:
        raw = json.loads(data)
        return cls(worker=str(raw["worker"]), host=str(raw["host"]), pid=int(raw["pid"]),
                   started=float(raw["started"]), at=float(raw["at"]), ttl=float(raw["ttl"]),
                   sessions=tuple(str(s) for s in raw.get("sessions", ())),
                   proc_start=raw.get("proc_start"), upkeep=_purposes(raw.get("upkeep")),
                   folds=_purposes(raw.get("folds")),
                   follows=raw["follows"] if isinstance(raw.get("follows"), bool) else None,
                   agents=_purposes(raw["agents"]) if isinstance(raw.get("agents"), list)
                   else None,
                   serves=raw["serves"] if isinstance(raw.get("serves"), bool) else None)


def _purposes(raw: object) -> tuple[str, ...]:
    """The strings of a JSON list (a beat's upkeep purposes, wire names, agent names)."""
    return tuple(p for p in raw if isinstance(p, str)) if isinstance(raw, list) else ()


class WorkerRegistry(ABC):
    """Where workers beat. Bounded: it keeps each worker's latest beat (and forgets workers that
    left or have been silent for long), never a history."""

    @abstractmethod
    def beat(self, beat: WorkerBeat) -> None:
        """Record ``beat`` as its worker's latest. Raises a ``StoreError`` if it cannot."""

    @abstractmethod
    def leave(self, worker: str) -> None:
        """A graceful stop: the worker is gone at once, not when its lease runs out."""

    @abstractmethod
    def latest(self, worker: str) -> WorkerBeat | None:
        """The worker's latest beat, None if it never beat, left, or was forgotten."""

    @abstractmethod
    def beats(self) -> list[WorkerBeat]:
        """The latest beat of every worker the registry still knows, live or not."""

    def live(self, now: float) -> list[WorkerBeat]:
        return [b for b in self.beats() if b.alive(now)]

    def close(self) -> None:  # noqa: B027 - optional
        """Release what the registry holds (connections)."""


class MemoryWorkers(WorkerRegistry):
    def __init__(self) -> None:
        self._beats: dict[str, WorkerBeat] = {}
        self._lock = threading.Lock()

    def beat(self, beat: WorkerBeat) -> None:
        with self._lock:
            self._beats[beat.worker] = beat

    def leave(self, worker: str) -> None:
        with self._lock:
            self._beats.pop(worker, None)

    def latest(self, worker: str) -> WorkerBeat | None:
        with self._lock:
            return self._beats.get(worker)

    def beats(self) -> list[WorkerBeat]:
        with self._lock:
            return list(self._beats.values())
