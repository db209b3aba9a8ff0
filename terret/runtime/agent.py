"""An agent: the live instance serving one session in this process (R22), and its turns.

Status (R1) is ``idle → running → waiting_approval → running → idle``; a parked agent refuses a
new turn like a running one. A turn also parks on its spend budget (``waiting_budget``) and on a
call in doubt (``waiting_in_doubt``). The turn loop appends through the ``Session`` aggregate
and reads the messages view after waiting for its own last write (read-your-writes).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any
from uuid import UUID

from terret.domain import errors
from terret.domain.codec import RecordedEvent
from terret.domain.events import (
    Actor,
    AssistantMessage,
    CancelRequested,
    ToolCallData,
    TurnStatus,
)
from terret.domain.messages import (
    MAX_ARGUMENT_DEPTH,
    Message,
    ToolCall,
    args_too_deep,
    distinct_ids,
)
from terret.domain.payloads import check_storable
from terret.domain.session import Session
from terret.projections._bus import Listener, ListenerHandle
from terret.projections.views import Views
from terret.runtime.allowlist import AllowList
from terret.runtime.approvals import ApprovalGate, ApprovalSignals
from terret.runtime.definition import AgentDefinition, TurnResult
from terret.runtime.hooks import BudgetGuard, PreStepHook, Refusal, StepClaim
from terret.runtime.model import (
    ModelReply,
    ModelRequest,
    ModelResolver,
    TextSink,
    checked_reply,
)
from terret.runtime.owed import require_owed_tools
from terret.runtime.ownership import SessionLease, TakeIdle, WorkerLease
from terret.runtime.step_commands import (
    MAX_REPLY_BYTES,
    answer,
    end_cancelled,
    fitted_reply,
    open_step,
    record_result,
    usage_of,
)
from terret.runtime.stops import TurnCancelled, TurnSuspended
from terret.runtime.tools import (
    CallContext,
    Tool,
    ToolContext,
    ToolOutcome,
    ToolPipeline,
    describe_error,
    storable,
)
from terret.runtime.unit import Command, ModelContext, StepWork
from terret.runtime.writer import SessionWriter

log = logging.getLogger("terret.agent")

_serving = threading.local()


@contextmanager
def serving_wake() -> Iterator[None]:
    """Around a serving wake's turn, on its own thread: the turn it claims may have its park
    set aside to make room (``Agent.set_aside``); no caller waits on it."""
    _serving.wake = True
    try:
        yield
    finally:
        _serving.wake = False


@dataclass(frozen=True)
class TurnServices:
    """What a turn needs from the process that runs it (the ``Runtime`` builds one and hands it
    to every agent): the session writer and the views, the model resolver and the session's
    model spec for a role, the approval signals and the worker's lease, the pre-step hooks and
    the budget guard, the read-your-writes wait, the stopping flag and the config values."""

    writer: SessionWriter
    views: Views
    resolver: ModelResolver
    model_spec: Callable[[Session, str], str]
    signals: ApprovalSignals
    lease: WorkerLease
    tool_context: ToolContext
    add_listener: Callable[[Listener, set[str]], ListenerHandle]
    wait_for: Callable[[int], None]
    """Read-your-writes: until the views include this store position."""
    catch_up_views: Callable[[UUID], None]
    """Until the views hold everything of this session written so far."""
    budget_guard: BudgetGuard
    pre_step: Sequence[PreStepHook]
    """The runtime's own hooks (a live list: hooks added later apply to the next step)."""
    stopping: threading.Event
    max_steps: int
    approval_max_wait: float | None = None
    tool_timeout: float | None = None
    waits_unheld: Callable[[Session], bool] = lambda session: False
    """Whether the session's open turn waits on a person, held by no worker, until what it
    waits for is recorded (``Runtime._waits_unheld``, the rule serving claims by too)."""


