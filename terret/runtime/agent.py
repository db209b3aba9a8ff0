"""An agent: the live instance serving one session in this process (R22), and its turns.

Status (R1) is ``idle → running → waiting_approval → running → idle``; a parked agent refuses a
new turn like a running one. A turn also parks on its spend budget (``waiting_budget``) and on a
call in doubt (``waiting_in_doubt``). The turn loop appends through the ``Session`` aggregate
and reads the messages view after waiting for its own last write (read-your-writes).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from uuid import UUID

from terret.domain import errors
from terret.domain.codec import RecordedEvent
from terret.domain.events import Actor, ToolCallData, TurnStatus, UsageData
from terret.domain.messages import Message
from terret.domain.session import Session
from terret.projections.messages import message_of
from terret.runtime.allowlist import AllowList
from terret.runtime.approvals import ApprovalGate, TurnCancelled, TurnSuspended
from terret.runtime.hooks import PreStepHook, StepClaim
from terret.runtime.model import ModelReply, ModelRequest, TextSink
from terret.runtime.ownership import SessionLease
from terret.runtime.tools import CallContext, Tool, ToolContext, ToolOutcome, ToolPipeline

if TYPE_CHECKING:
    from terret.runtime.runtime import Runtime

log = logging.getLogger("terret.agent")


@dataclass(frozen=True)
class AgentDefinition:
    """What an agent is: instructions, tools, the allow-list floor (R23: deny by default — a
    tool runs only if a pattern allows it), the step cap (R2)."""

    name: str = "default"
    revision: int = 1
    instructions: str = ""
    tools: Sequence[Tool] = ()
    allow: Sequence[str] = ()
    max_steps: int | None = None
    """The step cap of this agent's turns; None takes ``RuntimeConfig.max_steps``."""
    pre_step: Sequence[PreStepHook] = field(default_factory=tuple)


@dataclass(frozen=True)
class TurnResult:
    session_id: UUID
    turn: int
    status: TurnStatus
    text: str = ""


