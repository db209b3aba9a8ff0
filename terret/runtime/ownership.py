"""One session, one executor (R28, R29): this process's worker identity, its heartbeat, and the
lease checks the turn loop makes before it acts.

A worker (one ``Runtime``) owns the sessions whose latest ``agent/attached`` names it. The
attach is an expected-version append, so two claimants never both win, and it carries a fencing
epoch: every write of the owner checks that the log's epoch is still its own. The lease behind
it is renewed outside the session's log, by beats into the store's worker registry every
``ttl / 5`` seconds; another worker may take the session over once the owner's latest beat is
older than ``ttl``.

The owner itself stops trusting its lease sooner, at ``VALID_FRACTION × ttl`` after the start of
its last successful beat (monotonic clock, which keeps counting while a process is frozen):
before each model request and tool call it checks that, so a worker frozen (SIGSTOP), starved or
cut off from the store past that point runs nothing more. And when a beat finally succeeds after
such a gap, the lease generation moves on: whatever the worker owned before is let go (its
agents stop without writing), even if nobody took it over meanwhile — the worker may claim it
again, with a new epoch, like any other.
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal
from uuid import uuid4

from terret.domain.errors import LostOwnership, StoreError
from terret.domain.workers import WorkerBeat, WorkerRegistry

if TYPE_CHECKING:  # the aggregate and the payloads: not needed to ask whether a worker lives
    from terret.domain.events import Actor
    from terret.domain.session import Session

log = logging.getLogger("terret.ownership")


@dataclass(frozen=True)
class SessionOwner:
    """Who runs a session (``Runtime.owner``): the worker its latest ``agent/attached`` names,
    and whether that worker is alive by its beats at the moment of asking. A turn open in the
    log whose owner is not ``live`` runs nowhere: resume it (or let ``serve`` take it over)."""

    agent_id: str
    worker: str | None
    """None for an owner recorded before workers had names (it counts as gone)."""
    host: str
    pid: int
    live: bool
    """Its latest beat is younger than its TTL (on this host: and its process still runs)."""

VALID_FRACTION = 0.6
"""The share of the TTL after its last successful beat that a worker still acts on its lease.
The rest is the margin that keeps a slow owner and a new one from overlapping."""

BEATS_PER_TTL = 5

UNSERVED: Literal["unserved"] = "unserved"
"""``take_idle`` for a move only from a live worker that serves nothing (``SessionLease.take``)."""
TakeIdle = bool | Literal["unserved"]


@dataclass(frozen=True)
class LiveWorker:
    """A live worker as its latest beat describes it."""

    worker: str
    follows: bool
    """It follows the log (or, of an older release, does not say)."""
    agents: tuple[str, ...] | None
    """The agents its app defines; None: it does not say (an older release)."""
    upkeep: tuple[str, ...] = ()
    """The between-turn upkeep it does (``title``, ``compaction``) while it follows the log."""
    serves: bool = True
    """It serves (takes free sessions, wakes, takeovers), or, of an older release, does not say."""

    def defines(self, agent: str | None) -> bool:
        return agent is None or self.agents is None or agent in self.agents


class WorkerLease:
    """This process's worker: its id, its heartbeat thread, and the lease checks."""

    def __init__(self, registry: WorkerRegistry, *, ttl: float,
                 sessions: Callable[[], Iterable[str]] = tuple,
                 worker_id: str | None = None) -> None:
        if ttl <= 0:
            raise ValueError(f"the lease TTL must be positive, not {ttl}")
        self.registry = registry
        self.ttl = ttl
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.worker = worker_id or f"{self.host}:{self.pid}:{uuid4().hex[:8]}"
        self.started = time.time()
        self.upkeep: Callable[[], tuple[str, ...]] = tuple
        """The upkeep this worker does for the turns it runs now (said in each beat)."""
        self.follows: Callable[[], bool] = lambda: False
        """Whether this worker follows the log now (said in each beat: see ``serves_nothing``)."""
        self.agents: Callable[[], tuple[str, ...] | None] = lambda: None
        """The agents this worker's app defines (said in each beat: see ``live_workers``)."""
        self.serves: Callable[[], bool] = lambda: False
        """Whether this worker serves now (said in each beat: only serving workers are
        preferred for a free session — one that never tries would hold it up)."""
        self._sessions = sessions
        self._lock = threading.Lock()
        self._last_ok: float | None = None  # monotonic start of the last successful beat
        self._generation = 0
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    @property
    def valid_for(self) -> float:
        return self.ttl * VALID_FRACTION

    @property
    def interval(self) -> float:
        return self.ttl / BEATS_PER_TTL

    # --- the heartbeat ---------------------------------------------------------------------

    def ensure_beating(self) -> int:
        """Start the heartbeat if it is not running (beating once first, so a claim made right
        after holds a lease); returns the current lease generation."""
        with self._lock:
            if self._thread is None and not self._stop.is_set():
                self._beat_locked()
                thread = threading.Thread(target=self._run, name=f"terret-beat-{self.worker}",
                                          daemon=True)
                self._thread = thread
                thread.start()
            return self._generation

    def beat_now(self) -> None:
        """Beat at once (a pool member about to claim a session): its beat names the session
        before the claim, so that if it crashes mid-turn the others find the session in its
        last beat (``orphans``). Raises ``StoreError`` when the beat cannot be written: the
        claim must not go ahead unnamed."""
        with self._lock:
            if not self._beat_locked():
                raise StoreError(f"worker {self.worker} could not beat before a claim")

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            with self._lock:
                self._beat_locked()

    def _beat_locked(self) -> bool:
        start = time.monotonic()
        beat = WorkerBeat(worker=self.worker, host=self.host, pid=self.pid,
                          started=self.started, at=time.time(), ttl=self.ttl,
                          sessions=tuple(sorted(self._sessions())),
                          proc_start=process_start(self.pid), upkeep=self.upkeep(),
                          folds=_folds(), follows=self.follows(), agents=self.agents(),
                          serves=self.serves())
        try:
            self.registry.beat(beat)
        except StoreError as exc:
            log.warning("worker %s could not renew its lease: %s", self.worker, exc)
            return False
        if self._last_ok is not None and start - self._last_ok > self.valid_for:
            # The lease lapsed in between (frozen, starved, or cut off from the store): what
            # was owned under it may have been taken over. Let all of it go.
            self._generation += 1
            log.warning("worker %s: lease lapsed (%.1fs without a beat); letting go of every "
                        "session it owned", self.worker, start - self._last_ok)
        self._last_ok = start
        return True

    def stop(self, *, leave: bool = True) -> None:
        """Stop beating and leave the registry: the worker is gone at once. With ``leave``
        False (a turn did not stop in time and still holds its session) its last beat stays,
        so the others take the session over once it expires, as after a crash."""
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join(self.interval + 1.0)
        if leave and self._last_ok is not None:
            try:
                self.registry.leave(self.worker)
            except StoreError as exc:
                log.warning("worker %s could not leave the registry: %s", self.worker, exc)

    # --- checks ----------------------------------------------------------------------------

    @property
    def generation(self) -> int:
        with self._lock:
            return self._generation

    @property
    def stopped(self) -> bool:
        """``stop`` was called: the worker acts on nothing more."""
        return self._stop.is_set()

    def valid(self, generation: int) -> bool:
        """True while a lease taken at ``generation`` may still be acted on."""
        last = self._last_ok
        return (last is not None and generation == self._generation
                and time.monotonic() - last < self.valid_for)

    def lease_until(self) -> float:
        return time.time() + self.ttl

    def live_workers(self) -> list[LiveWorker]:
        """The workers alive by their beats (this one included, first), less those of this
        host whose process is gone, with what they say of themselves: one read of the
        registry serves every question a scan asks."""
        now = time.time()
        beats = [b for b in self.registry.beats()
                 if b.alive(now) and (b.host != self.host or process_running(b.pid, b.proc_start))]
        mine = LiveWorker(self.worker, True, self.agents(), self.upkeep(), self.serves())
        return [mine, *(LiveWorker(b.worker, b.follows is not False, b.agents, b.upkeep,
                                   b.serves is not False)
                        for b in beats if b.worker != self.worker)]

    def orphans(self) -> list[tuple[str, str]]:
        """(worker, session) for each session named in the last beat of a worker that is gone
        without leaving (its lease expired, or on this host its process did): what a failover
        takes over. A worker that stopped gracefully left the registry; it released its
        sessions in their logs."""
        now = time.time()
        return [(b.worker, s) for b in self.registry.beats()
                if b.worker != self.worker and b.sessions and not self._beat_alive(b, now)
                for s in b.sessions]

    def _beat_alive(self, beat: WorkerBeat, now: float) -> bool:
        if beat.host == self.host and not process_running(beat.pid, beat.proc_start):
            return False  # on this host a crash is seen at once, not when the lease expires
        return beat.alive(now)

    def alive(self, worker: str | None, now: float | None = None) -> bool:
        """Is ``worker`` (an owner named in a log) alive by its latest beat? A version 1 owner
        (no worker recorded) counts as gone."""
        if worker is None:
            return False
        if worker == self.worker:
            return self._last_ok is not None
        beat = self.registry.latest(worker)
        return beat is not None and self._beat_alive(beat, time.time() if now is None else now)

    @property
    def beating(self) -> bool:
        return self._thread is not None

    def folds(self, worker: str | None, wire_name: str) -> bool:
        """Does ``worker``'s running turn fold ``wire_name`` in when it lands (its beats'
        ``folds``: ``terret.domain.events.FOLDED_BEYOND_SEED`` in this release)? This
        worker's does; a gone worker runs nothing; a live one says so in its beats."""
        if worker == self.worker:
            return True
        beat = self.registry.latest(worker) if worker is not None else None
        if beat is None or not self._beat_alive(beat, time.time()):
            return True
        return wire_name in beat.folds

    def serves_nothing(self, worker: str | None) -> bool:
        """Is ``worker`` another live worker that says it follows no log (a runtime never
        started, as a web app's request worker): a wake on a session it holds idle reaches no
        one there. A worker of an older release does not say: it is taken as following."""
        if worker is None or worker == self.worker:
            return False
        beat = self.registry.latest(worker)
        return (beat is not None and beat.follows is False
                and self._beat_alive(beat, time.time()))

    def upkeeps(self, worker: str | None, purpose: str) -> bool:
        """Is ``worker`` another live worker that does this upkeep for the turns it runs?"""
        if worker is None or worker == self.worker:
            return False
        beat = self.registry.latest(worker)
        return (beat is not None and purpose in beat.upkeep
                and self._beat_alive(beat, time.time()))

    def preferred(self, key: str, live: Iterable[str]) -> str | None:
        """The live worker that should act first for ``key`` (rendezvous hashing: each key
        goes to one worker, and only the keys of a worker that joins or leaves move)."""
        ranked = self.ranked(key, live)
        return ranked[0] if ranked else None

    @staticmethod
    def ranked(key: str, live: Iterable[str]) -> list[str]:
        """The live workers in the order they should act for ``key`` (``preferred`` first)."""
        def score(worker: str) -> bytes:
            return hashlib.blake2b(f"{worker}|{key}".encode(), digest_size=8).digest()

        return sorted(live, key=score, reverse=True)