class Agent:
    parked_since = 0.0
    """When its turn last parked (monotonic): at the cap, the longest parked is set aside."""
    waking = False
    """Claimed for a serving wake whose turn has not begun yet: not let go at the cap meanwhile
    (a second wake at a full worker took the agent the first had just claimed, and a third the
    second's: claims and releases, no turn)."""
    may_set_aside = False
    """Whether a park of this agent's turn may be ended to make room (``set_aside``): true
    while a serving process's wake runs it, never for a caller waiting on its turn."""

    def __init__(self, services: TurnServices, agent_id: str, session_id: UUID,
                 definition: AgentDefinition) -> None:
        self.services = services
        self.id = agent_id
        self.session_id = session_id
        self.definition = definition
        self._status = "idle"
        self._lock = threading.Lock()
        self.idle_since = time.monotonic()
        """When its last turn ended (or it was made, or looked up): at the agent cap, the host
        lets go of the agent idle the longest."""
        self._let_go = False
        self._let_go_why = ""
        self._aside = threading.Event()  # see set_aside
        self.cancel_event = threading.Event()
        self.on_text: TextSink | None = None
        self.context: ToolContext = services.tool_context.fork()
        writer = services.writer
        self._call_session: Session | None = None  # the session as read for the running call
        self.allowlist = AllowList(definition.allow, self._policy_of)
        self.context.pre_execute.append(self.allowlist)
        self.ownership = SessionLease(services.lease, agent_id)
        self.gate = ApprovalGate(
            writer, services.signals,
            max_wait=services.approval_max_wait,
            on_park=lambda: self._parked("approval"),
            on_unpark=lambda: self._set_status("running"),
            stopping=services.stopping, fence=self.ownership.fence, aside=self._aside,
        )
        self.pipeline = ToolPipeline(definition.tools, self.context, self.gate,
                                     timeout=services.tool_timeout,
                                     cancel=self.cancel_event, on_start=self._tool_started,
                                     asked=self._asked)
        self._listeners = [services.add_listener(self._on_cancel, {CancelRequested.wire_name})]
        self._thread: threading.Thread | None = None
        self._unpriced: set[str] = set()  # the model specs warned about (_warn_unpriced)
        self._unsure: frozenset[str] = frozenset()  # see _close_open_step
        self.model_context = ModelContext()  # the last request's messages (see _messages)
        self.work = StepWork(writer, session_id, fence=self.ownership.fence,
                             on_commit=self.model_context.follow)

    # --- status --------------------------------------------------------------------------

    @property
    def status(self) -> str:
        return self._status

    def _set_status(self, status: str) -> None:
        self._status = status

    def _parked(self, kind: str) -> None:
        """``kind``: ``approval``, ``budget`` or ``in_doubt``."""
        self.model_context.drop()  # a parked turn may wait for days: it keeps no history around
        # What the running call read before it parked is not what it decides on after: the
        # policy check that follows an approval (R23) reads the store's latest. (That read was
        # the writer's cached copy, kept current only while the writer keeps it: a refused
        # command drops it, and the policy then read was the one from before the park.)
        self._call_session = None
        self.parked_since = time.monotonic()
        log.info("session %s parked on %s", self.session_id,
                 {"approval": "an approval", "budget": "its budget",
                  "in_doubt": "a call in doubt"}.get(kind, kind))
        self._set_status(f"waiting_{kind}")

    @property
    def max_steps(self) -> int:
        """R2: the definition's cap, else the runtime's (``MAX_STEPS`` by default)."""
        return self.definition.max_steps or self.services.max_steps

    @property
    def recorded_to(self) -> int:
        """The store position of this agent's last append: a listener that must have seen it
        before the next model text shows (a chat printing the turn in order) waits for the
        views to reach it."""
        return self.work.position

    @property
    def busy(self) -> bool:
        return self._lock.locked()

    def _load(self) -> Session:
        return self.services.writer.load(self.session_id)

    def _on_cancel(self, event: RecordedEvent) -> None:
        """A cancel recorded by any process stops this agent's turn at its next boundary and
        closes an in-flight model stream (R13, ARCHITECTURE §7) — if it is this turn's: one
        delivered late, after its turn closed, must not cancel the next turn."""
        if event.session_id != self.session_id or not self.busy:
            return
        if self._load().state.cancel_requested:
            self.cancel_event.set()

    def let_go(self, why: str = "at the agent cap") -> bool:
        """Take the turn lock for good, if no turn holds it: from here on this agent runs no
        turn (``AgentLetGo``, saying ``why``). False if it is busy."""
        if not self._lock.acquire(blocking=False):
            return False
        self._let_go, self._let_go_why = True, why
        self._set_status("released")
        return True

    def set_aside(self) -> bool:
        """End the park of a turn that waits on a person, held by no worker, until what it waits
        for is recorded (``TurnServices.waits_unheld``), if a serving process's wake runs it:
        the turn stops open (``TurnSuspended``) and the agent, idle, can be let go — its
        session waits in the log, and a worker takes it when the verdict or budget comes.
        False when it does not so wait."""
        if not self.may_set_aside or not self.status.startswith("waiting_"):
            return False
        try:
            if not self.services.waits_unheld(self._load()):
                return False  # e.g. a deadline this process keeps (the reaper), a pool's budget
        except errors.TerretError:
            return False
        self._aside.set()
        if not self.status.startswith("waiting_"):  # a verdict won meanwhile: the turn goes on
            self._aside.clear()
            return False
        self.services.signals.signal(self.session_id)  # the park's wait wakes at once
        return True

    def keep(self) -> None:
        """Withdraw a ``set_aside`` its turn did not act on (a verdict came first)."""
        self._aside.clear()

    @property
    def being_set_aside(self) -> bool:
        """``set_aside`` was asked and no verdict came first (the turn stops, or stopped)."""
        return self._aside.is_set()

    def release(self) -> None:
        """Remove every listener this agent registered (R22, R26)."""
        for handle in self._listeners:
            handle.remove()
        self._listeners.clear()

    # --- turns ---------------------------------------------------------------------------

    def _claim(self) -> None:
        if self.services.stopping.is_set():
            # After close() began, a turn started or resumed here could not run: it would
            # only write its start and stop (TurnSuspended) or wait on views no longer fed.
            raise errors.RuntimeStopping(
                f"this runtime is closing: it runs no more turns (session {self.session_id})")
        if not self._lock.acquire(blocking=False):
            if self._let_go:
                raise errors.AgentLetGo(f"agent {self.id} was let go ({self._let_go_why}); "
                                        f"session {self.session_id} needs a new one")
            raise errors.TurnAlreadyRunning(
                f"agent {self.id} is already mid-turn on session {self.session_id}"
            )
        self.cancel_event.clear()
        self._aside.clear()
        # Decided by the thread that claims the turn: a wake that finds it running does not
        # touch what the running turn's own wake decided.
        self.may_set_aside = getattr(_serving, "wake", False)
        self.waking = False  # its turn began: let go at the cap only as any agent is
        self._set_status("running")

    def _release_claim(self) -> None:
        self.may_set_aside = False
        self._set_status("idle")
        self.idle_since = time.monotonic()
        self._lock.release()

    def run_turn(self, text: str | None, *, trigger: str = "user",
                 inbox_id: str | None = None, take_idle: bool = True) -> TurnResult:
        """R4: refused with ``TurnOpenInLog`` if the log holds an open turn, with
        ``TurnAlreadyRunning`` if this agent is mid-turn, with ``SessionOwned`` if another live
        worker owns the session (an idle one is moved here when ``take_idle``). Failures are
        recorded as ``turn/end failed`` and re-raised."""
        self._claim()
        try:
            def start(s: Session) -> int:
                s.require_no_open_turn()  # R4 before R28: an open turn is resumed, not fought
                self._take(s, take_idle=take_idle)  # the attach rides with the start
                return s.start_turn(trigger=trigger, text=text or None, inbox_id=inbox_id)

            # Not yet the turn's owner: the start is validated on the store's latest state (and
            # again on a conflict), so a turn another process opened is refused, not fought.
            turn = self.work.commit(start, owner=False)
            log.info("session %s turn %d started (%s)", self.session_id, turn, trigger)
            return self._drive(turn, resumed=False)
        finally:
            self._release_claim()

    def _take(self, s: Session, *, take_idle: TakeIdle) -> None:
        """Own the session again (R28), recording the move when this process's revision of the
        definition is another than the one its turns last ran under (R32): moved away and back,
        it ran turns in another process, under that process's revision."""
        self.ownership.take(s, take_idle=take_idle)
        require_owed_tools(s, self.definition)  # an open turn another release left owing
        s.run_under(self.definition.revision)

    def resume_turn(self) -> TurnResult:
        """R14–R16: re-enter the open turn without a second ``turn/start``. A failure leaves the
        turn open (it stays resumable) and is re-raised."""
        self._claim()
        try:
            session = self._load()
            if not session.turn_open:
                raise errors.NoOpenTurn(f"session {self.session_id} has no open turn to resume")
            if not self.ownership.held(session):
                # Taken over from an owner whose lease expired (never from a live one).
                self.work.commit(lambda s: self._take(s, take_idle=False), owner=False)
            log.info("session %s turn %d resumed", self.session_id, session.current_turn)
            return self._drive(session.current_turn, resumed=True)
        finally:
            self._release_claim()

    def start_in_background(self, fn: Callable[[], object]) -> threading.Thread:
        def run() -> None:
            try:
                fn()
            except (errors.TurnAlreadyRunning, TurnSuspended):
                pass
            except Exception:
                log.exception("turn of session %s failed", self.session_id)

        thread = threading.Thread(target=run, name=f"terret-turn-{self.session_id}",
                                  daemon=True)
        self._thread = thread
        thread.start()
        return thread

    # --- the loop ------------------------------------------------------------------------

    def _write(self, command: Command) -> Any:
        """Append what ``command`` records as the turn's owner, after whatever the unit of work
        carries (a step's last tool result and its ``step/end`` ride with the next step's
        ``step/start``: one durable append instead of two)."""
        return self.work.commit(command)

    def _flush_quietly(self) -> None:
        """On the way out of a turn that stays open: what ran is logged, if it still can be."""
        try:
            self.work.flush()
        except errors.TerretError as exc:
            log.warning("session %s: a tool result could not be logged (%s); the call will run "
                        "again on resume", self.session_id, exc)
        self.work.discard()

    def _end(self, turn: int, status: TurnStatus, *, reason: str | None = None,
             by: Actor | None = None, error: str | None = None, text: str = "") -> TurnResult:
        if error is not None:  # an exception's text: lone surrogates, megabytes of it
            error = storable(error, name=f"session {self.session_id}: the turn's error")
        self._write(lambda s: s.end_turn(status, reason=reason, by=by, error=error))
        log.info("session %s turn %d ended %s", self.session_id, turn, status)
        return TurnResult(self.session_id, turn, status, text)

    def _drive(self, turn: int, *, resumed: bool) -> TurnResult:
        self.work.discard()
        self.model_context.drop()
        try:
            return self._steps(turn, resumed=resumed)
        except BaseException as exc:
            return self._ending(turn, exc, resumed=resumed)
        finally:
            self.model_context.drop()

    def _steps(self, turn: int, *, resumed: bool) -> TurnResult:
        if resumed:
            closed = self._close_open_step(turn)
            if closed is not None:
                return closed
        else:
            state = self._load().state
            if not state.turn_input and not state.inbox:
                return self._end(turn, "empty", reason="nothing to do")
        while True:
            result = self._step(turn)
            if result is not None:
                return result

    # --- how a turn ends on an exception: the one place that decides ---------------------

    def _ending(self, turn: int, exc: BaseException, *, resumed: bool) -> TurnResult:
        """Map what stopped the turn to its ending: a cancel closes it ``cancelled``; a stop of
        the process (``TurnSuspended``), a store that failed (``StoreUnavailable``,
        ``StoreFull``) or a failed resume leaves it open, what ran logged; a
        lost lease or a turn another writer closed stops it without writing; a failure after a
        cancel was recorded (the stream the cancel was closing broke first) is the cancel's;
        anything else — the step cap, a failure, a ``KeyboardInterrupt`` — records ``turn/end
        failed``. Every ending but a cancel re-raises ``exc``."""
        if isinstance(exc, (TurnCancelled, errors.ModelCancelled)):
            return self._close_cancelled(turn)
        if isinstance(exc, TurnSuspended):
            self._flush_quietly()
            log.info("session %s turn %d suspended; it stays resumable", self.session_id, turn)
        elif isinstance(exc, errors.LostOwnership):
            self.work.discard()
            log.warning("session %s: lost ownership; turn %d stops without writing",
                        self.session_id, turn)
        elif isinstance(exc, (errors.StoreUnavailable, errors.StoreFull)):
            # An outage, a full disk: nothing about the turn failed, and its end could land
            # only once the store is back — closing it `failed` then dropped the user's
            # message for good. It stays open; a serving worker resumes it once the store
            # takes writes again (docs/operations.md, *Crashes*), a caller resumes it.
            self._flush_quietly()
            log.warning("session %s turn %d stops open: the store failed (%s); it is resumed "
                        "once the store takes writes again", self.session_id, turn, exc)
        elif isinstance(exc, Exception) and self._cancel_recorded(turn):
            log.info("session %s turn %d: %s: %s after its cancel was recorded; the cancel "
                     "wins", self.session_id, turn, type(exc).__name__, exc)
            return self._close_cancelled(turn)
        elif isinstance(exc, errors.MaxStepsExceeded):
            self._end(turn, "failed", error=str(exc))
        elif isinstance(exc, Exception):
            self._fail(turn, exc, resumed=resumed)
        else:  # KeyboardInterrupt, SystemExit: a stop, never retried
            self._stop(turn, exc)
        raise exc

    def _fail(self, turn: int, exc: Exception, *, resumed: bool) -> None:
        if resumed:
            self._flush_quietly()
            log.warning("resume of session %s failed; the turn stays open: %s",
                        self.session_id, exc)
        elif not self._still_open(turn):
            self.work.discard()
            log.warning("session %s turn %d was closed by another writer; stopping without "
                        "writing: %s", self.session_id, turn, exc)
        else:
            self._end(turn, "failed", error=describe_error(exc))

    def _stop(self, turn: int, exc: BaseException) -> None:
        try:
            self._end(turn, "failed", error=describe_error(exc))
        except Exception as end_exc:  # noqa: BLE001 - the stop is what propagates
            self.work.discard()
            log.warning("session %s turn %d stopped by %s and left open: %s",
                        self.session_id, turn, type(exc).__name__, end_exc)

    def _cancel_recorded(self, turn: int) -> bool:
        try:
            session = self._load()
        except Exception:  # noqa: BLE001 - the failure being handled is what is reported
            return False
        return session.turn_open and session.current_turn == turn and \
            session.state.cancel_requested

    def _still_open(self, turn: int) -> bool:
        session = self._load()
        return session.turn_open and session.current_turn == turn

    def _close_cancelled(self, turn: int) -> TurnResult:
        unsure, self._unsure = self._unsure, frozenset()
        self._write(partial(end_cancelled, unsure=unsure))
        log.info("session %s turn %d ended cancelled", self.session_id, turn)
        return TurnResult(self.session_id, turn, "cancelled")

    # --- a step ----------------------------------------------------------------------------

    def _close_open_step(self, turn: int) -> TurnResult | None:
        """R15/R16: re-execute owed calls, close the step without usage; decide the edges."""
        session = self._load()
        state = session.state
        if state.cancel_requested:
            if state.step_open and state.step_answered and not state.released:
                # The process before may have been running these (none records a start
                # unless it may not run twice); a call awaiting its verdict never ran, nor
                # did any after an owner let the session go at a boundary or a park.
                self._unsure = frozenset(state.owed.keys() - state.pending.keys())
            raise TurnCancelled("cancel recorded before resume")
        # The owed calls go through the allow-list and the steps through pre-step hooks, which
        # read the views: bring them up to the log a previous process left.
        self.services.catch_up_views(self.session_id)
        if state.step_open and state.step_answered:
            owed = session.owed_calls()
            if owed:  # the last result and the step's end (without usage) in one append
                self._run_calls(turn, owed, resumed=True)
            else:
                self._write(lambda s: s.end_step(resumed=True))
            return None  # keep stepping; a final reply gets one extra model request (R16)
        if state.step == 0 and not state.turn_input and not state.inbox:
            return self._end(turn, "empty", reason="nothing to do")
        if not state.step_open and state.step > 0 and state.last_reply_final:
            return self._end(turn, "completed")
        return None

    def _step(self, turn: int) -> TurnResult | None:
        """One step: at its boundary (stopping, cancel, budget, pre-step hooks), open it, ask
        the model, record the reply (a final one ends the turn), run the calls."""
        session = self._at_boundary()
        # After the budget's wait, which may last days: a `model set` meanwhile (a cheaper
        # model, beside a raised budget) is what the step uses.
        session = self._within_budget(session)
        spec = self.services.model_spec(session, "main")
        refused = self._pre_step(StepClaim(self.session_id, turn, session.current_step + 1,
                                           spec))
        if refused is not None:
            return refused
        step = self._write(partial(open_step, spec, self.max_steps))
        # What a parked call keeps alive is bounded, not its history: the messages live only
        # as long as the request.
        reply = self._ask(spec, self._messages())
        self._warn_unpriced(spec, reply, session)
        # Any provider's reply, yours too: two calls under one id are told apart, not a failed
        # turn (the log refuses a reply whose calls share an id).
        name = f"session {self.session_id}: {spec}"
        try:
            calls = [_call_data(spec, c)
                     for c in distinct_ids([_shaped(spec, c) for c in reply.tool_calls])]
        except errors.MalformedStream:  # a call the log cannot hold: the reply's usage is
            self._record_without_calls(spec, reply, fitted_reply(reply.text, [], name=name)[0])
            raise  # recorded all the same (R31), then the turn fails
        text, calls, too_large = fitted_reply(reply.text, calls, name=name)
        if too_large is not None:  # as a call the log cannot hold
            self._record_without_calls(spec, reply, text)
            raise errors.PayloadTooLarge(f"{AssistantMessage.wire_name} (its tool calls)",
                                         too_large, MAX_REPLY_BYTES // 2)
        # The calls are durable before any of them runs (R15: at-least-once, never lost).
        ended = self._write(partial(answer, text, calls, spec, usage_of(reply)))
        if ended is not None:
            log.info("session %s turn %d ended %s", self.session_id, turn, ended)
            return TurnResult(self.session_id, turn, ended, text)  # as the log holds it
        self._run_calls(turn, calls)
        log.debug("session %s turn %d step %d closed", self.session_id, turn, step)
        return None

    def _record_without_calls(self, spec: str, reply: ModelReply, text: str) -> None:
        """A reply whose calls cannot be recorded, recorded without them: the model call was
        billed, and its usage counts (R31) whatever is done with what it answered."""
        self._write(lambda s: s.record_assistant(text, [], model=spec, usage=usage_of(reply)))

    def _warn_unpriced(self, spec: str, reply: ModelReply, session: Session) -> None:
        """A budget counts only costs: a model whose replies carry none (OpenAI, vLLM without
        ``prices`` in its endpoint's config) is spent free of it — said once per model."""
        if (reply.usage is not None and reply.usage.cost is not None) or spec in self._unpriced:
            return
        if self.services.budget_guard.check(session.state) is None:
            return
        self._unpriced.add(spec)
        what = "no cost" if reply.usage is not None else "no usage at all"
        log.warning("session %s: %s reported %s: its budget does not count this model's "
                    "calls (give its endpoint prices in the providers config)",
                    self.session_id, spec, what)

    def _at_boundary(self) -> Session:
        """The session at a step's boundary; raises if the process stops or the turn was
        cancelled (other processes may have queued text or recorded a cancel since the last
        write)."""
        if self.services.stopping.is_set():
            raise TurnSuspended("the process is stopping")
        session = self._load()
        if session.state.cancel_requested or self.cancel_event.is_set():
            raise TurnCancelled("cancel requested")
        return session

    def _pre_step(self, claim: StepClaim) -> TurnResult | None:
        """The runtime's and the definition's pre-step hooks; the first refusal ends the turn
        ``rejected``."""
        hooks = (*self.services.pre_step, *self.definition.pre_step)
        if not hooks:
            return None
        self.work.flush()  # hooks may read views: let them see this turn's own writes
        self.services.wait_for(self.work.position)
        for hook in hooks:
            refusal = hook(claim)
            if refusal is not None and not isinstance(refusal, Refusal):
                # `return False` reads as "do not refuse": said, not an AttributeError.
                raise errors.ConfigurationError(
                    f"pre-step hook {getattr(hook, '__qualname__', hook)!r} returned "
                    f"{refusal!r}: a hook returns None or a terret.Refusal")
            if refusal is not None:
                return self._end(claim.turn, "rejected", reason=refusal.reason,
                                 by=Actor(actor=refusal.actor,  # type: ignore[arg-type]
                                          id=refusal.id))
        return None

    def _messages(self) -> list[Message]:
        """The model's context for this step's request."""
        messages = self.model_context.messages()
        if messages is not None:
            # Nothing but this agent's own appends since the last request: the messages view
            # would show the last request's messages plus what those appends added.
            return messages
        # Read-your-writes: the view, once the projections include this step's start — and
        # never a view halted before it (an old conversation, the model asked with it).
        self.services.wait_for(self.work.position)
        messages = self.services.views.messages(self.session_id, reaching=self.work.position)
        self.model_context.start(messages, self.work.version)  # the version it was read at
        return messages

    def _ask(self, spec: str, messages: list[Message]) -> ModelReply:
        self.ownership.check()  # R28: no model request on a lease that may have run out
        provider, model = self.services.resolver.resolve(spec)
        system = [Message(role="system", text=self.definition.instructions)] \
            if self.definition.instructions else []
        request = ModelRequest(model=model, messages=[*system, *messages],
                               tools=self.pipeline.specs())
        reply = provider.complete(request, on_text=self.on_text, cancel=self.cancel_event)
        return checked_reply(getattr(provider, "name", type(provider).__name__), reply)

    # --- the step's calls --------------------------------------------------------------------

    def _policy_of(self, sid: UUID) -> list[str] | None:
        """The allow-list's read (R23): the session as ``_run_calls`` just read it for this
        call (one read of the stream's tail per call, not two), else the store's latest."""
        read = self._call_session
        if read is None or sid != self.session_id:
            read = self.services.writer.load(sid)
        return read.state.policy

    def _run_calls(self, turn: int, calls: Sequence[ToolCallData], *,
                   resumed: bool = False) -> None:
        """Run the step's calls in order, each result appended as it comes; the last result
        and the step's ``step/end`` are carried into the next append. A call in doubt (it
        started, and left no result) is never run again without an operator's verdict."""
        for i, call in enumerate(calls):
            # R28: confirm the lease before each call: no tool runs for a worker that may have
            # lost the session (frozen past its lease, taken over meanwhile).
            self.ownership.check()
            session = self._load()
            self.ownership.fence(session)
            if session.state.cancel_requested:
                # Recorded by any process: the log read just now can say so before the cancel
                # reaches this process's subscription (R13). The call is answered as not run.
                self.cancel_event.set()
            state = session.state
            ctx = CallContext(self.session_id, call.id, call.name, dict(call.args), turn,
                              step=state.step,
                              first_step=state.call_steps.get(call.id, state.step))
            outcome = None
            if call.id in session.state.started:
                outcome = self._settle_in_doubt(ctx, session)
                if outcome is None:  # to run again, maybe days later: decided on the latest
                    session = self._load()
            if outcome is None:
                self._call_session = session
                try:
                    outcome = self.pipeline.run(ctx)
                finally:
                    self._call_session = None
            record = partial(record_result, call, outcome.content, outcome.is_error,
                             close_step=i == len(calls) - 1, resumed=resumed)
            if i == len(calls) - 1:
                self.work.carry(record)  # written with whatever comes next: step/start, turn/end
            else:
                self._write(record)
            if outcome.stop is not None:  # recorded first: the log says why the call ended
                raise outcome.stop

    def _asked(self, ctx: CallContext) -> bool:
        session = self._call_session
        return session is not None and session.asked_about(ctx.call_id, ctx.name, ctx.args)

    def _tool_started(self, tool: Tool, ctx: CallContext) -> None:
        """Before the handler of a tool that may not run twice: ``tool/started``, durable."""
        self._write(lambda s: s.start_tool(ctx.call_id, ctx.name))

    def _settle_in_doubt(self, ctx: CallContext, session: Session) -> ToolOutcome | None:
        """A call that started and left no result may have taken effect: park on it (recorded
        as ``tool/in_doubt``) until an operator decides, from any process. None: run it again
        (the verdict was ``rerun``); else the error result the model sees."""
        verdict = session.doubt_verdict_for(ctx.call_id, ctx.name, ctx.args)
        if verdict is None:
            if ctx.call_id not in session.state.doubts:
                self._write(lambda s: s.mark_in_doubt(ctx.call_id, ctx.name))
            log.warning("session %s: call %s (%s) started and left no result; it waits for a "
                        "verdict (rerun or skip)", self.session_id, ctx.call_id, ctx.name)
            verdict = self.gate.wait(
                self.session_id, lambda s: s.doubt_verdict_for(ctx.call_id, ctx.name, ctx.args),
                what=f"{ctx.call_id} is in doubt", on_park=lambda: self._parked("in_doubt"))
        if verdict.verdict == "rerun":
            log.info("session %s: call %s runs again on an operator's verdict",
                     self.session_id, ctx.call_id)
            return None
        reason = verdict.reason
        return ToolOutcome(
            f"{ctx.name} was not run again: it had started before and its outcome is unknown "
            f"(it may have taken effect); {verdict.by.actor} decided not to re-run "
            f"it" + (f": {reason}" if reason else ""), is_error=True)

    def _within_budget(self, session: Session) -> Session:
        """Before a step: if the session's spend and the estimate of the next model call
        would pass its budget, park the turn (``budget/exceeded``, by budget) until a budget
        covers it — raised from any process — or it is cancelled. Returns the session as the
        decision read it."""
        guard = self.services.budget_guard
        check = guard.check(session.state)
        if check is None or not check.exceeded:
            return session
        if session.state.budget_wait is None:
            self._write(lambda s: s.park_on_budget(limit=check.limit, spent=check.spent,
                                                   estimate=check.estimate))
        else:
            self.work.flush()  # a resumed turn parks again: what it ran is logged first
        log.warning("session %s: spent $%.6f of its budget $%.6f (next model call estimated at "
                    "$%.6f); "
                    "the turn waits for a higher budget", self.session_id, check.spent,
                    check.limit, check.estimate)

        def covered(s: Session) -> Session | None:
            found = guard.check(s.state)
            return s if found is None or not found.exceeded else None

        return self.gate.wait(self.session_id, covered, what="parked on its budget",
                              on_park=lambda: self._parked("budget"))


def _shaped(spec: str, call: ToolCall) -> ToolCall:
    """A reply's call, of the shape a call has. A provider of your own (or a script) whose
    call is of another shape fails the step as the HTTP providers' malformed replies do
    (``MalformedStream``), not with the payload's validation error — checked before the ids
    are told apart (an id that is no text cannot be)."""
    if not isinstance(call.args, dict) or not isinstance(call.name, str) \
            or not isinstance(call.id, str):
        raise errors.MalformedStream(
            spec, f"tool call {call.name!r} is not an id and a name (text) with arguments "
                  f"that are a JSON object (its arguments: {type(call.args).__name__})")
    return call


def _call_data(spec: str, call: ToolCall) -> ToolCallData:
    """A reply's call as the log records it (``MalformedStream`` for a value the payload
    refuses, an empty name say)."""
    if args_too_deep(call.args):  # as the HTTP providers refuse them: the reply keeps its usage
        raise errors.MalformedStream(spec, f"arguments of tool call {call.name!r} are nested "
                                           f"more than {MAX_ARGUMENT_DEPTH} levels deep")
    try:
        data = ToolCallData(id=call.id, name=call.name, args=call.args)
        # An integer too long to read back, a model where the arguments' type says Any: what
        # the reply's assistant/message would refuse, said of the call.
        check_storable(data, ToolCallData.__name__)
    except (ValueError, errors.InvalidPayload) as exc:  # a value the payload refuses
        raise errors.MalformedStream(spec, f"tool call {call.name!r}: {exc}") from None
    return data
