"""``Runtime``: the public entry point — sessions, turns, approvals, inbox, compaction, titles,
usage, the agent registry (R22) and ``serve``.

One runtime per process owns a projection runner (the store is the bus), a session writer (R5)
and a small worker pool for between-turn upkeep.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any
from uuid import UUID

from terret.domain import errors
from terret.domain.codec import RecordedEvent
from terret.domain.events import (
    Actor,
    AgentAttached,
    AgentDetached,
    ApprovalResolved,
    InboxQueued,
    InDoubtResolved,
    SessionClosed,
    SessionCompacted,
    SessionPurged,
    SessionStarted,
    TurnEnded,
    UserMessage,
)
from terret.domain.groups import GroupReader
from terret.domain.repository import SessionRepository
from terret.domain.session import Session
from terret.domain.store import RETENTION_STREAM, EventStore, as_session_id, session_stream
from terret.projections.base import ViewStore
from terret.projections.registry import serving_projections
from terret.projections.runner import ProjectionRunner
from terret.projections.views import Views
from terret.runtime._sessions import require_open, takes_session
from terret.runtime.agent import Agent, TurnServices
from terret.runtime.approvals import WAKING, ApprovalSignals
from terret.runtime.commands import SessionCommands
from terret.runtime.config import RuntimeConfig
from terret.runtime.deferred import Deferred
from terret.runtime.definition import AgentDefinition, TurnResult
from terret.runtime.hooks import BudgetCheck, BudgetGuard, PreStepHook
from terret.runtime.host import AgentHost
from terret.runtime.maintenance import (
    AutoTitler,
    Compactor,
    Titler,
    UpkeepServices,
    last_turn_end,
)
from terret.runtime.model import ModelResolver
from terret.runtime.ownership import SessionOwner, TakeIdle, WorkerLease
from terret.runtime.pool import WIRE_NAMES as POOL_WIRE_NAMES
from terret.runtime.serving import ServingServices, Supervisor
from terret.runtime.stops import (
    MOST_GRACE,
    STOP_MARGIN,
    STOP_RESERVE,
    TurnSuspended,
    finish_within,
)
from terret.runtime.summarizer import Summarizer
from terret.runtime.tools import ToolContext
from terret.runtime.writer import SessionWriter

__all__ = ["Runtime", "RuntimeConfig"]

UPKEEP_THREADS = 4
"""Threads of the upkeep pool (titles, compactions, deferred checks)."""

HANDED_OFF = "the store failed mid-turn: handed off to a serving worker"
HAND_OFF_FIRST_RETRY = 0.5
HAND_OFF_LAST_RETRY = 10.0
"""Seconds between a non-serving runtime's tries to hand off a turn the store stopped."""

log = logging.getLogger("terret.runtime")


