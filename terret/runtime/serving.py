"""Serving (``Runtime.serve_start``, ``terret serve``): which sessions this worker runs, and when.

Several workers may serve one store (a rolling deploy, a pool on one EventStoreDB, several
``serve`` on one SQLite host). Correctness comes from the fenced lease (``ownership``): a turn is
run only by the worker whose ``agent/attached`` is the log's latest, while its lease holds.
This module decides who *tries*:

* a session owned by a live worker is left to it (its wakes, verdicts and cancels reach it
  through its own subscription) — unless that worker says in its beats that it follows no log
  (a runtime never started) and the session waits idle on a wake: it is moved over (``UNSERVED``);
* a free session — never owned, released (``agent/detached``: a worker that stopped hands its
  turns off), or owned by a worker whose lease expired — is claimed first by its *preferred*
  worker (rendezvous hashing over the live workers, which spreads sessions evenly and moves only
  a leaving worker's), and by any other live worker once it has stayed free for ``grace``;
* every ``scan_interval`` (a fifth of the TTL, at most a second) the supervisor scans the
  sessions that need a worker (open turns, waking inbox entries): that is how an expired lease
  is noticed (failover) and how a session whose preferred worker did not act is picked up.

A pool member (``serve_start(group=...)``: ``terret serve --group`` on EventStoreDB) does not
search every session — its views follow only the sessions it serves. Its share of the events
that ask for a worker comes from the store's consumer group (``terret.runtime.pool``): the
member given one tries the session at once, with no preference and no grace; the scan goes over
the sessions its views hold (its own) and those named in the last beats of crashed workers
(``WorkerLease.orphans``).

A worker claims (appends ``agent/attached``) before it starts the turn on a thread of its own,
so the others see the session owned within milliseconds, however long the turn takes to start.
A worker that stops claims nothing more: ``AgentHost.release_all`` lets a claim under way land
first and releases it with the others (``RuntimeStopping`` for any later one).
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from uuid import UUID

from terret._text import one_line
from terret.domain import errors
from terret.domain.codec import RecordedEvent
from terret.domain.groups import GroupReader
from terret.domain.session import Session
from terret.projections.views import Views
from terret.runtime.agent import Agent, serving_wake
from terret.runtime.definition import TurnResult
from terret.runtime.host import AgentHost
from terret.runtime.ownership import UNSERVED, LiveWorker, TakeIdle, WorkerLease
from terret.runtime.pool import GroupFeed
from terret.runtime.stops import TurnSuspended
from terret.runtime.tools import describe_error
from terret.runtime.writer import SessionWriter, _Recent

log = logging.getLogger("terret.serving")

WOKEN_TURN_FAILED = "terret_woken_turn_failed"
"""Set on the record of a woken turn that failed: a process that says so itself (chat) leaves
the record out."""


@dataclass(frozen=True)
class ServingServices:
    """What serving needs besides the agent host (the ``Runtime`` builds it): the writer, the
    views and the worker's lease, the runtime's start and the views' catch-up, the stopping
    flag, the upkeep pool and the titler's and compactor's catch-ups."""

    writer: SessionWriter
    views: Views
    lease: WorkerLease
    stopping: threading.Event
    start: Callable[[], object]
    catch_up_views: Callable[[], None]
    background: Callable[[Callable[[], object]], None]
    title_left_undone: Callable[[UUID], None]
    compact_left_undone: Callable[[UUID, int], None]
    upkeep_left_by_the_dead: Callable[[Session], Callable[[], object] | None]
    """The title and compaction of a session's last turn, which its worker died before doing
    (a pool member's: it follows only the sessions it serves), as a task; None if none is
    left."""
    finish_purges_left_undone: Callable[[], None] = lambda: None
    """At serving start, in the background: the recent purges whose process stopped before it
    deleted the log (``Runtime._finish_purges_left_undone``)."""
    waits_unheld: Callable[[Session], bool] = lambda session: False
    """Whether the session's open turn waits on a person, held by no worker, until what it
    waits for is recorded (``Runtime._waits_unheld``): claiming it would only park it."""


LIVE_FOR = 0.25
"""Seconds a read of the live workers serves the preference (beats come every TTL/5)."""


class Supervisor:
    def __init__(self, host: AgentHost, services: ServingServices) -> None:
        self.host = host
        self.services = services
        self.serving = False
        self._free_since: dict[UUID, float] = {}
        # Bounded: a store shared with another app holds sessions this worker never serves,
        # and a set of every one refused would grow for as long as the worker runs (one past
        # the bound may be said again).
        self._refused: _Recent[UUID, str] = _Recent(4096)
        """The refusals said, by session: what was said last (the same is not said again)."""
        self._capped: set[UUID] = set()
        """Sessions a claim refused at the agent cap: the scan tries them again. A pool
        member's scan must (its group gave the message once and its views hold only its own
        sessions: the wake was lost); for a worker whose views hold every session, they are
        among those the views name anyway."""
        self._failed_at: dict[UUID, int] = {}
        """Sessions whose resumed turn failed and stayed open (a provider down), at the log's
        version then: tried again at the next stimulus — any event of the session — not at
        every scan (R16: each try appends a step, and a loop would burn the step limit)."""
        self._said_halted = False  # the status view's halt, said once (status_halted)
        self._live: tuple[float, list[LiveWorker]] = (float("-inf"), [])
        self._wakers: set[threading.Thread] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._held: list[UUID] | None = None
        """While ``serve_start`` gets ready: the sessions to wake once it is (None otherwise)."""
        self._held_notes: list[tuple[UUID, Exception]] = []
        self._feed: GroupFeed | None = None
        self._settled: set[tuple[str, str]] = set()
        """Orphans (worker, session) found settled: taken over, closed, or needing no one."""
        self._upkeep_since: dict[UUID, float] = {}
        """Idle sessions of crashed workers with upkeep left, since this worker first saw them
        (``_upkeep_of_the_dead``)."""

    @property
    def grace(self) -> float:
        return 2 * self.services.lease.interval

    # --- serving -------------------------------------------------------------------------

    def serve_start(self, on_ready: Callable[[list[UUID]], object] | None = None, *,
                    group: GroupReader | None = None) -> list[UUID]:
        """Claim and resume the open turns this worker should run (the rolling-deploy case:
        those of a live worker are left to it), wake sessions with a pending waking inbox;
        then keep serving as events arrive and the scan finds free sessions. ``on_ready`` is
        called with the open turns claimed once every claim is made and before any turn runs
        (``terret serve`` prints its serving line there): what the turns log, and the warnings
        about sessions left alone, come after it. With ``group`` (a pool member, ``pool``) the
        work comes from the group and from the beats of crashed workers, not from views of
        every session."""
        rt = self.services
        with self._lock:
            self._held = []
        try:
            rt.start()
            self.serving = True
            rt.catch_up_views()
            rt.lease.ensure_beating()
            if group is not None:  # read once ready (below): the group keeps what comes
                self._feed = GroupFeed(group, self.offer_chosen, rt.stopping)
            resumed = [sid for sid in rt.views.resumable_sessions()
                       if self._offer(sid, now=True)]
            resumed += self._take_orphans(now=True)
            for sid in rt.views.sessions_to_wake():
                self._offer(sid, now=True)
            if on_ready is not None:
                on_ready(resumed)
        finally:
            self._release_held()
        if self._feed is not None:
            self._feed.start()
        self._catch_up_after_a_beat()
        rt.background(rt.finish_purges_left_undone)
        self._thread = threading.Thread(target=self._scan_loop, name="terret-supervisor",
                                        daemon=True)
        self._thread.start()
        return resumed

    def _release_held(self) -> None:
        """Ready: say which sessions are left alone, then start the wakes held meanwhile."""
        with self._lock:
            held, self._held = self._held or [], None
            notes, self._held_notes = self._held_notes, []
        for sid, exc in notes:
            log.warning("not serving session %s: %s", sid, exc)
        for sid in dict.fromkeys(held):
            self.wake_later(sid)

    def stop(self) -> None:
        self.serving = False
        if self._feed is not None:
            self._feed.stop()  # first: what the group gives now goes to the other members

    def waiting_threads(self) -> list[threading.Thread]:
        """The threads a close waits for (within its grace) before the views are closed: the
        wakes, and the scan, which reads the views."""
        with self._lock:
            threads = [t for t in self._wakers if t.is_alive()]
        if self._thread is not None and self._thread.is_alive():
            threads.append(self._thread)
        return threads

    @property
    def scan_interval(self) -> float:
        """A fifth of the TTL, at most a second: a dead owner on this host is seen within it."""
        return min(self.services.lease.interval, 1.0)

    def _scan_loop(self) -> None:
        rt = self.services
        while not rt.stopping.wait(self.scan_interval):
            try:
                self.scan()
            except Exception as exc:  # a store outage: the next scan tries again
                if rt.stopping.is_set():
                    return  # the views or the store closed under a scan that outran the grace
                # A store outage, or views another process is resetting under this one (the
                # runner says what it does about that): one line. Anything else is a bug.
                expected = isinstance(exc, errors.TerretError | sqlite3.Error)
                log.warning("the serving scan failed (%s: %s); retrying", type(exc).__name__,
                            exc, exc_info=not expected)

    def scan(self) -> None:
        rt = self.services
        capped = self._still_capped()  # this worker's to retry: given to it, or seen first
        wanted = set(rt.views.resumable_sessions()) | set(rt.views.sessions_to_wake()) | capped
        orphans = self._orphans()
        with self._lock:
            self._free_since = {s: t for s, t in self._free_since.items()
                                if s in wanted or s in orphans}
            self._upkeep_since = {s: t for s, t in self._upkeep_since.items() if s in orphans}
        for sid in wanted:
            self._offer(sid, now=False, chosen=sid in capped)
        self._take_orphans(now=False, orphans=orphans)

    # --- a pool member -----------------------------------------------------------------------

    def offer_chosen(self, sid: UUID, leaving: str | None) -> None:
        """The pool's group chose this worker for ``sid`` (``pool``): try it now. A store that
        cannot be read raises ``StoreError`` (the group delivers the message again). A session
        that needs no worker now (idle: released between turns, or its wake already taken up)
        is left alone: claiming it would only hold an agent."""
        session = self.services.writer.load(sid)
        if _needs_worker(session):
            self._offer(sid, now=True, leaving=leaving, chosen=True)

    def _orphans(self) -> dict[UUID, str]:
        """A pool member's failover candidates: the sessions named in the last beats of
        crashed workers (no event says they need a worker), less those already settled. A
        worker whose views hold every session finds those in its status view — unless that
        view is halted (an event it cannot read): then in the beats too, as a member does."""
        if self._feed is None and not self.status_halted():
            return {}
        found: dict[UUID, str] = {}
        for worker, session in self.services.lease.orphans():
            if (worker, session) not in self._settled:
                try:
                    found[UUID(session)] = worker
                except ValueError:
                    self._settled.add((worker, session))
        return found

    def status_halted(self) -> bool:
        """Whether the status view is halted (said once): the scan's sessions to resume and
        wake come from it, and it holds nothing written after its halt."""
        fault = self.services.views.store.fault("status")
        if fault is not None and not self._said_halted:
            self._said_halted = True
            log.warning("the status view is halted at position %d (%s): this worker takes over "
                        "crashed workers' open turns from their last beats, but a turn released, "
                        "or a wake queued, after that position is not served until the view is "
                        "mended (`terret doctor` says how)", fault[0], one_line(fault[1], 200))
        return fault is not None

    def _take_orphans(self, *, now: bool, orphans: dict[UUID, str] | None = None
                      ) -> list[UUID]:
        """Claim the orphans this worker should take (see ``_first_to_try``); settled are
        those taken by another, closed, or needing no worker (idle, nothing waking)."""
        taken = []
        for sid, worker in (self._orphans() if orphans is None else orphans).items():
            try:
                session = self.services.writer.load(sid)
            except errors.StoreError:
                continue  # tried again at the next scan
            except errors.TerretError:  # purged, unreadable: nothing to take over
                self._settled.add((worker, str(sid)))
                continue
            owner = session.state.owner
            if session.closed or not _needs_worker(session) or (
                    owner is not None and owner.worker != worker):
                if owner is not None and owner.worker == worker and not session.closed \
                        and not self._upkeep_of_the_dead(sid, session):
                    continue  # looked at again at the next scan
                self._settled.add((worker, str(sid)))
            elif self._offer(sid, now=now):
                taken.append(sid)
        return taken

    def _upkeep_of_the_dead(self, sid: UUID, session: Session) -> bool:
        """A session between turns that a crashed worker owned: its last turn's title or
        compaction may be what the worker died doing (none of this member's events says so).
        The live workers that follow the log take it in rendezvous order, two lease TTLs
        apart — the aggregate keeps a title single, and a compaction declines when one
        covering its mark landed meanwhile. True once queued or when none is left; False: not
        yet this worker's to do."""
        task = self.services.upkeep_left_by_the_dead(session)
        if task is None:
            with self._lock:
                self._upkeep_since.pop(sid, None)
            return True
        with self._lock:
            first = self._upkeep_since.setdefault(sid, time.monotonic())
        lease = self.services.lease
        ranked = lease.ranked(str(sid), self._live_workers(following=True,
                                                           agent=session.state.agent))
        rank = ranked.index(lease.worker) if lease.worker in ranked else len(ranked)
        # One at a time, in rendezvous order: the first at once, each next one two TTLs
        # later (the one before may be no pool member, or of an older release that does not
        # say which agents it serves) — and each finds it done (the task is None) when one
        # before it did it.
        if time.monotonic() - first < rank * 2 * lease.ttl:
            return False
        with self._lock:
            self._upkeep_since.pop(sid, None)
        self.services.background(task)
        return True

    def _offer(self, sid: UUID, *, now: bool, leaving: str | None = None,
               chosen: bool = False) -> bool:
        """Start serving ``sid`` on a thread of its own if this worker should, now (at once if
        it was ``chosen`` for it); True if it did."""
        take_idle = self._should_try(sid, now=now, leaving=leaving, chosen=chosen)
        if take_idle is None or not self._claim(sid, now=now, take_idle=take_idle):
            return False
        self.wake_later(sid)
        return True

    def _should_try(self, sid: UUID, *, now: bool, leaving: str | None,
                    chosen: bool = False) -> TakeIdle | None:
        """Whether this worker should try to claim ``sid`` now — how, as the claim's
        ``take_idle``: False, or ``UNSERVED`` to move the idle session from a live worker that
        serves nothing — or not (None): it is free (or this worker's already, between turns),
        and this worker is the first to try (see the module). A worker that is stopping claims
        nothing more: it is releasing what it holds."""
        if not self.serving or self.services.stopping.is_set():
            return None
        agent = self.host.agent_for_session(sid)
        if agent is not None and agent.busy:
            return None
        try:
            session = self.services.writer.load(sid)
        except errors.TerretError:
            return None
        if session.closed or self._waits_for_a_stimulus(sid, session) \
                or self.services.waits_unheld(session):
            return None  # (a turn that waits on a person is claimed when its verdict comes)
        lease = self.services.lease
        owner = session.state.owner
        mine = owner is not None and owner.worker == lease.worker
        take_idle: TakeIdle = False
        if owner is not None and not mine and lease.alive(owner.worker):
            # A live worker owns it: its turns are its own — unless it serves nothing (a
            # runtime never started, as a web app's request worker: its beats name no upkeep)
            # and the session waits idle on a wake, which that worker never hears of.
            if session.turn_open or not lease.serves_nothing(owner.worker):
                return None
            take_idle = UNSERVED
        return take_idle if mine or chosen or self._first_to_try(
            sid, now=now, leaving=leaving, agent=session.state.agent) else None

    def _claim(self, sid: UUID, *, now: bool, take_idle: TakeIdle = False) -> bool:
        """Claim ``sid`` for this worker, now (its turn then runs on a thread of its own);
        ``take_idle``: moving it from a live worker that holds it idle (``UNSERVED``: only
        from one that serves nothing, as its latest beat says when the move is written)."""
        try:
            self.host.agent_for(sid, take_idle=take_idle, waking=True)
        except (errors.SessionOwned, errors.RuntimeStopping):
            return False  # another worker was quicker, or this one is stopping
        except errors.TerretError as exc:
            if isinstance(exc, errors.AgentCapExceeded):
                with self._lock:
                    self._capped.add(sid)  # tried again by the scan once an agent is free
            # Another app's agent, a tool it lacks, a closed session: not ours to serve. Said
            # once for the session, as long as the reason stays the same: a pool member given
            # its events one after the other (a new group replays the log) said it for each.
            # A wake refused at the cap (for now: it is tried again) is said each time.
            capped = isinstance(exc, errors.AgentCapExceeded)
            said = "the agent cap" if capped else str(exc)  # (its counts change: not the why)
            if (now and capped) or self._refused.get(sid) != said:
                self._not_serving(sid, exc)
            self._refused.put(sid, said)
            return False
        with self._lock:
            self._capped.discard(sid)
        return True

    def _still_capped(self) -> set[UUID]:
        """The sessions refused at the cap that still need a worker (the others forgotten)."""
        with self._lock:
            capped = set(self._capped)
        for sid in capped:
            try:
                session = self.services.writer.load(sid)
            except errors.StoreError:
                continue  # looked at again at the next scan
            except errors.TerretError:
                session = None  # purged: nothing to serve
            if session is None or session.closed or not _needs_worker(session):
                with self._lock:
                    self._capped.discard(sid)
        with self._lock:
            return set(self._capped)

    def _not_serving(self, sid: UUID, exc: Exception) -> None:
        with self._lock:
            if self._held is not None:  # getting ready: said once it is
                self._held_notes.append((sid, exc))
                return
        log.warning("not serving session %s: %s", sid, exc)

    def _live_workers(self, *, following: bool = False, agent: str | None = None,
                      serving: bool = False) -> list[str]:
        """The live workers (``following``: those that follow the log; ``agent``: those whose
        app defines it — another app's worker would only refuse the session; ``serving``: those
        that serve), read from the registry at most every ``LIVE_FOR`` seconds: a scan or a
        burst of wakes asks for every session it offers, one registry read serves them."""
        with self._lock:
            at, live = self._live
        if time.monotonic() - at >= LIVE_FOR:  # the read outside the lock: wakes take it too
            live = self.services.lease.live_workers()
            with self._lock:
                self._live = (time.monotonic(), live)
        return [w.worker for w in live if (w.follows or not following) and w.defines(agent)
                and (w.serves or not serving)]

    def _first_to_try(self, sid: UUID, *, now: bool, leaving: str | None = None,
                      agent: str | None = None) -> bool:
        rt = self.services
        # When no live worker defines the agent, one tries all the same and says it does not
        # serve the session: the operator learns that its app's workers are all down.
        # Only serving workers: a runtime that does not serve (a web app's request worker)
        # never tries, and preferred, it held the session up until the grace ran out.
        live = [w for w in self._live_workers(agent=agent, serving=True) if w != leaving] \
            or [w for w in self._live_workers(serving=True) if w != leaving]
        if rt.lease.preferred(str(sid), live) == rt.lease.worker:
            return True
        with self._lock:
            first = self._free_since.setdefault(sid, time.monotonic())
        return not now and time.monotonic() - first >= self.grace

    # --- events ----------------------------------------------------------------------------

    def on_inbox(self, event: RecordedEvent) -> None:
        sid = event.session_id
        if sid is None or not getattr(event.payload, "wake", False):
            return
        if self.host.agent_for_session(sid) is not None:
            self.wake_later(sid)
        elif self.serving:
            self._offer(sid, now=True)

    def on_turn_end(self, event: RecordedEvent) -> None:
        """A waking inbox entry that landed while a turn of this process ran, after its last
        step had taken the inbox, starts the next turn now: the wake that found the turn
        running did nothing, and a process that does not serve (no scan) would never look
        again."""
        sid = event.session_id
        if sid is None or self.host.agent_for_session(sid) is None \
                or self.services.stopping.is_set():
            return
        try:
            session = self.services.writer.load(sid)
        except errors.TerretError:
            return
        if not session.turn_open and not session.closed \
                and any(e.wake for e in session.pending_inbox().values()):
            self.wake_later(sid)

    def on_detached(self, event: RecordedEvent) -> None:
        """A worker let a session go (a graceful stop hands its open turn off here). An idle
        session it released needs no worker: claiming it would only hold an agent, and a
        server of another app would say it does not serve it, for every session let go."""
        sid = event.session_id
        if sid is None or not self.serving or self.services.stopping.is_set():
            return
        try:
            session = self.services.writer.load(sid)
        except errors.TerretError:
            return  # purged or unreadable: the scan sees what is left
        if _needs_worker(session):
            # The worker that let go is leaving (or handing off): prefer among the others.
            self._offer(sid, now=True, leaving=getattr(event.payload, "worker", None))

    # --- waking ----------------------------------------------------------------------------

    def wake_later(self, session_id: UUID) -> None:
        """Wake on a thread of its own: a woken turn may park on an approval for days, so it
        must not hold a worker of the upkeep pool."""
        if self.services.stopping.is_set():
            return
        thread = threading.Thread(target=partial(self._wake_here, session_id),
                                  name=f"terret-wake-{session_id}", daemon=True)
        with self._lock:
            if self._held is not None:  # serve_start is getting ready: woken once it is
                self._held.append(session_id)
                return
            self._wakers = {t for t in self._wakers if t.is_alive()} | {thread}
        thread.start()

    def _wake_here(self, session_id: UUID) -> None:
        """A wake's thread: the turn resumed or started here, its failure said in one line.
        Whatever it ran, the agent its claim made is then as any (``Agent.waking``)."""
        try:
            self._run_wake(session_id)
        finally:
            agent = self.host.agent_for_session(session_id)
            if agent is not None:
                agent.waking = False

    def _run_wake(self, session_id: UUID) -> None:
        try:
            agent = self._agent_to_wake(session_id)
        except _QUIET:
            return
        except errors.TerretError as exc:
            # Another app's agent, a closed session, the agent cap: not ours to serve.
            log.warning("not serving session %s: %s", session_id, exc)
            return
        if agent is None:
            return
        try:
            with serving_wake():  # its park may end to make room: no caller waits on it
                self._drive_wake(agent, waking_only=True)
            with self._lock:
                self._failed_at.pop(session_id, None)
        except _QUIET:
            pass
        except BaseException as exc:  # noqa: BLE001 - a tool's SystemExit too: said
            if not isinstance(exc, errors.StoreError):  # an outage: the scan tries again
                self._note_failed(session_id)
            # The turn ended failed (recorded); the session stays served here. A tool's
            # KeyboardInterrupt or SystemExit stops its turn, not the server (signals reach
            # the main thread only). One line per record, as serve promises: the traceback
            # only at DEBUG.
            log.error("session %s: the woken turn failed: %s", session_id,
                      " ".join(describe_error(exc).split()),
                      exc_info=log.isEnabledFor(logging.DEBUG),
                      extra={WOKEN_TURN_FAILED: True})

    def _note_failed(self, session_id: UUID) -> None:
        """A woken turn failed: if it stayed open, wait for a stimulus before trying again."""
        try:
            session = self.services.writer.load(session_id)
        except errors.TerretError:
            return
        if session.turn_open:
            with self._lock:
                self._failed_at[session_id] = session.version

    def _waits_for_a_stimulus(self, sid: UUID, session: Session) -> bool:
        """Its resume failed and nothing was recorded in the session since."""
        with self._lock:
            failed_at = self._failed_at.get(sid)
            if failed_at is not None and session.version != failed_at:
                del self._failed_at[sid]
                return False
        return failed_at is not None

    def wake(self, session_id: UUID, *, waking_only: bool = False) -> TurnResult | None:
        """Resume the session's open turn, or start one with its pending inbox (the loser of a
        race leaves its text in the inbox: it rides the winner's next step). A session a live
        worker owns is left to it (``SessionOwned``). Serving (``waking_only``) starts a turn
        only for an entry queued with ``wake``: one without rides the next turn, whoever
        starts it (a worker taking a released session over started a turn with it). A closed
        session is ``SessionClosed``: None would read as "idle, nothing to do"."""
        agent = self._agent_to_wake(session_id, closed_raises=True)
        return None if agent is None else self._drive_wake(agent, waking_only=waking_only)

    def _agent_to_wake(self, session_id: UUID, *, closed_raises: bool = False) -> Agent | None:
        """The session's agent in this process (claiming it); None for a closed session, or
        ``SessionClosed`` with ``closed_raises``."""
        if self.services.writer.load(session_id).closed:
            if closed_raises:
                raise errors.SessionClosed(f"session {session_id} is closed")
            return None
        return self.host.agent_for(session_id)

    def _drive_wake(self, agent: Agent, *, waking_only: bool) -> TurnResult | None:
        session = self.services.writer.load(agent.session_id)  # as claimed
        try:
            if session.turn_open:
                return self.host.drive(agent, agent.resume_turn)
            inbox = session.pending_inbox()
            if waking_only:
                inbox = {i: e for i, e in inbox.items() if e.wake}
            if not inbox:
                return None
            inbox_id, entry = next(iter(inbox.items()))
            return self.host.drive(agent, lambda: agent.run_turn(
                entry.text, trigger="wake", inbox_id=inbox_id, take_idle=False))
        except (errors.TurnAlreadyRunning, errors.TurnOpenInLog):
            return None

    def _catch_up_after_a_beat(self) -> None:
        """``_upkeep_left_undone``, one beat interval from now: workers started together (a
        fleet restarted at once) each saw none of the others' beats yet, counted itself first
        in the rendezvous order that leaves each upkeep to one of them, and asked — and paid
        for — the same title. By then each has beaten once, and the order is the same in
        each."""
        def later() -> None:
            if self.services.stopping.wait(self.services.lease.interval):
                return
            try:
                self._upkeep_left_undone()
            except Exception:  # noqa: BLE001 - a stopping worker's views may close under it
                if not self.services.stopping.is_set():
                    log.exception("the upkeep left undone could not be looked for")

        threading.Thread(target=later, name="terret-upkeep-catch-up", daemon=True).start()

    def _upkeep_left_undone(self) -> None:
        """The between-turn upkeep a process that ended a turn and stopped (or died) before it
        ran left undone: R20's title of a session's first turn (the aggregate refuses a
        second automatic title), and the compaction of a last turn that ended over the
        budget (refused if another process compacted meanwhile)."""
        rt = self.services
        between_turns: list[tuple[UUID, int]] = []  # idle, a turn ended: (session, that turn)
        for summary in rt.views.sessions():  # one read of the views for both
            if summary.closed or summary.last_turn is None:
                continue
            sid = UUID(summary.id)
            if summary.title is None:
                rt.background(partial(rt.title_left_undone, sid))
            if summary.status == "idle":
                between_turns.append((sid, int(summary.last_turn["turn"])))

        def compact_left_undone() -> None:
            for sid, turn in between_turns:
                rt.compact_left_undone(sid, turn)

        rt.background(compact_left_undone)


# What a woken session meets when it is not this worker's to run: said by nobody.
# (An agent let go at the cap before its woken turn began: the scan wakes the session again.)
_QUIET = (TurnSuspended, errors.SessionOwned, errors.LostOwnership, errors.RuntimeStopping,
          errors.AgentLetGo)


def _needs_worker(session: Session) -> bool:
    """An open turn to resume, or a waking inbox entry to start one with."""
    return session.turn_open or any(e.wake for e in session.pending_inbox().values())