def _stat(pid: int) -> tuple[bytes, int] | None:
    """(state, start time) of process ``pid`` from Linux ``/proc``; None where unreadable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: count from its closing one.
    fields = stat[stat.rfind(b")") + 2:].split()
    try:
        return fields[0], int(fields[19])  # fields 3 (state) and 22 (starttime) of the line
    except (IndexError, ValueError):
        return None


def process_start(pid: int) -> int | None:
    """The start time of process ``pid`` as the OS counts it, None where it cannot be read."""
    stat = _stat(pid)
    return stat[1] if stat is not None else None


def process_running(pid: int, started: int | None) -> bool:
    """Whether the process that beat still runs on this host: gone, a zombie (killed, not yet
    reaped) or a reused pid is not running; a stopped one is (its lease decides). Unknown
    counts as running."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        pass  # it exists, owned by another user
    stat = _stat(pid)
    if stat is None:
        return True
    state, start = stat
    return state not in (b"Z", b"X") and (started is None or start == started)


def supervisor(lease: WorkerLease) -> Actor:
    from terret.domain.events import Actor

    return Actor(actor="supervisor", id=lease.worker)


class SessionLease:
    """One agent's hold on its session: the fencing epoch it attached with and the lease
    generation that attach was made under. Every owner write calls ``fence`` on the state it
    appends after; the loop calls ``check`` (no I/O) before each model request and tool call."""

    def __init__(self, lease: WorkerLease, agent_id: str) -> None:
        self.lease = lease
        self.agent_id = agent_id
        self.epoch: int | None = None
        self.generation = -1

    def held(self, s: Session) -> bool:
        owner = s.state.owner
        return (owner is not None and owner.agent_id == self.agent_id
                and s.state.epoch == self.epoch and self.lease.valid(self.generation))

    def fence(self, s: Session) -> None:
        if self.held(s):
            return
        owner = s.state.owner
        if owner is None or owner.agent_id != self.agent_id or s.state.epoch != self.epoch:
            who = f"worker {owner.worker}" if owner is not None else "nobody"
            raise LostOwnership(f"session {s.id}: epoch {s.state.epoch} is {who}'s now, not "
                                f"this agent's ({self.epoch}); it stops without writing")
        raise LostOwnership(f"session {s.id}: the lease of worker {self.lease.worker} lapsed; "
                            "it stops without writing")

    def check(self) -> None:
        """Fail safe before acting (a model request, a tool call): a lease that may have run
        out is not acted on, nor one whose worker stopped (``Runtime.close`` returned: a turn
        that overran the grace records what it has, but starts nothing more — its session is
        taken over when the lease expires, and a call started meanwhile could run twice)."""
        if self.lease.stopped:
            raise LostOwnership(f"agent {self.agent_id}: worker {self.lease.worker} has "
                                "stopped; stopping before acting")
        if self.epoch is None or not self.lease.valid(self.generation):
            raise LostOwnership(f"agent {self.agent_id}: the lease of worker "
                                f"{self.lease.worker} may have run out; stopping before acting")

    def take(self, s: Session, *, take_idle: TakeIdle) -> None:
        """Record this agent as the session's owner, unless it already is (R28). A session
        whose owner's lease expired is taken over; an idle one owned by a live worker only with
        ``take_idle`` (an explicit ``run_turn``: the caller chose this process; ``UNSERVED``:
        only from a live worker that serves nothing, as its latest beat says now — a serving
        worker taking a wake it would never hear of); otherwise ``SessionOwned``. Runs inside
        a writer command: on a conflict it decides again."""
        if self.held(s):
            return
        generation = self.lease.ensure_beating()
        owner = s.state.owner
        taking_over: Actor | None = None
        reason: str | None = None
        if owner is not None and owner.worker != self.lease.worker:
            worker = owner.worker
            if not self.lease.alive(worker):
                taking_over, reason = supervisor(self.lease), f"the lease of {worker} expired"
            elif take_idle and not s.turn_open and (
                    take_idle != UNSERVED or self.lease.serves_nothing(worker)):
                taking_over, reason = supervisor(self.lease), "idle session moved"
        self.epoch = s.attach(self.agent_id, self.lease.host, self.lease.pid, reason,
                              worker=self.lease.worker, lease_until=self.lease.lease_until(),
                              taking_over=taking_over)
        self.generation = generation

    def release(self, s: Session, reason: str) -> None:
        """Record the release if this agent still owns the session (nothing otherwise)."""
        owner = s.state.owner
        if owner is None or owner.agent_id != self.agent_id or s.state.epoch != self.epoch:
            return
        s.detach(self.agent_id, self.lease.host, self.lease.pid, reason,
                 worker=self.lease.worker)


def _folds() -> tuple[str, ...]:
    # Imported when a beat is made (a runtime has loaded the payloads by then), not with this
    # module: asking whether a worker lives loads no payload class.
    from terret.domain.events import FOLDED_BEYOND_SEED

    return FOLDED_BEYOND_SEED