class Runtime:
    stop_overran = False
    """Set by ``close`` when a last write did not finish within the grace and its margin: it
    still runs, on a thread the process's exit would wait for (``terret serve`` then ends the
    process at once, as after a crash: the lease expires)."""

    def __init__(
        self,
        store: EventStore,
        *,
        resolver: ModelResolver,
        views: ViewStore | str | os.PathLike[str] = ":memory:",
        config: RuntimeConfig | None = None,
        agents: Iterable[AgentDefinition] = (),
        summarizer: Summarizer | None = None,
        titler: Titler | None = None,
        pre_step: Sequence[PreStepHook] = (),
    ) -> None:
        agents = _check_parts(store, resolver, config, agents)
        self.store = store
        self.config = config or RuntimeConfig()
        self.resolver = resolver
        if not isinstance(views, ViewStore | str | os.PathLike):
            raise errors.ConfigurationError(
                f"views is a SQLite file's path, ':memory:' (the default) or a ViewStore, not "
                f"{views!r}")
        self.view_store = views if isinstance(views, ViewStore) else ViewStore(os.fspath(views))
        self.views = Views(self.view_store)
        self.runner = ProjectionRunner(store, self.view_store, serving_projections())
        self.repository = SessionRepository(store)
        self.writer = SessionWriter(self.repository)
        self.commands = SessionCommands(self.writer)
        """Every domain command on a session (the CLI and other front ends call it too)."""
        self.signals = ApprovalSignals()
        self.tool_context = ToolContext()
        self.definitions = {d.name: d for d in agents}
        self.pre_step: list[PreStepHook] = list(pre_step)
        self.budget_guard = BudgetGuard(self.config.spend_cap)
        # Upkeep makes model calls (a summary takes seconds): a few of them side by side, so a
        # busy session's summaries do not hold every other session's title back.
        self._pool = ThreadPoolExecutor(max_workers=UPKEEP_THREADS,
                                        thread_name_prefix="terret-upkeep")
        self._started = False
        self.stopping = threading.Event()
        self.closed = False  # close has ended: the session calls raise RuntimeStopping
        self._build_parts(summarizer, titler)

    def _build_parts(self, summarizer: Summarizer | None, titler: Titler | None) -> None:
        """The three parts, each given what it uses (never this runtime): maintenance, the
        agent host with its turn drivers, serving."""
        self.deferred = Deferred(self.background)
        upkeep = UpkeepServices(self.store, self.writer, self.views, self.resolver,
                                self.model_spec, self.background, self.catch_up_views,
                                self.defines, self.writer.ended_here, self._owner_upkeeps,
                                self.deferred.after, self.config.lease_ttl,
                                owner_folds=self._owner_folds, upkeep_rank=self._upkeep_rank,
                                answer_timeout=self.config.upkeep_timeout,
                                keeping=lambda sid: self.agent_host.keeping(sid))
        # Defaults: the role summarizer and role titler on the session's roles (R19, R20).
        self.compactor = Compactor(upkeep, summarizer, self.config.compaction_budget)
        self.titler = AutoTitler(upkeep, titler)
        self.agent_host = AgentHost(self.writer, max_agents=self.config.max_agents,
                                    definition=self._definition, make_agent=self._make_agent,
                                    watch=self._watch, unwatch=self._unwatch,
                                    follows=lambda sid: self.runner.follows(session_stream(sid)))
        self.lease = WorkerLease(self.store.workers(), ttl=self.config.lease_ttl,
                                 sessions=lambda: [str(s) for s in self.agent_host.session_ids()])
        self.lease.upkeep = self._upkeep_done_here
        self.lease.follows = lambda: bool(self._upkeep_done_here())  # started, following
        self.lease.agents = self.served_agents
        self._turn_services = self._turn_services_of()
        self.supervisor = Supervisor(self.agent_host, ServingServices(
            self.writer, self.views, self.lease, self.stopping, self.start,
            self.catch_up_views, self.background, self.titler.catch_up,
            self.compactor.catch_up, self._upkeep_left_by_the_dead,
            waits_unheld=self._waits_unheld,
            finish_purges_left_undone=self._finish_purges_left_undone))
        self.lease.serves = lambda: self.supervisor.serving and not self.stopping.is_set()
        self.host = self.lease.host

    def _turn_services_of(self) -> TurnServices:
        c = self.config
        return TurnServices(
            writer=self.writer, views=self.views, resolver=self.resolver,
            model_spec=self.model_spec, signals=self.signals, lease=self.lease,
            tool_context=self.tool_context, add_listener=self.runner.add_listener,
            wait_for=partial(self.wait_for, turn=True),
            catch_up_views=partial(self.catch_up_views, turn=True),
            budget_guard=self.budget_guard, pre_step=self.pre_step, stopping=self.stopping,
            max_steps=c.max_steps, approval_max_wait=c.approval_max_wait,
            waits_unheld=self._waits_unheld,
            tool_timeout=c.tool_timeout)

    def _waits_unheld(self, session: Session) -> bool:
        """Whether the session's open turn waits on a person, held by no worker, until what it
        waits for is recorded: an approval with no verdict (unless ``approval_max_wait`` gives
        this process a deadline to keep), a call in doubt with none, or — outside a pool, whose
        group may not carry ``budget/set`` — a budget that does not cover its next step. A
        serving worker does not claim such a turn, and sets its park aside at the cap."""
        state = session.state
        return state.waits_on_a_person(approvals=self.config.approval_max_wait is None) or (
            not self.runner.scoped and self.budget_guard.keeps_parked(state))

    def _make_agent(self, agent_id: str, session_id: UUID,
                    definition: AgentDefinition) -> Agent:
        return Agent(self._turn_services, agent_id, session_id, definition)

    # --- lifecycle -----------------------------------------------------------------------

    def start(self) -> Runtime:
        require_open(self)
        if self._started:
            return self
        r = self.runner
        r.add_listener(self.signals.on_event, WAKING)
        r.add_listener(self.compactor.on_turn_end, {TurnEnded.wire_name})
        r.add_listener(self.titler.on_turn_end, {TurnEnded.wire_name})
        r.add_listener(self.supervisor.on_inbox, {InboxQueued.wire_name})
        r.add_listener(self.supervisor.on_turn_end, {TurnEnded.wire_name})
        r.add_listener(self.supervisor.on_detached, {AgentDetached.wire_name})
        r.add_listener(self._on_closed, {SessionClosed.wire_name})
        r.add_listener(self._on_purged, {SessionPurged.wire_name})
        r.add_listener(self._on_attached, {AgentAttached.wire_name})
        r.start()
        self._started = True
        if self.lease.beating:  # it claimed sessions before: its beats say so from now on
            try:
                self.lease.beat_now()
            except errors.StoreError:
                pass  # the next beat says it
        return self

    def _upkeep_done_here(self) -> tuple[str, ...]:
        """The upkeep this process does for the turns it runs, as its beats say: what its
        listeners do while its runner follows the log (none once it stopped or failed)."""
        if not self._started or self.stopping.is_set() or self.runner.failure is not None:
            return ()
        return ("title", "compaction") if self.config.compaction_budget is not None \
            else ("title",)

    def _owner_folds(self, session: Session) -> bool:
        """May a summary land while the session's open turn runs? Yes unless its owner is
        another live worker of an older release, whose writer would take the summary for a
        takeover and stop the turn (it does not fold ``session/compacted`` in)."""
        owner = session.state.owner
        return owner is None or self.lease.folds(owner.worker, SessionCompacted.wire_name)

    def _upkeep_rank(self, session: Session, purpose: str) -> int:
        """This worker's place among the live workers that would do this upkeep of the
        session — they follow the log, define its agent and do it — in rendezvous order (0: the
        first, or this worker not among them, as before its first beat)."""
        live = [w.worker for w in self.lease.live_workers()
                if w.follows and w.defines(session.state.agent) and purpose in w.upkeep]
        ranked = self.lease.ranked(str(session.id), live)
        return ranked.index(self.lease.worker) if self.lease.worker in ranked else 0

    def _owner_upkeeps(self, session: Session, purpose: str, end_seq: int) -> bool:
        owner = session.state.owner
        if owner is None or not self.lease.upkeeps(owner.worker, purpose):
            return False
        # The owner is the worker that ran the turn only if the session has not moved since.
        moved = {AgentAttached.wire_name, AgentDetached.wire_name}
        tail = self.store.read_stream(session_stream(session.id), from_seq=end_seq + 1)
        return not any(record.wire_name in moved for record in tail)

    def close(self, *, grace: float = 10.0) -> None:
        """Stop: running turns stop at their next step boundary (parked ones at once) and stay
        open and resumable; nothing is lost. Then the sessions this worker owns are released
        (``agent/detached``, reason ``shutdown``), so another live worker takes their open turns
        over at once (R29). Closing twice is harmless."""
        if self.stopping.is_set():
            return
        if isinstance(grace, bool) or not isinstance(grace, int | float) \
                or not 0 <= grace <= MOST_GRACE:
            raise errors.ConfigurationError(f"close: grace is a number of seconds from 0 to "
                                            f"366 days, not {errors.shown(grace)}")
        self.supervisor.stop()
        self.stopping.set()
        for sid in self.agent_host.session_ids():
            self.signals.signal(sid)
        deadline = time.monotonic() + grace
        threads = self.agent_host.turn_threads()
        threads += self.supervisor.waiting_threads()
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        # Turns run on a caller's thread stop at the boundary too (parked ones at once): wait
        # for them within the grace, so that they are released below.
        while any(a.busy for a in self.agent_host.agents) and time.monotonic() < deadline:
            time.sleep(0.01)
        try:
            self._last_writes(deadline, grace)
        finally:
            self.closed = True  # before the views close: a caller meanwhile is told so
            self.view_store.close()

    def _last_writes(self, deadline: float, grace: float) -> None:
        """What a stop writes to the store once the turns stopped: the views caught up (for
        the upkeep listeners), the upkeep, the releases, the registry's leave — each bounded
        by the grace and a margin, so that a store that does not answer (an outage: each
        write retried for the store's timeout) cannot hold a stop past what its supervisor
        waits. Left undone, the lease expires and other workers take the sessions over, as
        after a crash. All of it within ``STOP_MARGIN`` past the grace, the catch-up included
        (it added its own second before the margin began)."""
        # What follows the last writes (closing the views; the caller's store) has a moment
        # of the margin: the stop as a whole ends within it.
        end = max(deadline, time.monotonic()) + STOP_MARGIN - STOP_RESERVE
        if self._started:
            # Deliver what this process wrote to the upkeep listeners (a turn/end to title or
            # compact), then let the queued upkeep finish: it is short and must not be lost.
            def catch_up() -> None:  # the head's read is the store's, as the wait
                try:
                    self.runner.wait_until(self._views_head(),
                                           max(0.1, deadline - time.monotonic()))
                except (TimeoutError, errors.TerretError):
                    log.warning("stopping before the views caught up; upkeep resumes at next "
                                "start")

            finish_within(min(max(deadline, time.monotonic() + 0.1) + 1.0, end),
                          "catching the views up", catch_up)
        self.deferred.close()
        upkeep = partial(self._pool.shutdown, wait=True)
        done = finish_within(end, "the between-turn upkeep", upkeep, UPKEEP_AT_WORK) \
            and finish_within(end, "releasing the sessions",
                              lambda: self.agent_host.release_all("shutdown"))
        if done:
            # A turn that did not stop within the grace keeps its session (not released):
            # the last beat stays in the registry so that it expires and another worker
            # takes over.
            left_running = self._left_running(grace)
            done = finish_within(end, "leaving the worker registry",
                                 lambda: self.lease.stop(leave=not left_running))
        else:  # its last beat stays: it expires (a beat stuck in a retry is not waited for)
            finish_within(end, "stopping the lease", partial(self.lease.stop, leave=False))
        done = finish_within(end, "stopping the views' subscription", self.runner.stop) and done
        self.stop_overran = not done

    def _left_running(self, grace: float) -> bool:
        """Whether a turn did not stop within the grace; each such is said in one line."""
        held = [a for a in self.agent_host.agents if a.busy]
        for agent in held:
            log.warning("session %s: its turn did not stop within the grace (%gs) and is left "
                        "as it is: not released, it is taken over when this worker's lease "
                        "expires (%gs); a tool call still running may then run again (one "
                        "of a tool that may not run twice is parked in doubt instead)",
                        agent.session_id, grace, self.lease.ttl)
        return bool(held)

    def __enter__(self) -> Runtime:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def background(self, task: Callable[[], object]) -> None:
        def run() -> None:
            try:
                task()
            except Exception:  # a pool's future keeps it unseen: said here instead
                log.exception("a between-turn task failed")

        try:
            self._pool.submit(run)
        except RuntimeError:
            pass  # shutting down

    def wait_for(self, position: int, *, turn: bool = False) -> None:
        """Until the views hold ``position``; ``TimeoutError`` after ``wait_timeout``. A
        turn's wait (``turn``) does not count the time another process's rebuild holds the
        views — the runner waits for it, and a turn failed by someone's slow or suspended
        rebuild would be work lost — and ends with ``TurnSuspended`` if this process stops
        meanwhile (the turn stays open and resumable)."""
        if not self._started:
            self.runner.catch_up()
        elif not turn:
            self.runner.wait_until(position, self.config.wait_timeout)
        elif not self.runner.wait_until(position, self.config.wait_timeout,
                                        stop=self.stopping.is_set):
            raise TurnSuspended("the process is stopping (its views were waiting for a "
                                "rebuild in another process)")

    def catch_up_views(self, session_id: UUID | None = None, *, turn: bool = False) -> None:
        """Wait until the views hold everything written so far — of one session, if given
        (for a pool member, one read of that session's stream rather than of all it serves)."""
        require_open(self)
        if session_id is not None:
            session_id = as_session_id(session_id)  # SessionNotFound for what is no id
        if session_id is not None and self.runner.scoped:
            self.wait_for(self.runner.scope_head(session_stream(session_id)), turn=turn)
        else:
            self.wait_for(self._views_head(), turn=turn)

    def _views_of(self, session_id: UUID) -> Views:
        """The views, caught up on ``session_id``; a pool member refuses a session it does not
        serve (its views hold only those it does: the answer would be empty, not true), and a
        session whose purge is recorded is ``PurgeUnfinished`` (the views forgot it)."""
        if not self.runner.follows(session_stream(session_id)):
            raise errors.RuntimeFault(
                f"session {session_id} is not served by this pool member, whose views hold "
                "only the sessions it serves: ask a runtime that is not a pool member (or "
                "`terret usage` / `terret sessions show`)")
        self.catch_up_views(session_id)
        self.views.require_not_purged(session_id, self.store)
        return self.views

    def _views_head(self) -> int:
        """The position the views must reach to hold everything written so far: the log's
        head, or for a pool member's scoped views the last event of the sessions it serves
        (its subscription passes other sessions' events only at the server's checkpoints)."""
        if self.runner.scoped:
            return self.runner.scope_head()
        return self.store.head_position()

    def define(self, definition: AgentDefinition) -> None:
        self.definitions[definition.name] = definition

    # --- sessions ------------------------------------------------------------------------

    def create_session(self, *, agent: str = "default", roles: dict[str, str] | None = None,
                       session_id: UUID | str | None = None) -> UUID:
        """A new session of ``agent`` (its id: ``session_id``, a UUID or its text — not a
        purged session's — else a new one); ``roles`` over the configuration's."""
        require_open(self)
        if roles is not None and not isinstance(roles, Mapping):
            raise errors.InvalidPayload(SessionStarted.wire_name, "roles", "a mapping of role "
                                        f"to 'provider:model' spec, not {type(roles).__name__}")
        if session_id is not None:
            try:
                session_id = as_session_id(session_id)
            except errors.SessionNotFound:
                raise errors.InvalidPayload(SessionStarted.wire_name, "session_id",
                                            f"a UUID or its text, not {errors.shown(session_id)}"
                                            ) from None
        definition = self._definition(agent)
        try:
            return self.commands.create(
                agent=definition.name, agent_revision=definition.revision,
                roles={**self.config.roles, **(roles or {})},
                policy_floor=list(definition.allow), session_id=session_id)
        except errors.StreamDeleted:
            raise self._purged_id(session_id) from None
        except errors.WrongExpectedVersion:
            # The log is there: a session's — or a purged one's still, expiring or left by a
            # purge that stopped before it deleted the log (its record says which).
            from terret.runtime.retention import purge_on_record

            assert session_id is not None  # a new id's stream is never there
            if purge_on_record(self.store, session_id, self.views) is not None:
                raise self._purged_id(session_id) from None
            raise

    @staticmethod
    def _purged_id(session_id: UUID | None) -> errors.InvalidPayload:
        return errors.InvalidPayload(
            SessionStarted.wire_name, "session_id", f"session {session_id} was purged: a "
            "purged session's id is never used again (its purge stays on record)")

    def _definition(self, name: str) -> AgentDefinition:
        """The definition that serves sessions of agent ``name``. The implicit ``default``
        agent (no tools, allowing nothing) exists only for a runtime that defines no agents at
        all: one that defines agents serves those alone, so that a session of another agent
        is left to the processes that define it, never run here without its tools."""
        if not self.defines(name):
            raise errors.ConfigurationError(f"no agent definition named {name!r}")
        return self.definitions.get(name) or AgentDefinition()

    def defines(self, agent: str) -> bool:
        """Whether this runtime serves sessions of ``agent`` (see ``_definition``)."""
        return agent in self.served_agents()

    def served_agents(self) -> tuple[str, ...]:
        """The agents whose sessions this runtime serves: those it defines, or ``default``
        when it defines none (see ``_definition``). Its beats name them."""
        return tuple(sorted(self.definitions)) or ("default",)

    def model_spec(self, session: Session, role: str) -> str:
        """The session's spec for ``role`` as its log records it (``session/started`` and
        ``model/set``, read through the aggregate so a change is seen by the very next step),
        else the deployment's."""
        spec = session.state.roles.get(role) or self.config.roles.get(role)
        if spec is None:
            raise errors.ConfigurationError(f"model role {role!r} is not configured")
        return spec

    @takes_session
    def close_session(self, session_id: UUID, *, by: Actor, reason: str | None = None) -> None:
        """Record ``session/closed``; this process's agent for it, if idle, lets it go at once
        (``agent/detached``, reason ``session closed``) — a started runtime's owner does the
        same for a close from any process, when it arrives through the subscription."""
        self.commands.close(session_id, by=by, reason=reason)
        self.agent_host.let_go(session_id, "session closed")

    def _on_closed(self, event: RecordedEvent) -> None:
        """A session closed (by any process): its agent here lets it go, off the runner's
        thread (a turn finishing may be waiting for the views)."""
        sid = event.session_id
        if sid is not None and self.agent_for_session(sid) is not None:
            self.background(partial(self.agent_host.let_go, sid, "session closed",
                                    wait=self.config.wait_timeout))

    def _on_purged(self, event: RecordedEvent) -> None:
        """A session purged (by any process), its close maybe never heard here: on a store that
        deletes at once, a purge right after the close leaves no ``session/closed`` for the
        subscription to read. Its agent here is let go all the same (its release cannot be
        written), so the worker stops listing a session that is gone."""
        try:
            sid = UUID(str(getattr(event.payload, "session_id", "")))
        except ValueError:
            return
        if self.agent_for_session(sid) is not None:
            self.background(partial(self.agent_host.let_go, sid, "session purged",
                                    wait=self.config.wait_timeout))
        # Recent ones only: a serve catching a new views file up on years of the log would
        # check every purge ever (doctor and the readers say when an older one is unfinished).
        if self.supervisor.serving and time.time() - event.recorded_at < FINISH_PURGES_WITHIN:
            self.background(partial(self._finish_purge, sid,
                                    getattr(event.payload, "max_age_seconds", None)))

    def _finish_purges_left_undone(self) -> None:
        """At serving start: the purges recorded in the last week that their process left
        unfinished (it stopped between the record and the deletion). Their records were read
        before this process served — at its start, or by a command on a shared views file — so
        the subscription brought none of them to ``_on_purged``."""
        from terret.runtime.retention import purges_left_undone

        try:
            _, undone = purges_left_undone(self.store, self.views, FINISH_PURGES_CHECKED,
                                           since=time.time() - FINISH_PURGES_WITHIN)
        except errors.TerretError as exc:
            log.warning("the purges left unfinished could not be looked for (%s); `terret "
                        "doctor` lists them", exc)
            return
        for purge in undone:
            try:
                sid = UUID(purge.id)
            except ValueError:  # another client's record: no session of Terret's
                continue
            self._finish_purge(sid, purge.max_age)

    def _finish_purge(self, session_id: UUID, max_age: int | None) -> None:
        """A purge whose process stopped between recording it and deleting the log (the
        views forgot the session, its events stayed): a serving process finishes it. Usually
        the purging process has already (or will: both deletions are the same)."""
        from terret.runtime.retention import finish_purge

        try:
            if finish_purge(self.store, session_id, max_age):
                log.info("session %s: finished its recorded purge", session_id)
        except errors.TerretError as exc:
            log.warning("session %s: its recorded purge could not be finished (%s); "
                        "`terret sessions purge %s --yes` finishes it", session_id, exc,
                        session_id)

    def session_gone(self, session_id: UUID) -> None:
        """A call found no session ``session_id`` (purged by another process): the idle agent
        this process holds for it is dropped, writing nothing — a runtime that follows no log
        hears of no purge, and kept the agent (listed as the session's live owner)."""
        agent = self.agent_for_session(session_id)
        if agent is not None and not agent.busy:
            log.info("session %s is gone (purged?): its agent here is dropped", session_id)
            self.agent_host.forget(agent)

    def _on_attached(self, event: RecordedEvent) -> None:
        """Another agent took a session this process holds an idle agent for (the idle
        session moved): that agent is dropped, off the runner's thread."""
        sid = event.session_id
        agent = self.agent_for_session(sid) if sid is not None else None
        if agent is not None and getattr(event.payload, "agent_id", None) != agent.id:
            self.background(partial(self.agent_host.drop_if_moved, agent.session_id))

    @takes_session
    def purge(self, session_id: UUID, *, by: Actor, reason: str | None = None,
              max_age: int | None = None) -> None:
        """Retention (R27): delete a closed session's stream; the deletion is recorded."""
        self.commands.purge(session_id, by=by, reason=reason, max_age=max_age)

    # --- the agent registry (R22) --------------------------------------------------------

    @takes_session
    def spawn_agent(self, session_id: UUID, *, agent_id: str | None = None,
                    take_idle: bool = True, _for_new_turn: bool = False) -> Agent:
        """Create this process's agent for the session and take ownership of it (R22, R28):
        ``SessionOwned`` if another live worker owns it (an idle one is moved here when
        ``take_idle``); a session whose owner's lease expired is taken over, attributed. The
        agent is yours until ``dispose_agent``: at ``max_agents`` the runtime lets go of the
        longest-idle agent it spawned on demand, never of one spawned here."""
        return self.agent_host.spawn(session_id, agent_id=agent_id, take_idle=take_idle,
                                     for_new_turn=_for_new_turn, pinned=True)

    def dispose_agent(self, agent_id: str, *, reason: str | None = None) -> None:
        self.agent_host.dispose(agent_id, reason=reason)

    @takes_session
    def agent_for_session(self, session_id: UUID) -> Agent | None:
        """This process's agent for the session, or None. A started runtime drops an agent
        whose session moved to another process when the move arrives; one never started has
        no subscription to bring it, so it looks in the log first."""
        if not self._started and self.agent_host.agent_for_session(session_id) is not None:
            self.agent_host.drop_if_moved(session_id)
        return self.agent_host.agent_for_session(session_id)

    @property
    def agents(self) -> list[Agent]:
        return self.agent_host.agents

    @takes_session
    def agent_for(self, session_id: UUID, *, take_idle: TakeIdle = False,
                  for_new_turn: bool = False) -> Agent:
        """This process's agent for the session, spawned (and owning it) if there is none."""
        return self.agent_host.agent_for(session_id, take_idle=take_idle,
                                         for_new_turn=for_new_turn)

    def drive(self, agent: Agent, turn: Callable[[], TurnResult]) -> TurnResult:
        """Run one of the agent's turn methods; an agent that lost its session is dropped
        from this process (it wrote nothing after losing it). A turn the store failed stays
        open: a runtime that does not serve hands it off once the store is back."""
        try:
            return self.agent_host.drive(agent, turn)
        except (errors.StoreUnavailable, errors.StoreFull):
            if not self.supervisor.serving and not self.stopping.is_set():
                self._hand_off_later(agent.session_id)
            raise

    def _hand_off_later(self, session_id: UUID, delay: float = HAND_OFF_FIRST_RETRY) -> None:
        """Release the session once the store takes writes again, unless the caller resumes
        the turn here first: a process that does not serve never resumes a turn by itself,
        and while it lived and held the session no serving worker would — the user's message
        waited for this process to end (a web app's worker: days). Tried again, later each
        time, while the store fails (never once the runtime closes)."""
        def hand_off() -> None:
            try:
                if self.agent_host.hand_off(session_id, HANDED_OFF):
                    log.info("session %s: its open turn, stopped by the store, is handed off "
                             "to a serving worker", session_id)
            except errors.SessionNotFound:
                return
            except errors.TerretError:
                self._hand_off_later(session_id, min(delay * 2, HAND_OFF_LAST_RETRY))

        self.deferred.after(delay, hand_off)

    # --- turns ---------------------------------------------------------------------------

    @takes_session
    def run_turn(self, session_id: UUID, text: str | None) -> TurnResult:
        """Start a turn here; an idle session another worker owns moves to this one (the
        caller chose this process), a running one is refused with ``SessionOwned``."""
        if text is not None and not isinstance(text, str):  # bytes were decoded silently
            raise errors.InvalidPayload(UserMessage.wire_name, "text",
                                        f"a string, not {type(text).__name__}")
        if text is not None and not text.strip():
            text = None  # only whitespace: nothing to answer (an empty turn, no model call)
        Session.check_turn_input(text=text)  # refused input (too large too) claims nothing
        try:
            # A racing worker's turn may also be found when this one starts its own (the
            # append conflicts, and the re-read shows the turn open): refused the same way.
            return self._on_agent(session_id, lambda agent: agent.run_turn(text),
                                  take_idle=True, for_new_turn=True)
        except errors.TurnOpenInLog:
            self._refuse_if_run_elsewhere(session_id)
            raise  # nobody is running it: a process died in it (R4)

    def _refuse_if_run_elsewhere(self, session_id: UUID) -> None:
        """``SessionOwned`` when the open turn is another live worker's: it is not one a
        process died in, and resuming it here would be refused too."""
        state = self.writer.load(session_id).state
        owner = state.owner
        if (owner is not None and owner.worker != self.lease.worker
                and self.lease.alive(owner.worker)):
            raise errors.SessionOwned(
                f"session {session_id} is running turn {state.turn} in worker {owner.worker} "
                f"(agent {owner.agent_id}, pid {owner.pid} on {owner.host}), whose lease is "
                "live") from None

    @takes_session
    def resume_turn(self, session_id: UUID) -> TurnResult:
        """Resume the open turn here (``SessionOwned`` while a live worker owns it;
        ``NoOpenTurn``, with nothing written, when no turn is open)."""
        self.agent_host.refuse_if_releasing()  # a closed runtime says so, turn open or not
        if not self.writer.load(session_id).turn_open:  # before attaching: a refusal writes nothing
            raise errors.NoOpenTurn(f"session {session_id} has no open turn to resume")
        return self._on_agent(session_id, lambda agent: agent.resume_turn())

    LOOKUPS = 5
    """Times a turn looks its agent up when another thread keeps letting it go at the cap."""

    def _on_agent(self, session_id: UUID, turn: Callable[[Agent], TurnResult], *,
                  take_idle: bool = False, for_new_turn: bool = False) -> TurnResult:
        """Run ``turn`` on the session's agent here. One let go at the agent cap between its
        lookup and the turn's start (``AgentLetGo``: nothing was written) is looked up again:
        the new one is the most recently used, the last the cap lets go."""
        lookups = 0
        while True:
            if self.stopping.is_set():  # before a spawn claims the session: nothing written
                raise errors.RuntimeStopping(
                    f"this runtime is closing: it runs no more turns (session {session_id})")
            agent = self.agent_for(session_id, take_idle=take_idle, for_new_turn=for_new_turn)
            lookups += 1
            try:
                return self.drive(agent, partial(turn, agent))
            except errors.AgentLetGo:
                if lookups == self.LOOKUPS:
                    raise

    @takes_session
    def resumable(self, session_id: UUID) -> bool:
        """R14: the log holds a ``turn/start`` with no ``turn/end`` after it."""
        return self.writer.load(session_id).turn_open

    @takes_session
    def owner(self, session_id: UUID) -> SessionOwner | None:
        """R28: the worker the log names as owning the session and whether it is alive now (by
        the store's worker registry), or None when nobody owns it (never claimed, let go, or
        closed). What ``resumable`` cannot say: an open turn whose owner is ``live`` is being
        run (``resume_turn`` here raises ``SessionOwned``); one whose owner is not is stalled."""
        state = self.writer.load(session_id).state
        found = state.owner
        if found is None or state.closed:
            return None
        live = (self.lease.valid(self.lease.generation) if found.worker == self.lease.worker
                else self.lease.alive(found.worker))  # this worker: while its lease holds
        return SessionOwner(found.agent_id, found.worker, found.host, found.pid, live=live)

    @takes_session
    def cancel(self, session_id: UUID, *, by: Actor, reason: str | None = None) -> bool:
        """R13: record the cancel first; the turn's owner then denies standing approvals and
        closes the turn ``cancelled`` at its next boundary (a parked turn at once). False, with
        nothing written, when the turn's cancel was recorded already (its first author and
        reason stand); the owner here is nudged either way."""
        recorded = self.commands.cancel(session_id, by=by, reason=reason)
        agent = self.agent_for_session(session_id)
        if agent is not None:
            agent.cancel_event.set()
        self.signals.signal(session_id)
        return recorded

    # --- approvals -----------------------------------------------------------------------

    @takes_session
    def pending(self, session_id: UUID) -> list[str]:
        """R10: the open turn's call ids still awaiting a verdict — none once the turn's
        cancel is recorded: closing the turn denies them, and a verdict on one is refused
        (``ApprovalNotPending``), so an approval UI must not offer it."""
        session = self.writer.load(session_id)
        if session.state.cancel_requested:
            return []
        return list(session.pending_approvals())

    @takes_session
    def approve(self, session_id: UUID, call_id: str, *, by: Actor,
                reason: str | None = None, name: str | None = None,
                args: dict[str, Any] | None = None) -> None:
        """Approve the pending call; with ``name`` and/or ``args``, only if it is pending for
        that tool and/or those arguments — the request you decided on (``ApprovalNotPending``
        otherwise: a model may ask again under the same id)."""
        self.commands.resolve(session_id, call_id, "approved", by=by, reason=reason,
                              name=name, args=args)

    @takes_session
    def deny(self, session_id: UUID, call_id: str, *, by: Actor, reason: str,
             name: str | None = None, args: dict[str, Any] | None = None) -> None:
        """Deny the pending call (the model sees ``reason``, which may not be blank);
        ``name``/``args`` as ``approve``."""
        _require_reason(ApprovalResolved.wire_name, reason)
        self.commands.resolve(session_id, call_id, "denied", by=by, reason=reason, name=name,
                              args=args)

    # --- calls in doubt (R15) -------------------------------------------------------------

    @takes_session
    def in_doubt(self, session_id: UUID) -> list[str]:
        """The open turn's calls in doubt: started, no result, waiting for a verdict."""
        return list(self.writer.load(session_id).in_doubt())

    @takes_session
    def rerun(self, session_id: UUID, call_id: str, *, by: Actor,
              reason: str | None = None, name: str | None = None,
              args: dict[str, Any] | None = None) -> None:
        """Let a call in doubt run again (it may have taken effect the first time); with
        ``name`` and/or ``args``, only if it is in doubt for that tool and/or those arguments,
        as ``approve`` (``CallNotInDoubt`` otherwise)."""
        self._resolve_doubt(session_id, call_id, "rerun", by, reason, name, args)

    @takes_session
    def skip(self, session_id: UUID, call_id: str, *, by: Actor, reason: str,
             name: str | None = None, args: dict[str, Any] | None = None) -> None:
        """Do not run a call in doubt again: the model gets an error result saying so (and
        ``reason``, which may not be blank); ``name``/``args`` as ``rerun``."""
        _require_reason(InDoubtResolved.wire_name, reason)
        self._resolve_doubt(session_id, call_id, "skipped", by, reason, name, args)

    def _resolve_doubt(self, session_id: UUID, call_id: str, verdict: str, by: Actor,
                       reason: str | None, name: str | None,
                       args: dict[str, Any] | None) -> None:
        self.commands.resolve_in_doubt(session_id, call_id, verdict, by=by, reason=reason,
                                       name=name, args=args)
        self.signals.signal(session_id)  # a turn parked on it here goes on at once

    # --- spend budget (R21) --------------------------------------------------------------

    @takes_session
    def set_budget(self, session_id: UUID, limit: float | None, *, by: Actor,
                   reason: str | None = None) -> None:
        """Give the session a budget of its own (None: back to ``spend_cap``); a turn parked on
        its budget goes on at once if the new one covers its next step."""
        self.commands.set_budget(session_id, limit, by=by, reason=reason)
        self.signals.signal(session_id)

    @takes_session
    def budget(self, session_id: UUID) -> BudgetCheck | None:
        """The session's budget in force, what it spent and the estimate of its next model
        call (None: no budget, of its own or a default)."""
        return self.budget_guard.check(self.writer.load(session_id).state)

    # --- inbox and wake (R24) ------------------------------------------------------------

    @takes_session
    def inject(self, session_id: UUID, text: str, *, wake: bool = False) -> str:
        return self.commands.inject(session_id, text, wake=wake)

    @takes_session
    def wake(self, session_id: UUID) -> TurnResult | None:
        """Resume the session's open turn, or start one with its pending inbox, here."""
        return self.supervisor.wake(session_id)

    # --- compaction, titles, policy, models ----------------------------------------------

    @takes_session
    def compact(self, session_id: UUID) -> int | None:
        return self.compactor.compact(session_id)

    @takes_session
    def set_title(self, session_id: UUID, title: str, *, by: Actor) -> str:
        return self.commands.set_title(session_id, title, by=by)

    @takes_session
    def set_policy(self, session_id: UUID, patterns: Sequence[str], *, by: Actor) -> None:
        self.commands.set_policy(session_id, patterns, by=by)

    @takes_session
    def reset_policy(self, session_id: UUID, *, by: Actor) -> None:
        """Withdraw the recorded allow-list (``policy/reset``): from the next call on, the
        floor of the agent definition that runs it applies (``AgentDefinition.allow``)."""
        self.commands.reset_policy(session_id, by=by)

    @takes_session
    def set_model(self, session_id: UUID, role: str, spec: str, *, by: Actor,
                  not_a_key: bool = False) -> None:
        """Point ``role`` at ``spec`` (``provider:model``); the session's next step uses it.
        A spec whose model looks like an API key (``sk-…``, a long random run) is refused
        (``InvalidPayload``) unless ``not_a_key=True``: recorded, a key stays in the log."""
        self.commands.set_model(session_id, role, spec, by=by, not_a_key=not_a_key)

    @takes_session
    def usage(self, session_id: UUID) -> dict[str, Any]:
        self.writer.load(session_id)  # SessionNotFound for a session no log holds
        return self._views_of(session_id).usage(session_id).as_dict()

    @takes_session
    def upkeep_usage(self, session_id: UUID) -> dict[str, dict[str, Any]]:
        """What the session's upkeep paid for apart from its steps (``usage``): the
        summarizer's and titler's metered model calls, by purpose (``compaction``, ``title``),
        each ``{prompt_tokens, completion_tokens, cost, steps}`` with ``steps`` counting the
        calls. Its budget counts them."""
        self.writer.load(session_id)  # SessionNotFound for a session no log holds
        return {purpose: totals.as_dict()
                for purpose, totals in self._views_of(session_id).upkeep_usage(session_id).items()}

    @takes_session
    def title(self, session_id: UUID) -> str | None:
        self.writer.load(session_id)  # SessionNotFound for a session no log holds
        return self._views_of(session_id).title(session_id)

    # --- serving -------------------------------------------------------------------------

    def serve_start(self, on_ready: Callable[[list[UUID]], object] | None = None, *,
                    group: str | None = None) -> list[UUID]:
        """Serve the store's sessions from this worker (see ``terret.runtime.serving``):
        returns the open turns it resumed at start. ``on_ready`` is called with them once they
        are claimed, before any of them runs, so that what it reports precedes what the turns
        log.

        ``group`` makes this worker a member of a pool (``terret.runtime.pool``) on a store
        with consumer groups (EventStoreDB): the group gives each member its share of the
        sessions asking for a worker, and this runtime's views follow only the sessions it
        serves — it receives no other session's events, and ``views`` must be empty (in
        memory, the default). On a store without groups (SQLite, memory) it is ignored: every
        worker follows every session. Call it on a runtime not started yet."""
        reader = None
        if group is not None:
            reader = self._join_pool(group)
        return self.supervisor.serve_start(on_ready, group=reader)

    def _join_pool(self, group: str) -> GroupReader | None:
        if self._started:
            raise errors.RuntimeFault("serve_start(group=...) needs a runtime not started yet")
        if self.runner.position > 0:
            raise errors.RuntimeFault(
                "a pool member's views hold only the sessions it serves: give it views that "
                "hold nothing yet (the default, in memory)")
        reader = self.store.consumer_group(group, wire_names=POOL_WIRE_NAMES)
        if reader is None:
            log.info("this store has no consumer groups: serving follows every session")
            return None
        # The retention stream too: a purge makes the member's views forget the session and
        # let its agent go, and a purge whose process stopped half-way is finished here.
        self.runner.scope_to([RETENTION_STREAM])
        return reader

    def _watch(self, session_id: UUID) -> None:
        """Before a claim: a pool member's views take the session in, and its beat names it
        (the agent is registered by now) — a crash mid-turn is found in its last beat."""
        if self.runner.scoped:
            self.runner.watch(session_stream(session_id))
            self.lease.beat_now()
        elif self.supervisor.serving and self.supervisor.status_halted():
            self.lease.beat_now()  # the others find its turns in its beats, not in the view

    def _unwatch(self, session_id: UUID) -> None:
        self.runner.unwatch(session_stream(session_id))

    def _upkeep_left_by_the_dead(self, session: Session) -> Callable[[], object] | None:
        """The upkeep of a session's last turn (ended) that its worker died before doing, as a
        task for the upkeep pool; None when none is left (titled, compacted since, no
        compaction budget here, another app's agent). A pool member finds the session in that
        worker's last beat — nothing else tells it, as it follows only the sessions it serves:
        its views take the session in for the task and let it go after (``watching``)."""
        s = session.state
        untitled = not s.titled
        uncompacted = (self.config.compaction_budget is not None
                       and s.compacted_upto < s.turn_ended_seq)
        if s.turn_open or not s.turn or not (untitled or uncompacted) \
                or not self.defines(s.agent):
            return None
        sid, turn = session.id, s.turn

        def upkeep() -> None:
            end = last_turn_end(self.store, sid)
            if end is None:
                return
            with self.agent_host.watching(sid):
                self.titler.catch_up(sid, end)
                self.compactor.catch_up(sid, turn, end)

        return upkeep


