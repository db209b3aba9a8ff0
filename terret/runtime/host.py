"""The agent host: this process's agents, one per session it serves (R22).

The registry maps agent ids and sessions to their :class:`~terret.runtime.agent.Agent`; a spawn
takes ownership of the session for this worker (R28). Serving — which sessions this worker
tries, and waking them — is :class:`~terret.runtime.serving.Supervisor`, on top of this host.

Locks (docs/architecture.md §7): a spawn holds its session's *spawn lock* while it reads the
session and appends the attach, so that two racing callers share one agent; the *registry lock*
guards the two maps only and is never held across a store read or write, a listener change or
another lock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from uuid import UUID, uuid4

from terret.domain import errors
from terret.domain.events import AgentDetached, reason_problem
from terret.domain.session import Session
from terret.runtime.agent import Agent
from terret.runtime.definition import AgentDefinition, TurnResult
from terret.runtime.owed import require_owed_tools
from terret.runtime.ownership import TakeIdle
from terret.runtime.writer import SessionWriter

log = logging.getLogger("terret.runtime")

AgentFactory = Callable[[str, UUID, AgentDefinition], Agent]


def _nothing(session_id: UUID) -> None:
    """A host whose views follow every session watches none in particular."""


SET_ASIDE_WAIT = 5.0
"""How long room-making waits for a parked turn it set aside to stop (it stops at once, unless
its park is between two reads of the store)."""


def _release(agent: Agent, reason: str, s: Session) -> None:
    agent.ownership.release(s, reason)


class AgentHost:
    """The agent registry of one process. ``definition`` names the agent definition that
    serves a session (its recorded agent), ``make_agent`` builds an agent with the process's
    turn services."""

    def __init__(self, writer: SessionWriter, *, max_agents: int,
                 definition: Callable[[str], AgentDefinition],
                 make_agent: AgentFactory,
                 watch: Callable[[UUID], None] = _nothing,
                 unwatch: Callable[[UUID], None] = _nothing,
                 follows: Callable[[UUID], bool] = lambda session_id: True) -> None:
        self.writer = writer
        self._watch = watch
        """Called before a spawn claims a session, and ``unwatch`` once its agent is dropped
        (outside every lock of the host): a pool member's views follow the sessions it
        serves (``ProjectionRunner.watch``)."""
        self._unwatch = unwatch
        self._follows = follows
        self.max_agents = max_agents
        self._definition = definition
        self._make_agent = make_agent
        self._agents: dict[str, Agent] = {}
        self._by_session: dict[UUID, Agent] = {}
        self._lock = threading.Lock()  # the registry lock: the two maps, nothing else
        self._spawn_locks: dict[UUID, tuple[threading.RLock, list[int]]] = {}
        self._releasing = False
        """Set (under the registry lock) once ``release_all`` began: a spawn then refuses."""
        self._pinned: set[str] = set()
        """The agents ``spawn_agent`` made: the caller's to dispose, never let go at the cap."""
        self._kept_watched: dict[UUID, int] = {}
        """Sessions whose stream a task of this process that is no agent follows (``watching``),
        by how many such tasks: an agent let go meanwhile does not unwatch it."""

    # --- reading the registry -------------------------------------------------------------

    def agent_for_session(self, session_id: UUID) -> Agent | None:
        return self._by_session.get(session_id)

    @property
    def agents(self) -> list[Agent]:
        return list(self._agents.values())

    def session_ids(self) -> list[UUID]:
        return list(self._by_session)

    # --- spawning and disposing -----------------------------------------------------------

    @contextmanager
    def _spawning(self, session_id: UUID) -> Iterator[None]:
        """The session's spawn lock (re-entrant; dropped when nobody holds or waits for it)."""
        with self._lock:
            lock, users = self._spawn_locks.setdefault(session_id, (threading.RLock(), [0]))
            users[0] += 1
        try:
            with lock:
                yield
        finally:
            with self._lock:
                users[0] -= 1
                if users[0] == 0:
                    del self._spawn_locks[session_id]

    def refuse_if_releasing(self) -> None:
        """``RuntimeStopping`` once the host released its sessions: it serves none again."""
        if self._releasing:
            raise errors.RuntimeStopping("this worker is stopping: it takes no more sessions")

    def _check_free(self, agent_id: str, session_id: UUID, *, cap: bool = True) -> None:
        """Under the registry lock: the id and the session are free, the cap not reached, the
        host not releasing its sessions."""
        self.refuse_if_releasing()
        if agent_id in self._agents:
            raise errors.AgentExists(f"agent id {agent_id!r} is taken")
        if session_id in self._by_session:
            raise errors.AgentExists(
                f"session {session_id} already has agent {self._by_session[session_id].id}")
        if cap and len(self._agents) >= self.max_agents:
            parked = sum(a.status.startswith("waiting_") for a in self._agents.values())
            raise errors.AgentCapExceeded(
                f"this process already holds {self.max_agents} agents, none of them idle "
                f"and spawned on demand ({parked} parked on a verdict or a budget, the others "
                "mid-turn or spawn_agent's; a park a serving wake runs that waits on a person "
                "is set aside, one with a deadline or a caller's turn is not): raise "
                "RuntimeConfig.max_agents, or serve from another process too (a serving "
                "process tries a refused wake again once an agent is free)")

    def _make_room(self, session_id: UUID) -> None:
        """At the cap, let go of the agent spawned on demand that has been idle the longest:
        a long-lived worker touches more sessions than it can hold, and an idle agent holds
        nothing the log does not (its session is released, ``agent/detached``; the next turn,
        wake or verdict there spawns a new one, here or in another worker). With none idle,
        the turn parked the longest on a person (``set_aside``) is set aside first. An agent
        whose session is being spawned or let go by another thread is left alone — taking its
        spawn lock here could deadlock with that thread's own room-making."""
        with self._lock:
            if len(self._agents) < self.max_agents or session_id in self._by_session:
                return
            candidates = [a for a in self._agents.values()
                          if a.id not in self._pinned and a.session_id not in self._spawn_locks
                          and not a.waking]
            idle = sorted(candidates, key=lambda a: a.idle_since)
            # let_go takes the agent's turn lock: a caller that looked it up just before sees
            # AgentLetGo, not a turn on an agent this process no longer lists.
            agent = next((a for a in idle if a.let_go()), None)
            why = f"idle: the agent cap ({self.max_agents}) was reached"
            if agent is not None:
                self._unregister(agent)
        if agent is None:  # outside the registry lock: waiting for a turn to stop
            agent = self._set_aside(sorted(candidates, key=lambda a: a.parked_since))
            why = (f"parked: set aside for its verdict, the agent cap ({self.max_agents}) "
                   "was reached")
            if agent is None:
                return  # _check_free refuses: every agent is mid-turn, parked or pinned
            with self._lock:
                self._unregister(agent)
        log.info("session %s let go (agent %s, %s): this process holds at most %d agents",
                 agent.session_id, agent.id, why.split(":")[0], self.max_agents)
        agent.release()
        try:
            self.writer.execute(agent.session_id, partial(_release, agent, why))
        except errors.TerretError as exc:  # purged, closed meanwhile: nothing left to release
            log.info("session %s: its release was not recorded (%s)", agent.session_id, exc)
        finally:
            self.unwatch_unheld(agent.session_id)

    def _set_aside(self, parked: list[Agent]) -> Agent | None:
        """End the park of the first of ``parked`` that waits on a person and take its turn
        lock once its turn has stopped (open, in the log): that agent, or None. A verdict
        recorded meanwhile wins: that turn goes on, and the next is tried."""
        for agent in parked:
            if not agent.set_aside():
                continue
            deadline = time.monotonic() + SET_ASIDE_WAIT
            while agent.being_set_aside and time.monotonic() < deadline:
                if agent.let_go("set aside at the agent cap"):
                    return agent
                time.sleep(0.01)
            agent.keep()  # its turn went on: a later park of it is not set aside by this
        return None

    def _servable(self, session_id: UUID, *, for_new_turn: bool) -> Session:
        """The session, read outside the registry lock; refused if it is closed, or (for a
        new turn) if its log holds an open one."""
        session = self.writer.load(session_id)
        if session.closed:
            raise errors.SessionClosed(f"session {session_id} is closed")
        if for_new_turn:
            # R4: a refusal appends nothing, not even the attach it would have needed.
            session.require_no_open_turn()
        return session

    def spawn(self, session_id: UUID, *, agent_id: str | None = None, take_idle: TakeIdle = True,
              for_new_turn: bool = False, pinned: bool = False, waking: bool = False) -> Agent:
        """Create this process's agent for the session and take ownership of it (R22, R28).
        A ``pinned`` agent (``spawn_agent``'s) stays until disposed; one spawned on demand is
        let go when the cap is reached and it is the one idle the longest."""
        agent_id = agent_id or f"agent-{uuid4().hex[:12]}"
        with self._spawning(session_id):
            self.drop_if_moved(session_id)
            with self._lock:
                self._check_free(agent_id, session_id, cap=False)  # refused before any read
            session = self._servable(session_id, for_new_turn=for_new_turn)
            definition = self._definition(session.state.agent)
            self._make_room(session_id)
            with self._lock:
                self._check_free(agent_id, session_id)
            agent = self._make_agent(agent_id, session_id, definition)
            agent.waking = waking
            try:
                with self._lock:
                    self._check_free(agent_id, session_id)  # another session may have filled
                    self._agents[agent_id] = agent
                    self._by_session[session_id] = agent
                    if pinned:
                        self._pinned.add(agent_id)
            except BaseException:
                agent.release()
                raise
            try:
                self._watch(session_id)
                self.writer.execute(session_id,
                                    partial(_take, agent, definition, take_idle=take_idle))
            except BaseException:
                self.forget(agent)
                raise
            return agent

    def agent_for(self, session_id: UUID, *, take_idle: TakeIdle = False,
                  for_new_turn: bool = False, waking: bool = False) -> Agent:
        """This process's agent for the session, spawned (and owning it) if there is none;
        ``waking``: for a serving wake, which runs its turn next (``Agent.waking``)."""
        # Under the session's spawn lock: two racing callers must share one agent, not collide
        # on a spawn (the loser would see AgentExists instead of TurnAlreadyRunning).
        with self._spawning(session_id):
            # Released agents stay registered: after the release none serves (wake included).
            self.refuse_if_releasing()
            self.drop_if_moved(session_id)
            agent = self.agent_for_session(session_id)
            if agent is None:
                return self.spawn(session_id, take_idle=take_idle, for_new_turn=for_new_turn,
                                  waking=waking)
            agent.idle_since = time.monotonic()  # in use again: the last to be let go
            agent.waking = agent.waking or waking
            return agent

    def dispose(self, agent_id: str, *, reason: str | None = None) -> None:
        """``InvalidPayload`` for a reason the release could not record, before anything
        changes (the agent was gone from the process while the log still named it owner)."""
        problem = reason_problem(reason)
        if problem is not None:
            raise errors.InvalidPayload(AgentDetached.wire_name, "reason", problem)
        with self._lock:
            agent = self._agents.get(agent_id)
            if agent is None:
                raise errors.RuntimeFault(f"no agent {agent_id!r}")
            # For good: a caller still holding the Agent gets AgentLetGo, not a turn that
            # claims the session outside the registry (nothing releases it at close).
            if not agent.let_go("disposed"):
                raise errors.AgentBusy(f"agent {agent_id} is {agent.status}; only idle agents "
                                       "can be disposed")
            self._unregister(agent)
        agent.release()
        try:
            self.writer.execute(agent.session_id,
                                lambda s: agent.ownership.release(s, reason or "disposed"))
        finally:
            self.unwatch_unheld(agent.session_id)

    def let_go(self, session_id: UUID, reason: str, *, wait: float = 0.0) -> None:
        """Drop this process's agent for a session that ended (``session/closed``, from any
        process), once no turn holds it — none can start on a closed session, one may be
        finishing — waiting up to ``wait`` seconds for that. Its release is recorded when it
        still owns the session (``agent/detached``, ``reason``); one that cannot be written (the
        session was purged meanwhile) is skipped, and the agent is dropped all the same, so the
        worker stops listing the session as served."""
        agent = self.agent_for_session(session_id)
        if agent is None:
            return
        deadline = time.monotonic() + wait
        while agent.busy and time.monotonic() < deadline:
            time.sleep(0.02)
        if agent.busy:
            log.warning("session %s is closed but its agent %s is still mid-turn; it is let go "
                        "when this worker stops", session_id, agent.id)
            return
        if self.agent_for_session(session_id) is not agent:
            return  # let go already, by another caller
        try:  # recorded first: a session this worker no longer serves is released in the log
            self.writer.execute(session_id, partial(_release, agent, reason))
        except errors.TerretError as exc:
            log.info("session %s: its release was not recorded (%s)", session_id, exc)
        self.forget(agent)

    def hand_off(self, session_id: UUID, reason: str) -> bool:
        """Release (``agent/detached``, ``reason``) the session whose open turn this process
        stopped and will not resume itself, so that a serving worker takes the turn over.
        Whether it released it (False: nothing left to hand off — no agent here, a turn
        running it again, the turn closed); a store still failing raises."""
        agent = self.agent_for_session(session_id)
        if agent is None or agent.busy:
            return False
        if not self.writer.load(session_id).turn_open:
            return False
        with self._spawning(session_id):
            if self.agent_for_session(session_id) is not agent or agent.busy:
                return False
            # A turn this process starts on it meanwhile is fenced out by the release
            # (LostOwnership at its next write) and the serving worker resumes it.
            self.writer.execute(session_id, partial(_release, agent, reason))
            self.forget(agent)
        return True

    def drop_if_moved(self, session_id: UUID) -> None:
        """Drop (writing nothing) this process's idle agent for a session another agent has
        attached since — an idle session moved to another process: the agent here owns
        nothing, and kept, it would answer for a turn that runs elsewhere. A busy one finds
        out at its next write (``LostOwnership``)."""
        agent = self.agent_for_session(session_id)
        if agent is None or agent.busy:
            return
        try:
            state = self.writer.load(session_id).state
        except errors.TerretError:
            return  # unreadable (purged): whoever uses the agent next is told why
        owner, mine = state.owner, agent.ownership.epoch
        # Another agent attached since this one did: moved, even if that one let it go since.
        if (owner is not None and owner.agent_id != agent.id) or (
                mine is not None and state.epoch > mine):
            where = f"worker {owner.worker}" if owner is not None else "another agent"
            log.info("session %s moved to %s; agent %s here is dropped", session_id, where,
                     agent.id)
            with self._spawning(session_id):
                if self.agent_for_session(session_id) is agent and not agent.busy:
                    self.forget(agent, f"its session moved to {where}")

    def forget(self, agent: Agent, why: str = "dropped from this process") -> None:
        """Drop the agent from the registry and remove its listeners (nothing is written); a
        caller still holding it gets ``AgentLetGo`` (a turn it is running finds out at its
        next write, ``LostOwnership``)."""
        agent.let_go(why)
        with self._lock:
            self._unregister(agent)
        agent.release()
        self.unwatch_unheld(agent.session_id)

    def unwatch_unheld(self, session_id: UUID) -> None:
        """Unwatch the session unless an agent holds it again, or a task keeps it watched:
        under its spawn lock, which a spawn holds from its registration through its watch, so
        the two cannot interleave."""
        with self._spawning(session_id):
            if self.agent_for_session(session_id) is None \
                    and session_id not in self._kept_watched:
                self._unwatch(session_id)

    @contextmanager
    def watching(self, session_id: UUID) -> Iterator[None]:
        """Keep this process's views following the session for the length of a task that is
        no agent (an upkeep a dead worker left): an agent of the session let go meanwhile does
        not unwatch it under the task (which would read views that stopped following)."""
        with self._spawning(session_id):
            self._watch(session_id)  # first: one that fails keeps no count for good
            self._keep(session_id)
        try:
            yield
        finally:
            self._unkeep(session_id)

    @contextmanager
    def keeping(self, session_id: UUID) -> Iterator[bool]:
        """Whether this process's views follow the session now, and if they do, keep them
        following it for the length of a task reading them (an upkeep after a turn): a pool
        member that lets the session go meanwhile forgets its rows, which the task would read
        as an empty conversation. One that no longer follows it leaves the task to whoever
        serves the session next."""
        with self._spawning(session_id):
            followed = self._follows(session_id)
            if followed:
                self._keep(session_id)
        if not followed:
            yield False
            return
        try:
            yield True
        finally:
            self._unkeep(session_id)

    def _keep(self, session_id: UUID) -> None:
        """Under the session's spawn lock: one more task keeps it watched."""
        self._kept_watched[session_id] = self._kept_watched.get(session_id, 0) + 1

    def _unkeep(self, session_id: UUID) -> None:
        with self._spawning(session_id):
            left = self._kept_watched.pop(session_id) - 1
            if left:
                self._kept_watched[session_id] = left
        self.unwatch_unheld(session_id)

    def _unregister(self, agent: Agent) -> None:
        self._agents.pop(agent.id, None)
        self._pinned.discard(agent.id)
        if self._by_session.get(agent.session_id) is agent:
            del self._by_session[agent.session_id]

    def release_all(self, reason: str) -> None:
        """Release every session this worker still owns (a graceful stop): nothing is written
        for a session it lost meanwhile. From here on a spawn refuses (``RuntimeStopping``),
        and a claim already under way lands before its session is released: a session claimed
        after the release would be owned by a worker that is gone, and a pool finds such a
        session only in a beat, which a worker that stops removes."""
        with self._lock:
            self._releasing = True
            agents = list(self._agents.values())
        for agent in agents:
            with self._spawning(agent.session_id):  # a spawn holds it through its claim
                if agent.busy or self._agents.get(agent.id) is not agent:
                    # Busy: a turn that did not stop in time keeps its lease until it expires.
                    # Gone: its spawn failed, or it lost the session.
                    continue
                try:
                    self.writer.execute(agent.session_id, partial(_release, agent, reason))
                except errors.SessionNotFound:
                    log.info("session %s is gone (purged?): nothing to release",
                             agent.session_id)
                except errors.TerretError as exc:
                    log.warning("session %s not released (%s); its lease expires instead",
                                agent.session_id, exc)

    # --- turns ------------------------------------------------------------------------------

    def drive(self, agent: Agent, turn: Callable[[], TurnResult]) -> TurnResult:
        """Run one of the agent's turn methods; an agent that lost its session is dropped
        from this process (it wrote nothing after losing it)."""
        try:
            return turn()
        except errors.LostOwnership:
            self.forget(agent)
            raise

    def turn_threads(self) -> list[threading.Thread]:
        return [a._thread for a in self.agents if a._thread is not None]


def _take(agent: Agent, definition: AgentDefinition, session: Session, *,
          take_idle: TakeIdle) -> None:
    """Take the session for ``agent`` — ``SessionOwned`` first, when a live worker has it —
    then refuse a turn it could not serve (nothing is saved: the command raised), and record
    the move when this process's revision of the definition is another (R32)."""
    agent.ownership.take(session, take_idle=take_idle)
    require_owed_tools(session, definition)
    session.run_under(definition.revision)


