"""Who serves a session, for operators: the owner its log names (``agent/attached``) and whether
that worker's lease is live, from the store's worker registry (R28, R29).

A worker is live while its latest beat is younger than its TTL; on this host a worker whose
process is gone (killed, or its pid reused) is not, at once. A worker that stopped gracefully
left the registry and released what it owned, so its sessions have no owner.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from terret.cli._format import ago

if TYPE_CHECKING:
    from terret.domain.store import EventStore
    from terret.domain.workers import WorkerBeat


class Liveness:
    """One read of the worker registry, answering for any number of owners."""

    def __init__(self, store: EventStore, now: float | None = None) -> None:
        import socket

        self.now = time.time() if now is None else now
        self.host = socket.gethostname()
        # Not guarded: a store without a registry yet answers with no beats; a failed read (the
        # store unreachable) is the command's error — swallowed, it showed "no live workers"
        # and every owner's lease "expired", exit 0.
        self.beats: dict[str, WorkerBeat] = {b.worker: b for b in store.workers().beats()}

    def process(self, beat: WorkerBeat) -> str | None:
        """``running`` or ``gone`` for a worker of this host, None for another host's."""
        if beat.host != self.host:
            return None
        from terret.runtime.ownership import process_running

        return "running" if process_running(beat.pid, beat.proc_start) else "gone"

    def live(self, beat: WorkerBeat) -> bool:
        return beat.alive(self.now) and self.process(beat) != "gone"

    def owner(self, owner: dict[str, Any] | None) -> dict[str, Any] | None:
        """The owner as the log names it, with ``lease`` (``live`` or ``expired``),
        ``last_beat`` (epoch seconds, None when the registry has no beat of it), ``ttl`` and
        ``process`` (``running``/``gone`` on this host, else None)."""
        if owner is None:
            return None
        worker = owner.get("worker")
        beat = self.beats.get(worker) if worker else None
        if beat is None:
            return {**owner, "lease": "expired", "last_beat": None, "ttl": None,
                    "process": None}
        return {**owner, "lease": "live" if self.live(beat) else "expired",
                "last_beat": beat.at, "ttl": beat.ttl, "process": self.process(beat)}

    def beat(self, beat: WorkerBeat) -> dict[str, Any]:
        """A worker as ``terret workers`` shows it."""
        return {"worker": beat.worker, "host": beat.host, "pid": beat.pid,
                "started": beat.started, "last_beat": beat.at, "ttl": beat.ttl,
                "live": self.live(beat), "process": self.process(beat),
                "sessions": sorted(beat.sessions), "upkeep": list(beat.upkeep),
                "agents": None if beat.agents is None else list(beat.agents)}


def owner_text(owner: dict[str, Any] | None, now: float | None = None) -> str:
    """``web-1 pid 4242, lease live (last beat 2 s ago; worker web-1:4242:ab12cd34)``."""
    if owner is None:
        return "none (no worker owns it)"
    beat = owner.get("last_beat")
    detail = [f"last beat {ago(beat, now)}" if beat is not None else "no beat in the registry"]
    if owner.get("process") == "gone":
        detail.append("its process is gone")
    if owner.get("worker"):
        detail.append(f"worker {owner['worker']}")
    return (f"{owner.get('host')} pid {owner.get('pid')}, lease {owner['lease']} "
            f"({'; '.join(detail)})")


def owner_cell(owner: dict[str, Any] | None) -> str:
    """The OWNER column of ``sessions list``: ``web-1:4242 live``."""
    if owner is None:
        return "-"
    return f"{owner.get('host')}:{owner.get('pid')} {owner['lease']}"