def _require_reason(wire_name: str, reason: str) -> None:
    """The model is shown the reason of a denial or a skip: a blank one tells it nothing."""
    if not isinstance(reason, str) or not reason.strip():
        raise errors.InvalidPayload(wire_name, "reason", "give the model a reason")


UPKEEP_AT_WORK = "a summarizer or titler still at work, or the store does not answer"
"""Why the upkeep may not finish within a stop's grace."""

FINISH_PURGES_WITHIN = 7 * 24 * 3600.0
"""Seconds after its record that a serving process still finishes a purge it hears of."""
FINISH_PURGES_CHECKED = 1000
"""How many of the latest purges a serving start looks through for unfinished ones (each one
in the last week costs a read of the store)."""


def _one_of_each_name(agents: Iterable[AgentDefinition]) -> list[AgentDefinition]:
    """``ConfigurationError`` for two definitions of one name: the last one won, silently —
    sessions ran under a definition nobody chose."""
    agents = list(agents)
    names = [d.name for d in agents]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise errors.ConfigurationError(
            f"two agent definitions named {', '.join(map(repr, twice))}: an agent's name is "
            "its sessions' key, one definition each (its revision says which release)")
    return agents


def _check_parts(store: object, resolver: object, config: object,
                 agents: Iterable[AgentDefinition]) -> list[AgentDefinition]:
    """``ConfigurationError`` for a part of the wrong kind, when the runtime is made: a dict
    given as the resolver failed the first turn with an ``AttributeError``. The agents, as a
    list (``_one_of_each_name``)."""
    if not isinstance(store, EventStore):
        raise errors.ConfigurationError(
            f"store is an EventStore (terret.open_store('terret.db') or an esdb:// URI), not "
            f"{type(store).__name__}")
    if not callable(getattr(resolver, "resolve", None)):
        raise errors.ConfigurationError(
            "resolver has a resolve(spec) method (terret.StaticResolver({'name': provider}), "
            f"a ProviderRegistry), not {type(resolver).__name__}")
    if config is not None and not isinstance(config, RuntimeConfig):
        raise errors.ConfigurationError(
            f"config is a RuntimeConfig or None, not {type(config).__name__}")
    return _one_of_each_name(agents)