class Agent:
    def __init__(self, runtime: Runtime, agent_id: str, session_id: UUID,
                 definition: AgentDefinition) -> None:
        self.runtime = runtime
        self.id = agent_id
        self.session_id = session_id
        self.definition = definition
        self._status = "idle"
        self._lock = threading.Lock()
        self.cancel_event = threading.Event()
        self.on_text: TextSink | None = None
        self.context: ToolContext = runtime.tool_context.fork()
        self.allowlist = AllowList(definition.allow,
                                   lambda sid: runtime.writer.load(sid).state.policy)
        self.context.pre_execute.append(self.allowlist)
        self.ownership = SessionLease(runtime.lease, agent_id)
        self.gate = ApprovalGate(
            runtime.writer, runtime.signals,
            max_wait=runtime.config.approval_max_wait,
            on_park=lambda: self._parked("approval"),
            on_unpark=lambda: self._set_status("running"),
            stopping=runtime.stopping,
            fence=self.ownership.fence,
        )
        self.pipeline = ToolPipeline(definition.tools, self.context, self.gate,
                                     timeout=runtime.config.tool_timeout,
                                     cancel=self.cancel_event, on_start=self._tool_started)
        self._listeners = [
            runtime.runner.add_listener(self._on_cancel, {"turn/cancel_requested"}),
        ]
        self._thread: threading.Thread | None = None
        self._last_position = 0
        self._last_version = 0
        self._carry: Callable[[Session], None] | None = None
        self._context: list[Message] | None = None  # the last request's messages (see _step)
        self._context_version = 0

    # --- status --------------------------------------------------------------------------

    @property
    def status(self) -> str:
        return self._status

    def _set_status(self, status: str) -> None:
        self._status = status

    def _parked(self, kind: str) -> None:
        """``kind``: ``approval``, ``budget`` or ``in_doubt``."""
        self._context = None  # a parked turn may wait for days: it keeps no history around
        log.info("session %s parked on %s", self.session_id,
                 {"approval": "an approval", "budget": "its budget",
                  "in_doubt": "a call in doubt"}.get(kind, kind))
        self._set_status(f"waiting_{kind}")

    @property
    def max_steps(self) -> int:
        """R2: the definition's cap, else the runtime's (``MAX_STEPS`` by default)."""
        return self.definition.max_steps or self.runtime.config.max_steps

    @property
    def busy(self) -> bool:
        return self._lock.locked()

    def _on_cancel(self, event: RecordedEvent) -> None:
        """A cancel recorded by any process stops this agent's turn at its next boundary and
        closes an in-flight model stream (R13, ARCHITECTURE §7) — if it is this turn's: one
        delivered late, after its turn closed, must not cancel the next turn."""
        if event.session_id != self.session_id or not self.busy:
            return
        if self.runtime.writer.load(self.session_id).state.cancel_requested:
            self.cancel_event.set()

    def release(self) -> None:
        """Remove every listener this agent registered (R22, R26)."""
        for handle in self._listeners:
            handle.remove()
        self._listeners.clear()

    # --- turns ---------------------------------------------------------------------------

    def _claim(self) -> None:
        if not self._lock.acquire(blocking=False):
            raise errors.TurnAlreadyRunning(
                f"agent {self.id} is already mid-turn on session {self.session_id}"
            )
        self.cancel_event.clear()
        self._set_status("running")

    def _release_claim(self) -> None:
        self._set_status("idle")
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
                self.ownership.take(s, take_idle=take_idle)  # the attach rides with the start
                return s.start_turn(trigger=trigger, text=text or None, inbox_id=inbox_id)

            # Not yet the turn's owner: the start is validated on the store's latest state (and
            # again on a conflict), so a turn another process opened is refused, not fought.
            turn = self._write(start, owner=False)
            log.info("session %s turn %d started (%s)", self.session_id, turn, trigger)
            return self._drive(turn, resumed=False)
        finally:
            self._release_claim()

    def resume_turn(self) -> TurnResult:
        """R14–R16: re-enter the open turn without a second ``turn/start``. A failure leaves the
        turn open (it stays resumable) and is re-raised."""
        self._claim()
        try:
            session = self.runtime.writer.load(self.session_id)
            if not session.turn_open:
                raise errors.NoOpenTurn(f"session {self.session_id} has no open turn to resume")
            if not self.ownership.held(session):
                # Taken over from an owner whose lease expired (never from a live one).
                self._write(lambda s: self.ownership.take(s, take_idle=False), owner=False)
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

    def _write(self, command: Callable[[Session], Any], *, owner: bool = True) -> Any:
        """Append what ``command`` records, after whatever the loop is carrying (a step's last
        tool result and its ``step/end`` ride with the next step's ``step/start``: one durable
        append instead of two). If the append fails, the carried part stays carried."""
        carry, self._carry = self._carry, None
        attempt: list[Any] = []

        def run(s: Session) -> Any:
            if owner:
                self.ownership.fence(s)  # R28: only the lease holder's writes land
            attempt[:] = [s.version]  # the version this attempt appends after
            if carry is not None:
                carry(s)
            value = command(s)
            attempt.append([getattr(e, "payload", None) for e in s.pending_events])
            return value

        try:
            value, result = self.runtime.writer.execute(self.session_id, run, owner=owner)
        except BaseException:
            self._carry = carry
            raise
        if result is not None:
            self._last_position, self._last_version = result.position, result.version
            self._follow_context(attempt[0], attempt[1], result.version)
        return value

    def _follow_context(self, base: int, payloads: list[Any], version: int) -> None:
        """Keep the model's context (the last request's messages) in step with this agent's own
        appends: while nothing else lands in the session, the next request is that context plus
        what these appends show the model, exactly as the messages projection renders it."""
        if self._context is None:
            return
        rendered = _rendered(payloads) if base == self._context_version else None
        if rendered is None:
            self._context = None  # something else landed (or a compaction): read the view
            return
        self._context.extend(rendered)
        self._context_version = version

    def _drop_carry(self) -> None:
        self._carry = None

    def _flush(self) -> None:
        if self._carry is not None:
            self._write(lambda s: None)

    def _flush_quietly(self) -> None:
        """On the way out of a turn that stays open: what ran is logged, if it still can be."""
        try:
            self._flush()
        except errors.TerretError as exc:
            log.warning("session %s: a tool result could not be logged (%s); the call will run "
                        "again on resume", self.session_id, exc)
        self._drop_carry()

    def _end(self, turn: int, status: TurnStatus, *, reason: str | None = None,
             by: Actor | None = None, error: str | None = None, text: str = "") -> TurnResult:
        self._write(lambda s: s.end_turn(status, reason=reason, by=by, error=error))
        log.info("session %s turn %d ended %s", self.session_id, turn, status)
        return TurnResult(self.session_id, turn, status, text)

    def _drive(self, turn: int, *, resumed: bool) -> TurnResult:
        self._drop_carry()
        self._context = None
        try:
            return self._drive_steps(turn, resumed=resumed)
        finally:
            self._context = None

    def _drive_steps(self, turn: int, *, resumed: bool) -> TurnResult:
        try:
            if resumed:
                closed = self._close_open_step(turn)
                if closed is not None:
                    return closed
            else:
                session = self.runtime.writer.load(self.session_id)
                if not session.state.turn_input and not session.state.inbox:
                    return self._end(turn, "empty", reason="nothing to do")
            while True:
                result = self._step(turn)
                if result is not None:
                    return result
        except (TurnCancelled, errors.ModelCancelled):
            return self._close_cancelled(turn)
        except TurnSuspended:
            self._flush_quietly()
            log.info("session %s turn %d suspended; it stays resumable", self.session_id, turn)
            raise
        except errors.LostOwnership:
            self._drop_carry()
            log.warning("session %s: lost ownership; turn %d stops without writing",
                        self.session_id, turn)
            raise
        except errors.MaxStepsExceeded as exc:
            self._end(turn, "failed", error=str(exc))
            raise
        except Exception as exc:
            if resumed:
                self._flush_quietly()
                log.warning("resume of session %s failed; the turn stays open: %s",
                            self.session_id, exc)
                raise
            if not self._still_open(turn):
                self._drop_carry()
                log.warning("session %s turn %d was closed by another writer; stopping without "
                            "writing: %s", self.session_id, turn, exc)
                raise
            self._end(turn, "failed", error=f"{type(exc).__name__}: {exc}")
            raise
        except BaseException as exc:  # KeyboardInterrupt, SystemExit: a stop, never retried
            try:
                self._end(turn, "failed", error=type(exc).__name__ + (f": {exc}" if str(exc)
                                                                      else ""))
            except Exception as end_exc:  # noqa: BLE001 - the stop is what propagates
                self._drop_carry()
                log.warning("session %s turn %d stopped by %s and left open: %s",
                            self.session_id, turn, type(exc).__name__, end_exc)
            raise

    def _still_open(self, turn: int) -> bool:
        session = self.runtime.writer.load(self.session_id)
        return session.turn_open and session.current_turn == turn

    def _close_cancelled(self, turn: int) -> TurnResult:
        self._write(_end_cancelled)
        log.info("session %s turn %d ended cancelled", self.session_id, turn)
        return TurnResult(self.session_id, turn, "cancelled")

    def _close_open_step(self, turn: int) -> TurnResult | None:
        """R15/R16: re-execute owed calls, close the step without usage; decide the edges."""
        session = self.runtime.writer.load(self.session_id)
        state = session.state
        if state.cancel_requested:
            raise TurnCancelled("cancel recorded before resume")
        # The owed calls go through the allow-list and the steps through pre-step hooks, which
        # read the views: bring them up to the log a previous process left.
        self.runtime.catch_up_views()
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
        runtime = self.runtime
        if runtime.stopping.is_set():
            raise TurnSuspended("the process is stopping")
        # Other processes may have queued text or recorded a cancel since the last write.
        session = runtime.writer.load(self.session_id)
        if session.state.cancel_requested or self.cancel_event.is_set():
            raise TurnCancelled("cancel requested")
        spec = runtime.model_spec(session, "main")
        session = self._within_budget(session)
        claim = StepClaim(self.session_id, turn, session.current_step + 1, spec)
        hooks = (*runtime.pre_step, *self.definition.pre_step)
        if hooks:  # hooks may read views: let them see this turn's own writes
            self._flush()
            runtime.wait_for(self._last_position)
        for hook in hooks:
            refusal = hook(claim)
            if refusal is not None:
                return self._end(turn, "rejected", reason=refusal.reason,
                                 by=Actor(actor=refusal.actor))  # type: ignore[arg-type]

        def open_step(s: Session) -> int:
            if s.state.cancel_requested:  # folded in on a conflict: the cancel wins (R13)
                raise TurnCancelled("cancel requested")
            step = s.start_step(spec, max_steps=self.max_steps)
            s.take_inbox()
            return step

        step = self._write(open_step)
        if self._context is not None:
            # Nothing but this agent's own appends since the last request: the messages view
            # would show the last request's messages plus what those appends added.
            messages = list(self._context)
        else:
            # Read-your-writes: the view, once the projections include this step's start.
            runtime.wait_for(self._last_position)
            messages = runtime.views.messages(self.session_id)
            self._context = list(messages)
            self._context_version = self._last_version  # the version the view was read at
        reply = self._ask(spec, messages)
        del messages  # what a parked call keeps alive is bounded, not its history
        calls = [ToolCallData(id=c.id, name=c.name, args=c.args) for c in reply.tool_calls]
        usage = None
        if reply.usage is not None:
            usage = UsageData(prompt_tokens=reply.usage.prompt_tokens,
                              completion_tokens=reply.usage.completion_tokens,
                              cost=reply.usage.cost)

        def answer(s: Session) -> TurnStatus | None:
            """Record the reply with the model call's usage (durable with it: a cancel, a kill
            or a resume later cannot lose it); a final one ends the step and the turn in the
            same append (a crash leaves the step open, and resume asks again). A cancel
            recorded while the model answered wins here, at the step's boundary (R13): the
            reply and its usage are kept, its calls answered as not run, and the turn closes
            cancelled."""
            s.record_assistant(reply.text, calls, model=spec, usage=usage)
            if s.state.cancel_requested:
                for c in calls:
                    s.record_tool_result(c.id, c.name, f"{c.name} was not run: the turn was "
                                         "cancelled", is_error=True)
                s.end_step()
                _end_cancelled(s)
                return "cancelled"
            if calls:
                return None
            s.end_step()
            s.end_turn("completed")
            return "completed"

        # The calls are durable before any of them runs (R15: at-least-once, never lost).
        ended = self._write(answer)
        if ended is not None:
            log.info("session %s turn %d ended %s", self.session_id, turn, ended)
            return TurnResult(self.session_id, turn, ended, reply.text)
        self._run_calls(turn, calls)
        log.debug("session %s turn %d step %d closed", self.session_id, turn, step)
        return None

    def _ask(self, spec: str, messages: list[Message]) -> ModelReply:
        self.ownership.check()  # R28: no model request on a lease that may have run out
        provider, model = self.runtime.resolver.resolve(spec)
        system = [Message(role="system", text=self.definition.instructions)] \
            if self.definition.instructions else []
        request = ModelRequest(model=model, messages=[*system, *messages],
                               tools=self.pipeline.specs())
        return provider.complete(request, on_text=self.on_text, cancel=self.cancel_event)

    def _run_calls(self, turn: int, calls: Sequence[ToolCallData], *,
                   resumed: bool = False) -> None:
        """Run the step's calls in order, each result appended as it comes; the last result
        and the step's ``step/end`` are carried into the next append. A call in doubt (it
        started, and left no result) is never run again without an operator's verdict."""
        for i, call in enumerate(calls):
            # R28: confirm the lease before each call: no tool runs for a worker that may have
            # lost the session (frozen past its lease, taken over meanwhile).
            self.ownership.check()
            session = self.runtime.writer.load(self.session_id)
            self.ownership.fence(session)
            ctx = CallContext(self.session_id, call.id, call.name, dict(call.args), turn)
            outcome = None
            if call.id in session.state.started:
                outcome = self._settle_in_doubt(ctx, session)
            if outcome is None:
                outcome = self.pipeline.run(ctx)
            self._record_result(call, outcome.content, outcome.is_error,
                                close_step=i == len(calls) - 1, resumed=resumed)
            if outcome.stop is not None:  # recorded first: the log says why the call ended
                raise outcome.stop

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
        if verdict["verdict"] == "rerun":
            log.info("session %s: call %s runs again on an operator's verdict",
                     self.session_id, ctx.call_id)
            return None
        by = verdict.get("by") or {}
        reason = verdict.get("reason")
        return ToolOutcome(
            f"{ctx.name} was not run again: it had started before and its outcome is unknown "
            f"(it may have taken effect); {by.get('actor', 'someone')} decided not to re-run "
            f"it" + (f": {reason}" if reason else ""), is_error=True)

    def _within_budget(self, session: Session) -> Session:
        """Before a step: if the session's spend and the estimate of the next model call
        would pass its budget, park the turn (``budget/exceeded``, by budget) until a budget
        covers it — raised from any process — or it is cancelled. Returns the session as the
        decision read it."""
        guard = self.runtime.budget_guard
        check = guard.check(session.state)
        if check is None or not check.exceeded:
            return session
        if session.state.budget_wait is None:
            self._write(lambda s: s.park_on_budget(limit=check.limit, spent=check.spent,
                                                   estimate=check.estimate))
        else:
            self._flush()  # a resumed turn parks again: what it ran is logged first
        log.warning("session %s: spent %g of its budget %g (next model call estimated at %g); "
                    "the turn waits for a higher budget", self.session_id, check.spent,
                    check.limit, check.estimate)

        def covered(s: Session) -> Session | None:
            found = guard.check(s.state)
            return s if found is None or not found.exceeded else None

        return self.gate.wait(self.session_id, covered, what="parked on its budget",
                              on_park=lambda: self._parked("budget"))

    def _record_result(self, call: ToolCallData, content: str, is_error: bool, *,
                       close_step: bool = False, resumed: bool = False) -> None:
        def record(s: Session) -> None:
            s.record_tool_result(call.id, call.name, content, is_error=is_error)
            if close_step:
                s.end_step(resumed=resumed)

        if close_step:
            self._carry = record  # written with whatever comes next, step/start or turn/end
        else:
            self._write(record)


def _end_cancelled(s: Session) -> None:
    """Close the turn cancelled, attributed to whoever recorded the cancel (a local cancel
    event without a recorded one is this process stopping the turn: no actor)."""
    by = Actor(**s.state.cancel_by) if s.state.cancel_by else None
    s.end_turn("cancelled", reason=s.state.cancel_reason, by=by)


def _rendered(payloads: list[Any]) -> list[Message] | None:
    """What these events show the model, as the messages projection renders them; None when
    one of them is something the loop does not render itself (a compaction, a model-visible
    extension event): the caller then reads the view."""
    out: list[Message] = []
    for p in payloads:
        message = message_of(p)
        if message is not None:
            out.append(message)
        elif getattr(p, "model_visible", False):
            return None
    return out
