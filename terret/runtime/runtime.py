"""``Runtime``: the public entry point — sessions, turns, approvals, inbox, compaction, titles,
usage, the agent registry (R22) and ``serve``.

One runtime per process owns a projection runner (the store is the bus), a session writer (R5)
and a small worker pool for between-turn upkeep.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any
from uuid import UUID, uuid4

from terret.domain import errors
from terret.domain.events import Actor
from terret.domain.repository import SessionRepository
from terret.domain.session import MAX_STEPS, Session
from terret.domain.store import EventStore
from terret.projections.base import ViewStore
from terret.projections.runner import ProjectionRunner
from terret.projections.views import Views, default_projections
from terret.runtime.agent import Agent, AgentDefinition, TurnResult
from terret.runtime.approvals import WAKING, ApprovalSignals
from terret.runtime.commands import SessionCommands
from terret.runtime.hooks import BudgetCheck, BudgetGuard, PreStepHook
from terret.runtime.maintenance import AutoTitler, Compactor, Titler
from terret.runtime.model import ModelResolver
from terret.runtime.ownership import WorkerLease
from terret.runtime.serving import Supervisor
from terret.runtime.summarizer import Summarizer
from terret.runtime.tools import ToolContext
from terret.runtime.writer import SessionWriter

log = logging.getLogger("terret.runtime")


@dataclass
class RuntimeConfig:
    """Deployment settings. ``roles`` maps model roles to ``provider:model`` specs; sessions
    record their own at start and ``model/set`` changes them."""

    roles: dict[str, str] = field(default_factory=lambda: {"main": "scripted:default"})
    max_steps: int = MAX_STEPS
    max_agents: int = 128
    compaction_budget: int | None = None
    approval_max_wait: float | None = None
    spend_cap: float | None = None
    """The default spend budget (lifetime cost) of every session: a turn whose next step would
    pass it parks until a budget covers it (``set_budget``, ``terret budget set``)."""
    wait_timeout: float = 30.0
    lease_ttl: float = 15.0
    """Seconds a worker's ownership of a session outlives its last heartbeat (R28, R29): after
    a crash another worker takes the open turn over this long after the last beat."""
    tool_timeout: float | None = None
    """Seconds a tool's handler may run, for tools without their own ``timeout``; None: no
    limit."""


def _release(agent: Agent, reason: str, s: Session) -> None:
    agent.ownership.release(s, reason)


class Runtime:
    def __init__(
        self,
        store: EventStore,
        *,
        resolver: ModelResolver,
        views: ViewStore | str = ":memory:",
        config: RuntimeConfig | None = None,
        agents: Iterable[AgentDefinition] = (),
        summarizer: Summarizer | None = None,
        titler: Titler | None = None,
        pre_step: Sequence[PreStepHook] = (),
    ) -> None:
        self.store = store
        self.config = config or RuntimeConfig()
        self.resolver = resolver
        self.view_store = views if isinstance(views, ViewStore) else ViewStore(views)
        self.views = Views(self.view_store)
        self.runner = ProjectionRunner(store, self.view_store, default_projections())
        self.repository = SessionRepository(store)
        self.writer = SessionWriter(self.repository)
        self.commands = SessionCommands(self.writer)
        """Every domain command on a session (the CLI and other front ends call it too)."""
        self.signals = ApprovalSignals()
        self.tool_context = ToolContext()
        self.definitions: dict[str, AgentDefinition] = {}
        for definition in agents:
            self.define(definition)
        self.pre_step: list[PreStepHook] = list(pre_step)
        self.budget_guard = BudgetGuard(self.config.spend_cap)
        # Defaults: the role summarizer and role titler on the session's roles (R19, R20).
        self.compactor = Compactor(self, summarizer, self.config.compaction_budget)
        self.titler = AutoTitler(self, titler)
        self._agents: dict[str, Agent] = {}
        self._by_session: dict[UUID, Agent] = {}
        self._registry_lock = threading.RLock()
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="terret-upkeep")
        self._started = False
        self.stopping = threading.Event()
        self.lease = WorkerLease(store.workers(), ttl=self.config.lease_ttl,
                                 sessions=lambda: [str(s) for s in list(self._by_session)])
        self.supervisor = Supervisor(self)
        self.host = self.lease.host

    # --- lifecycle -----------------------------------------------------------------------

    def start(self) -> Runtime:
        if self._started:
            return self
        r = self.runner
        r.add_listener(self.signals.on_event, WAKING)
        r.add_listener(self.compactor.on_turn_end, {"turn/end"})
        r.add_listener(self.titler.on_turn_end, {"turn/end"})
        r.add_listener(self.supervisor.on_inbox, {"inbox/queued"})
        r.add_listener(self.supervisor.on_detached, {"agent/detached"})
        r.start()
        self._started = True
        return self

    def close(self, *, grace: float = 10.0) -> None:
        """Stop: running turns stop at their next step boundary (parked ones at once) and stay
        open and resumable; nothing is lost. Then the sessions this worker owns are released
        (``agent/detached``, reason ``shutdown``), so another live worker takes their open turns
        over at once (R29). Closing twice is harmless."""
        if self.stopping.is_set():
            return
        self.supervisor.stop()
        self.stopping.set()
        for sid in list(self._by_session):
            self.signals.signal(sid)
        deadline = time.monotonic() + grace
        threads = [a._thread for a in list(self._agents.values()) if a._thread is not None]
        threads += self.supervisor.waiting_threads()
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if self._started:
            # Deliver what this process wrote to the upkeep listeners (a turn/end to title or
            # compact), then let the queued upkeep finish: it is short and must not be lost.
            try:
                self.runner.wait_until(self.store.head_position(),
                                       max(0.1, deadline - time.monotonic()))
            except (TimeoutError, errors.TerretError):
                log.warning("stopping before the views caught up; upkeep resumes at next start")
        self._pool.shutdown(wait=True)
        self._release_all("shutdown")
        self.lease.stop()
        self.runner.stop()
        self.view_store.close()

    def __enter__(self) -> Runtime:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def background(self, task: Callable[[], object]) -> None:
        try:
            self._pool.submit(task)
        except RuntimeError:
            pass  # shutting down

    def wait_for(self, position: int) -> None:
        if self._started:
            self.runner.wait_until(position, self.config.wait_timeout)
        else:
            self.runner.catch_up()

    def catch_up_views(self) -> None:
        self.wait_for(self.store.head_position())

    def define(self, definition: AgentDefinition) -> None:
        self.definitions[definition.name] = definition

    # --- sessions ------------------------------------------------------------------------

    def create_session(self, *, agent: str = "default", roles: dict[str, str] | None = None,
                       session_id: UUID | None = None) -> UUID:
        definition = self._definition(agent)
        return self.commands.create(agent=definition.name, agent_revision=definition.revision,
                                    roles={**self.config.roles, **(roles or {})},
                                    policy_floor=list(definition.allow), session_id=session_id)

    def _definition(self, name: str) -> AgentDefinition:
        if name not in self.definitions:
            if name == "default":
                return AgentDefinition()
            raise errors.ConfigurationError(f"no agent definition named {name!r}")
        return self.definitions[name]

    def model_spec(self, session: Session, role: str) -> str:
        """The session's spec for ``role`` as its log records it (``session/started`` and
        ``model/set``, read through the aggregate so a change is seen by the very next step),
        else the deployment's."""
        spec = session.state.roles.get(role) or self.config.roles.get(role)
        if spec is None:
            raise errors.ConfigurationError(f"model role {role!r} is not configured")
        return spec

    def close_session(self, session_id: UUID, *, by: Actor, reason: str | None = None) -> None:
        self.commands.close(session_id, by=by, reason=reason)
        agent = self._by_session.get(session_id)
        if agent is not None and not agent.busy:
            self.dispose_agent(agent.id, reason="session closed")

    def purge(self, session_id: UUID, *, by: Actor, reason: str | None = None,
              max_age: int | None = None) -> None:
        """Retention (R27): delete a closed session's stream; the deletion is recorded."""
        self.commands.purge(session_id, by=by, reason=reason, max_age=max_age)

    # --- the agent registry (R22) --------------------------------------------------------

    def spawn_agent(self, session_id: UUID, *, agent_id: str | None = None,
                    take_idle: bool = True, _for_new_turn: bool = False) -> Agent:
        """Create this process's agent for the session and take ownership of it (R22, R28):
        ``SessionOwned`` if another live worker owns it (an idle one is moved here when
        ``take_idle``); a session whose owner's lease expired is taken over, attributed."""
        with self._registry_lock:
            agent_id = agent_id or f"agent-{uuid4().hex[:12]}"
            if agent_id in self._agents:
                raise errors.AgentExists(f"agent id {agent_id!r} is taken")
            if session_id in self._by_session:
                raise errors.AgentExists(
                    f"session {session_id} already has agent {self._by_session[session_id].id}")
            if len(self._agents) >= self.config.max_agents:
                raise errors.AgentCapExceeded(
                    f"this process already holds {self.config.max_agents} agents")
            session = self.writer.load(session_id)
            if session.closed:
                raise errors.SessionClosed(f"session {session_id} is closed")
            if _for_new_turn:
                # R4: a refusal appends nothing, not even the attach it would have needed.
                session.require_no_open_turn()
            agent = Agent(self, agent_id, session_id,
                          self._definition(session.state.agent))
            self._agents[agent_id] = agent
            self._by_session[session_id] = agent
        try:
            self.writer.execute(session_id,
                                lambda s: agent.ownership.take(s, take_idle=take_idle))
        except BaseException:
            self._forget_agent(agent)
            raise
        return agent

    def dispose_agent(self, agent_id: str, *, reason: str | None = None) -> None:
        with self._registry_lock:
            agent = self._agents.get(agent_id)
            if agent is None:
                raise errors.RuntimeFault(f"no agent {agent_id!r}")
            if agent.busy:
                raise errors.AgentBusy(f"agent {agent_id} is {agent.status}; only idle agents "
                                       "can be disposed")
            self._forget_agent(agent)
        self.writer.execute(agent.session_id,
                            lambda s: agent.ownership.release(s, reason or "disposed"))

    def _release_all(self, reason: str) -> None:
        """Release every session this worker still owns (a graceful stop): nothing is written
        for a session it lost meanwhile."""
        for agent in list(self._agents.values()):
            if agent.busy:
                continue  # a turn that did not stop in time keeps its lease until it expires
            try:
                self.writer.execute(agent.session_id, partial(_release, agent, reason))
            except errors.TerretError as exc:
                log.warning("session %s not released (%s); its lease expires instead",
                            agent.session_id, exc)

    def _forget_agent(self, agent: Agent) -> None:
        with self._registry_lock:
            agent.release()
            self._agents.pop(agent.id, None)
            if self._by_session.get(agent.session_id) is agent:
                del self._by_session[agent.session_id]

    def agent_for_session(self, session_id: UUID) -> Agent | None:
        return self._by_session.get(session_id)

    @property
    def agents(self) -> list[Agent]:
        return list(self._agents.values())

    def agent_for(self, session_id: UUID, *, take_idle: bool = False,
                  for_new_turn: bool = False) -> Agent:
        """This process's agent for the session, spawned (and owning it) if there is none."""
        # Under the registry lock: two racing callers must share one agent, not collide on a
        # spawn (the loser would see AgentExists instead of TurnAlreadyRunning).
        with self._registry_lock:
            return self.agent_for_session(session_id) or self.spawn_agent(
                session_id, take_idle=take_idle, _for_new_turn=for_new_turn)

    def drive(self, agent: Agent, turn: Callable[[], TurnResult]) -> TurnResult:
        """Run one of the agent's turn methods; an agent that lost its session is dropped
        from this process (it wrote nothing after losing it)."""
        try:
            return turn()
        except errors.LostOwnership:
            self._forget_agent(agent)
            raise

    # --- turns ---------------------------------------------------------------------------

    def run_turn(self, session_id: UUID, text: str | None) -> TurnResult:
        """Start a turn here; an idle session another worker owns moves to this one (the
        caller chose this process), a running one is refused with ``SessionOwned``."""
        agent = self.agent_for(session_id, take_idle=True, for_new_turn=True)
        return self.drive(agent, lambda: agent.run_turn(text))

    def resume_turn(self, session_id: UUID) -> TurnResult:
        """Resume the open turn here (``SessionOwned`` while a live worker owns it)."""
        agent = self.agent_for(session_id)
        return self.drive(agent, agent.resume_turn)

    def resumable(self, session_id: UUID) -> bool:
        """R14: the log holds a ``turn/start`` with no ``turn/end`` after it."""
        return self.writer.load(session_id).turn_open

    def cancel(self, session_id: UUID, *, by: Actor, reason: str | None = None) -> None:
        """R13: record the cancel first; the turn's owner then denies standing approvals and
        closes the turn ``cancelled`` at its next boundary (a parked turn at once)."""
        self.commands.cancel(session_id, by=by, reason=reason)
        agent = self.agent_for_session(session_id)
        if agent is not None:
            agent.cancel_event.set()
        self.signals.signal(session_id)

    # --- approvals -----------------------------------------------------------------------

    def pending(self, session_id: UUID) -> list[str]:
        """R10: the open turn's call ids still awaiting a verdict."""
        return list(self.writer.load(session_id).pending_approvals())

    def approve(self, session_id: UUID, call_id: str, *, by: Actor,
                reason: str | None = None) -> None:
        self._resolve(session_id, call_id, "approved", by, reason)

    def deny(self, session_id: UUID, call_id: str, *, by: Actor, reason: str) -> None:
        self._resolve(session_id, call_id, "denied", by, reason)

    def _resolve(self, session_id: UUID, call_id: str, verdict: str, by: Actor,
                 reason: str | None) -> None:
        self.commands.resolve(session_id, call_id, verdict, by=by, reason=reason)

    # --- calls in doubt (R15) -------------------------------------------------------------

    def in_doubt(self, session_id: UUID) -> list[str]:
        """The open turn's calls in doubt: started, no result, waiting for a verdict."""
        return list(self.writer.load(session_id).in_doubt())

    def rerun(self, session_id: UUID, call_id: str, *, by: Actor,
              reason: str | None = None) -> None:
        """Let a call in doubt run again (it may have taken effect the first time)."""
        self._resolve_doubt(session_id, call_id, "rerun", by, reason)

    def skip(self, session_id: UUID, call_id: str, *, by: Actor, reason: str) -> None:
        """Do not run a call in doubt again: the model gets an error result saying so."""
        self._resolve_doubt(session_id, call_id, "skipped", by, reason)

    def _resolve_doubt(self, session_id: UUID, call_id: str, verdict: str, by: Actor,
                       reason: str | None) -> None:
        self.commands.resolve_in_doubt(session_id, call_id, verdict, by=by, reason=reason)
        self.signals.signal(session_id)  # a turn parked on it here goes on at once

    # --- spend budget (R21) --------------------------------------------------------------

    def set_budget(self, session_id: UUID, limit: float | None, *, by: Actor,
                   reason: str | None = None) -> None:
        """Give the session a budget of its own (None: back to ``spend_cap``); a turn parked on
        its budget goes on at once if the new one covers its next step."""
        self.commands.set_budget(session_id, limit, by=by, reason=reason)
        self.signals.signal(session_id)

    def budget(self, session_id: UUID) -> BudgetCheck | None:
        """The session's budget in force, what it spent and the estimate of its next model
        call (None: no budget, of its own or a default)."""
        return self.budget_guard.check(self.writer.load(session_id).state)

    # --- inbox and wake (R24) ------------------------------------------------------------

    def inject(self, session_id: UUID, text: str, *, wake: bool = False) -> str:
        return self.commands.inject(session_id, text, wake=wake)

    def wake(self, session_id: UUID) -> TurnResult | None:
        """Resume the session's open turn, or start one with its pending inbox, here."""
        return self.supervisor.wake(session_id)

    # --- compaction, titles, policy, models ----------------------------------------------

    def compact(self, session_id: UUID) -> int | None:
        return self.compactor.compact(session_id)

    def set_title(self, session_id: UUID, title: str, *, by: Actor) -> str:
        return self.commands.set_title(session_id, title, by=by)

    def set_policy(self, session_id: UUID, patterns: Sequence[str], *, by: Actor) -> None:
        self.commands.set_policy(session_id, patterns, by=by)

    def set_model(self, session_id: UUID, role: str, spec: str, *, by: Actor) -> None:
        self.commands.set_model(session_id, role, spec, by=by)

    def usage(self, session_id: UUID) -> dict[str, Any]:
        self.catch_up_views()
        return self.views.usage(session_id).as_dict()

    def title(self, session_id: UUID) -> str | None:
        self.catch_up_views()
        return self.views.title(session_id)

    # --- serving -------------------------------------------------------------------------

    def serve_start(self) -> list[UUID]:
        """Serve the store's sessions from this worker (see ``terret.runtime.serving``):
        returns the open turns it resumed at start."""
        return self.supervisor.serve_start()
