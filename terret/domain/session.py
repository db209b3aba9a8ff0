"""The ``Session`` aggregate: the invariants of one session's log, and nothing else.

It keeps what its rules need — the open turn and its step, the tool calls owed, the open turn's
approvals, whether it was titled or closed, the latest compaction, the pending inbox — never the
message history (that is the messages projection's job). Every command validates first and then
triggers events; a refused command raises a typed error and leaves no pending event.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from datetime import UTC, datetime
from decimal import Decimal
from numbers import Real
from typing import Any
from uuid import UUID, uuid4

from eventsourcing.domain import Aggregate

from terret._text import cut
from terret.domain import errors
from terret.domain.catalogue import EventPayload, OpaquePayload, text_problem
from terret.domain.codec import RecordedEvent
from terret.domain.errors import shown
from terret.domain.events import (
    MAX_MESSAGE_BYTES,
    TITLE_MAX,
    Actor,
    AgentAttached,
    AgentDetached,
    AgentRevised,
    ApprovalRequested,
    ApprovalResolved,
    AssistantMessage,
    BudgetExceeded,
    BudgetSet,
    CancelRequested,
    ContextInjected,
    InboxQueued,
    InDoubtResolved,
    ModelSet,
    PolicyReset,
    PolicyUpdated,
    SessionClosed,
    SessionCompacted,
    SessionStarted,
    SessionTitled,
    StepEnded,
    StepStarted,
    ToolCallData,
    ToolInDoubt,
    ToolResult,
    ToolStarted,
    TurnEnded,
    TurnStarted,
    TurnStatus,
    UpkeepPurpose,
    UsageData,
    UsageRecorded,
    UserMessage,
    reason_problem,
)
from terret.domain.keys import KEY_REFUSED, looks_like_key
from terret.domain.state import (
    EVOLVING,
    InboxEntry,
    OwedCall,
    SessionState,
    Verdict,
    WaitingCall,
    call_key,
    evolve,
)

__all__ = ["EVOLVING", "MAX_STEPS", "Session", "SessionState", "evolve"]

MAX_STEPS = 25


class Session(Aggregate):
    """Commands are methods; each validates and then records payloads with ``_record``."""

    class Started(Aggregate.Created):
        payload: SessionStarted
        event_id: UUID

    class Recorded(Aggregate.Event):
        payload: EventPayload
        event_id: UUID

        def apply(self, aggregate: Session) -> None:
            aggregate._apply(self.payload, aggregate.version + 1)

    def __init__(self, payload: SessionStarted, event_id: UUID) -> None:
        # the same state a replay of session/started gives: its own handler
        self.state = SessionState(created_on=self.created_on.timestamp())
        evolve(self.state, payload, 1)

    # --- creation and loading -------------------------------------------------------------

    @classmethod
    def start(
        cls,
        session_id: UUID | None = None,
        *,
        agent: str = "default",
        agent_revision: int = 1,
        roles: dict[str, str] | None = None,
        policy_floor: Sequence[str] | None = None,
    ) -> Session:
        for role, spec in (roles or {}).items():
            if isinstance(spec, str) and looks_like_key(spec):
                raise errors.InvalidPayload(SessionStarted.wire_name, "roles",
                                            f"role {cut(str(role), 40)!r}: {KEY_REFUSED}")
        payload = SessionStarted(
            agent=agent,
            agent_revision=agent_revision,
            roles=dict(roles or {}),
            policy_floor=list(policy_floor) if policy_floor is not None else None,
        )
        return cls._create(cls.Started, id=session_id or uuid4(), payload=payload,
                           event_id=uuid4())

    @classmethod
    def restore(cls, session_id: UUID, version: int, state: SessionState) -> Session:
        """Rebuild from a snapshot (or an empty shell at version 0 for a replay)."""
        session = cls.__new__(cls)
        # When the session was created, as its snapshot recorded it (a replay from version 0
        # sets it from the session/started it reads).
        at = (datetime.fromtimestamp(state.created_on, UTC) if state.created_on is not None
              else datetime.now(UTC))
        session.__base_init__(originator_id=session_id, originator_version=version, timestamp=at)
        session.state = state
        return session

    def replay(self, event: RecordedEvent) -> None:
        """Apply a stored event (no validation: the log is the truth). A gap in the seqs is a
        corrupt log, reported at the position of the event after it."""
        if event.seq != self.version + 1:
            raise errors.CorruptRecord(
                event.position, f"gap in {event.stream} before seq {event.seq} "
                f"(the session is at {self.version})")
        self._apply(event.payload, event.seq)
        self.version = event.seq
        if event.seq == 1:
            self.note_created(event.recorded_at)
        self._modified_on = datetime.fromtimestamp(event.recorded_at, UTC)

    def note_created(self, recorded_at: float) -> None:
        """When the session was created: its ``session/started`` as recorded."""
        self.state.created_on = recorded_at
        self._created_on = datetime.fromtimestamp(recorded_at, UTC)

    # --- what commands may read ----------------------------------------------------------

    @property
    def turn_open(self) -> bool:
        return self.state.turn_open

    @property
    def current_turn(self) -> int:
        return self.state.turn

    @property
    def current_step(self) -> int:
        return self.state.step

    @property
    def closed(self) -> bool:
        return self.state.closed

    def owed_calls(self) -> list[ToolCallData]:
        return [ToolCallData(id=c.id, name=c.name, args=c.args)
                for c in self.state.owed.values()]

    def pending_approvals(self) -> dict[str, WaitingCall]:
        return dict(self.state.pending)

    def verdict_for(self, call_id: str, name: str, args: dict[str, Any]) -> Verdict | None:
        """The open turn's verdict for this exact call (id, tool and arguments — R11)."""
        found = self.state.verdicts.get(call_id)
        if found is None or found.key != call_key(name, args):
            return None
        return found

    def asked_about(self, call_id: str, name: str, args: dict[str, Any]) -> bool:
        """Whether a person was asked about this exact call in the open turn: its approval
        request waits, or its verdict is recorded and not yet spent. A release that no longer
        asks about the tool still owes that request its verdict (R12)."""
        waiting = self.state.pending.get(call_id)
        return (waiting is not None and call_key(waiting.name, waiting.args)
                == call_key(name, args)) or self.verdict_for(call_id, name, args) is not None

    def pending_inbox(self) -> dict[str, InboxEntry]:
        return dict(self.state.inbox)

    def in_doubt(self) -> dict[str, WaitingCall]:
        """The open turn's calls in doubt without a verdict."""
        return dict(self.state.doubts)

    def doubt_verdict_for(self, call_id: str, name: str,
                          args: dict[str, Any]) -> Verdict | None:
        """The open turn's verdict on this call in doubt (id, tool and arguments)."""
        found = self.state.doubt_verdicts.get(call_id)
        if found is None or found.key != call_key(name, args):
            return None
        return found

    # --- commands ------------------------------------------------------------------------

    def _record(self, payload: EventPayload) -> None:
        self.trigger_event(self.Recorded, payload=payload, event_id=uuid4())

    def _require_open(self) -> None:
        if self.state.closed:
            raise errors.SessionClosed(f"session {self.id} is closed")

    def _require_turn(self) -> None:
        if not self.state.turn_open:
            raise errors.NoOpenTurn(f"session {self.id} has no open turn")

    @staticmethod
    def _storable(wire_name: str, **texts: str | None) -> None:
        """Text that cannot be recorded whatever the session's state (a lone surrogate) is
        refused first, before the rules: the same input is refused the same way every time."""
        for name, text in texts.items():
            if text is not None and not isinstance(text, str):  # pydantic would decode bytes
                raise errors.InvalidPayload(wire_name, name,
                                            f"a string, not {type(text).__name__}")
            problem = text_problem(text) if isinstance(text, str) else None
            if problem is not None:
                raise errors.InvalidPayload(wire_name, name, problem)

    @staticmethod
    def _reason_fits(wire_name: str, reason: str | None) -> None:
        """A person's reason, checked before anything is recorded: past ``REASON_MAX`` it is
        refused (``InvalidPayload``) rather than met later, when a cancel's append — its reason
        repeated for every call it stops — is over the store's limit and the turn cannot close."""
        problem = reason_problem(reason)
        if problem is not None:
            raise errors.InvalidPayload(wire_name, "reason", problem)

    def queue(self, text: str, *, wake: bool = False, inbox_id: str | None = None) -> str:
        """Blank text is refused (``InvalidPayload``): a step would take nothing from it."""
        self._storable(InboxQueued.wire_name, text=text)
        payload = InboxQueued(inbox_id=inbox_id or uuid4().hex, text=text, wake=wake)
        if not payload.text.strip():
            raise errors.InvalidPayload(InboxQueued.wire_name, "text", "the text is blank")
        _message_fits(payload)
        self._require_open()
        self._record(payload)
        return payload.inbox_id

    def require_no_open_turn(self) -> None:
        """R4: a new turn needs an open session whose log holds no open turn."""
        self._require_open()
        if self.state.turn_open:
            raise errors.TurnOpenInLog(
                f"session {self.id} has open turn {self.state.turn}; resume it instead"
            )

    def start_turn(self, *, trigger: str = "user", text: str | None = None,
                   inbox_id: str | None = None) -> int:
        """R4: refused while the log holds an open turn. The input is logged with the start."""
        self._storable(TurnStarted.wire_name, trigger=trigger)
        self._storable(UserMessage.wire_name, text=text, inbox_id=inbox_id)
        self.require_no_open_turn()
        turn = self.state.turn + 1
        # Both payloads are validated before either is recorded: a refusal leaves nothing.
        started, message = _turn_start(turn, trigger, text, inbox_id)
        self._record(started)
        if message is not None:
            # What was queued before the input comes before it, as it was queued: the model
            # answers the last message, which must be the input, not an older note.
            self.take_inbox(before=inbox_id, room=MAX_MESSAGE_BYTES - len(message.to_json()),
                            at_least_one=False)
            self._record(message)
        return turn

    @classmethod
    def check_turn_input(cls, *, trigger: str = "user", text: str | None = None,
                         inbox_id: str | None = None) -> None:
        """The checks ``start_turn`` makes of its input whatever the session's state
        (``InvalidPayload``): a caller about to claim a session for a turn makes them first, so
        that input refused writes nothing, not even the claim."""
        cls._storable(TurnStarted.wire_name, trigger=trigger)
        cls._storable(UserMessage.wire_name, text=text, inbox_id=inbox_id)
        _turn_start(1, trigger, text, inbox_id)

    def take_inbox(self, *, before: str | None = None, room: int = MAX_MESSAGE_BYTES,
                   at_least_one: bool = True) -> list[str]:
        """Move the pending inbox entries into the log as ``context/injected`` (R24), oldest
        first — those queued before the entry ``before`` when given — as many as take ``room``
        together (one at least, unless ``at_least_one`` is off): they ride in the step's (or
        the turn start's) append, which EventStoreDB bounds whole; the rest ride the next
        steps."""
        self._require_turn()
        taken: list[str] = []
        for inbox_id, entry in list(self.state.inbox.items()):
            if inbox_id == before:
                break
            injected = ContextInjected(text=entry.text, inbox_id=inbox_id)
            size = len(injected.to_json())
            if (taken or not at_least_one) and size > room:
                break
            self._record(injected)
            taken.append(entry.text)
            room -= size
        return taken

    def start_step(self, model: str, *, max_steps: int = MAX_STEPS) -> int:
        """R2: the step after ``max_steps`` raises. R16: an abandoned step (no assistant message)
        stays unclosed and numbering continues."""
        self._require_turn()
        if self.state.step_open and self.state.step_answered:
            raise errors.StepOpen(f"step {self.state.step} of turn {self.state.turn} is open")
        step = self.state.step + 1
        if step > max_steps:
            raise errors.MaxStepsExceeded(
                f"turn {self.state.turn} would take step {step}; the limit is {max_steps}"
            )
        self._record(StepStarted(turn=self.state.turn, step=step, model=model))
        return step

    def record_assistant(self, text: str, tool_calls: Iterable[ToolCallData] = (), *,
                         model: str | None = None, usage: UsageData | None = None) -> None:
        """The reply to the open step. With ``model`` (the spec that answered) the reply is
        metered: ``usage`` is the model call's, durable with it, and the step's ``step/end``
        carries none. Without, usage may come with the ``step/end`` (the older shape)."""
        self._storable(AssistantMessage.wire_name, text=text)
        if usage is not None and model is None:
            raise errors.InvalidPayload(AssistantMessage.wire_name, "model",
                                        "usage is recorded with the model that reported it")
        self._require_turn()
        if not self.state.step_open or self.state.step_answered:
            raise errors.NoOpenStep(f"turn {self.state.turn} has no step awaiting a reply")
        calls = list(tool_calls)
        ids = [c.id for c in calls]
        if len(set(ids)) != len(ids):
            raise errors.InvalidPayload(AssistantMessage.wire_name, "tool_calls",
                                        "duplicate call ids")
        self._record(AssistantMessage(text=text, tool_calls=calls, model=model, usage=usage))

    def record_tool_result(self, call_id: str, name: str, content: str, *,
                           is_error: bool = False) -> None:
        """R26: a result for a call that is not owed (closed turn, answered) is refused."""
        self._storable(ToolResult.wire_name, call_id=call_id, name=name, content=content)
        owed = self.state.owed.get(call_id)
        if not self.state.turn_open or owed is None or owed.name != name:
            raise errors.ToolCallNotOwed(
                f"call {shown(call_id)} ({shown(name)}) is not owed by the open turn of "
                f"session {self.id}"
            )
        self._record(ToolResult(call_id=call_id, name=name, content=content, is_error=is_error))

    def end_step(self, usage: UsageData | None = None, *, resumed: bool = False) -> None:
        """Close the open step. ``usage`` only for a step whose reply is unmetered (a metered
        reply already carries it: counting it here too would count it twice); ``resumed``
        when a resume closes it (R15)."""
        self._require_turn()
        if not self.state.step_open:
            raise errors.NoOpenStep(f"turn {self.state.turn} has no open step")
        if self.state.owed:
            raise errors.StepOpen(
                f"step {self.state.step} still owes results for {sorted(self.state.owed)}"
            )
        if usage is not None and self.state.step_metered:
            raise errors.InvalidPayload(StepEnded.wire_name, "usage",
                                        "the step's reply already carries its usage")
        self._record(StepEnded(turn=self.state.turn, step=self.state.step, usage=usage,
                               resumed=resumed or None))

    def _owed(self, wire_name: str, call_id: str, name: str) -> OwedCall:
        self._storable(wire_name, call_id=call_id, name=name)
        owed = self.state.owed.get(call_id)
        if not self.state.turn_open or owed is None or owed.name != name:
            raise errors.ToolCallNotOwed(
                f"call {shown(call_id)} ({shown(name)}) is not owed by the open turn of "
                f"session {self.id}")
        return owed

    def start_tool(self, call_id: str, name: str) -> None:
        """Record that a call of a tool that may not run twice is about to run. A call that
        started before and has no result is in doubt: it starts again only after a ``rerun``
        verdict (``CallInDoubt`` otherwise), so it is never re-run blindly."""
        owed = self._owed(ToolStarted.wire_name, call_id, name)
        verdict = self.doubt_verdict_for(call_id, name, owed.args)
        if call_id in self.state.started and (verdict is None or verdict.verdict != "rerun"):
            raise errors.CallInDoubt(
                f"call {shown(call_id)} ({shown(name)}) started before and has no result: "
                "it runs again only on an operator's verdict")
        self._record(ToolStarted(call_id=call_id, name=name))

    def mark_in_doubt(self, call_id: str, name: str) -> None:
        """Record that a started call has no result and waits for a verdict."""
        owed = self._owed(ToolInDoubt.wire_name, call_id, name)
        if call_id not in self.state.started:
            raise errors.CallNotInDoubt(f"call {shown(call_id)} has not started")
        if call_id in self.state.doubts or self.doubt_verdict_for(call_id, name, owed.args):
            raise errors.CallNotInDoubt(f"call {shown(call_id)} is already in doubt")
        self._record(ToolInDoubt(call_id=call_id, name=name, args=owed.args))

    def resolve_in_doubt(self, call_id: str, verdict: str, *, by: Actor,
                         reason: str | None = None, name: str | None = None,
                         args: dict[str, Any] | None = None) -> None:
        """A verdict on a call in doubt in the open turn: ``rerun`` or ``skipped``. When the
        caller names the tool and arguments it decided on, they must match (as R11)."""
        self._storable(InDoubtResolved.wire_name, call_id=call_id, reason=reason)
        self._reason_fits(InDoubtResolved.wire_name, reason)
        _decided_args(InDoubtResolved.wire_name, name, args)
        payload = InDoubtResolved(call_id=call_id, verdict=verdict,  # type: ignore[arg-type]
                                  reason=reason, by=by)
        doubt = self.state.doubts.get(call_id) if self.state.turn_open else None
        decided = self.state.doubt_verdicts.get(call_id) if self.state.turn_open else None
        if doubt is None and decided is not None:  # another verdict got there first
            raise errors.CallNotInDoubt(
                f"call {shown(call_id)} was decided already ({_decided_by(decided)}): "
                "that verdict stands")
        if doubt is None and self.state.turn_open and call_id in self.state.started:
            raise errors.CallNotInDoubt(
                f"call {shown(call_id)} started and has no result, but is not in doubt yet: "
                "it is still running, or its process died and no process has resumed the turn "
                "to mark it (`terret resume SESSION --app …`, or `terret serve`, parks it in "
                "doubt; then decide)")
        if doubt is None:
            raise errors.CallNotInDoubt(
                f"call {shown(call_id)} is not in doubt in the open turn of session {self.id}")
        if not _decided_on(doubt, name, args):
            raise errors.CallNotInDoubt(
                f"call {shown(call_id)} is in doubt for a different tool or arguments")
        self._record(payload)

    def set_budget(self, limit: float | None, *, by: Actor, reason: str | None = None) -> None:
        """The session's own budget (None: the deployment's default applies again)."""
        if limit is not None and (isinstance(limit, bool)
                                  or not isinstance(limit, Real | Decimal)):
            # pydantic would read "5" as 5.0 and True as 1.0
            raise errors.InvalidPayload(BudgetSet.wire_name, "limit", "a number of dollars (None: "
                                        f"the default), not {errors.shown(limit)}")
        self._reason_fits(BudgetSet.wire_name, reason)
        payload = BudgetSet(limit=limit, reason=reason, by=by)
        self._require_open()
        self._record(payload)

    def park_on_budget(self, *, limit: float, spent: float, estimate: float) -> None:
        """The open turn waits on its budget before its next step (by: budget)."""
        self._require_turn()
        if self.state.step_open:
            raise errors.StepOpen(f"step {self.state.step} is open; park between steps")
        self._record(BudgetExceeded(turn=self.state.turn, limit=limit, spent=spent,
                                    estimate=estimate, by=Actor(actor="budget")))

    def request_approval(self, call_id: str, name: str, args: dict[str, Any]) -> None:
        self._storable(ApprovalRequested.wire_name, call_id=call_id, name=name)
        owed = self.state.owed.get(call_id)
        if not self.state.turn_open or owed is None or owed.name != name:
            raise errors.ToolCallNotOwed(
                f"call {shown(call_id)} ({shown(name)}) is not owed by the open turn")
        decided = self.state.verdicts.get(call_id)
        if call_id in self.state.pending or (
                decided is not None and decided.key == call_key(name, args)):
            raise errors.ApprovalAlreadyRequested(
                f"call {shown(call_id)} was already asked about")
        self._record(ApprovalRequested(call_id=call_id, name=name, args=args))

    def resolve_approval(self, call_id: str, verdict: str, *, by: Actor,
                         reason: str | None = None, name: str | None = None,
                         args: dict[str, Any] | None = None) -> None:
        """R11: only a request pending in the open turn can be resolved; when the caller names
        the tool and arguments it decided on, they must match the request."""
        self._storable(ApprovalResolved.wire_name, call_id=call_id, reason=reason)
        self._reason_fits(ApprovalResolved.wire_name, reason)
        _decided_args(ApprovalResolved.wire_name, name, args)
        request = self.state.pending.get(call_id) if self.state.turn_open else None
        if request is None:
            raise errors.ApprovalNotPending(
                f"call {shown(call_id)} is not pending in the open turn of session {self.id}"
                + self._why_not_pending(call_id))
        if self.state.cancel_requested:
            # The turn's cancel denies every standing request when it closes the turn (R13):
            # an approval accepted now would be reported done and never run.
            raise errors.ApprovalNotPending(
                f"call {shown(call_id)} of session {self.id} will not run: turn "
                f"{self.state.turn}'s cancel is recorded, and closing the turn denies it")
        if not _decided_on(request, name, args):
            raise errors.ApprovalNotPending(
                f"call {shown(call_id)} is pending for a different tool or arguments"
            )
        self._record(ApprovalResolved(call_id=call_id, verdict=verdict,  # type: ignore[arg-type]
                                      reason=reason, by=by))

    def _why_not_pending(self, call_id: str) -> str:
        """What the call is instead, when the log says: decided already, or in doubt (which an
        approval cannot decide: a re-run or a skip does)."""
        decided = self.state.verdicts.get(call_id) if self.state.turn_open else None
        if decided is not None:
            return f": it was decided already ({_decided_by(decided)}), that verdict stands"
        if self.state.turn_open and (call_id in self.state.doubts
                                     or call_id in self.state.started):
            return (": it is in doubt (it started and left no result); decide it with a re-run "
                    "or a skip (`terret in-doubt rerun|skip`, `Runtime.rerun`/`skip`)")
        return ""

    def request_cancel(self, *, by: Actor, reason: str | None = None) -> bool:
        """R13: record the cancel (True). A turn whose cancel is recorded already is left as it
        is (False): the first request's author and reason stand, as ``turn/end`` reports."""
        self._reason_fits(CancelRequested.wire_name, reason)
        payload = CancelRequested(by=by, reason=reason)
        self._require_turn()
        if self.state.cancel_requested:
            return False
        self._record(payload)
        return True

    def end_turn(self, status: TurnStatus, *, reason: str | None = None,
                 by: Actor | None = None, error: str | None = None,
                 unsure: Collection[str] = ()) -> None:
        """R13: a cancelled turn first denies every standing approval, durably. A turn never
        closes owing a tool call: each call still owed (a cancelled or failed step) is answered
        with an error result first, so the history the model sees next never holds a tool call
        without its result (providers refuse such a history on every later request).
        ``unsure``: owed calls that a process which then died may have been running without
        recording a start (a tool that may run twice records none): their result says they
        may have run, not that they were not run."""
        self._storable(TurnEnded.wire_name, reason=reason, error=error)
        self._require_turn()
        # Every payload is validated before any is recorded: a refusal leaves nothing.
        ended = TurnEnded(turn=self.state.turn, status=status, reason=reason, by=by, error=error)
        # The reason in full is the turn/end's; each denial and result carries its start only:
        # repeated in full for every call, a long one made this one append too large to land.
        gist = _gist(reason) if reason else None
        denials = [
            ApprovalResolved(call_id=call_id, verdict="denied", reason=gist or "turn cancelled",
                             by=by or Actor(actor="system"))
            for call_id in (self.state.pending if status == "cancelled" else ())
        ]
        why = f"the turn ended {status}" + (f": {gist}" if gist else "")
        unanswered = [
            ToolResult(call_id=c.id, name=c.name, is_error=True, content=_unanswered(
                c.name, why, started=c.id in self.state.started, unsure=c.id in unsure))
            for c in self.state.owed.values()
        ]
        for payload in (*denials, *unanswered, ended):
            self._record(payload)

    def compact(self, summary: str, *, mark: int, during_turn: bool = True) -> int:
        """R18: the summary replaces the history up to ``mark`` (the version the summarizer
        read to, taken between turns). ``upto_seq`` is the seq just before the compaction event
        when nothing model-visible landed after the mark; when something did (a turn ran while
        the summarizer worked), it is ``mark``, and what came after stays as it is — the summary
        never hides history it did not read, and a busy session's compaction is not thrown
        away at every turn. It may be recorded while a turn that began after the mark runs
        (``during_turn``: unless that turn's owner cannot fold it in, an older release).
        Declined when a compaction covering the mark landed already (this one would stack a
        second summary of the same history), and for a mark inside the last turn."""
        if not isinstance(summary, str) or not summary.strip():
            # It would replace the whole history the model sees with nothing (R17).
            raise errors.InvalidPayload(SessionCompacted.wire_name, "summary",
                                        "a summary is text that is not blank")
        self._storable(SessionCompacted.wire_name, summary=summary)
        upto = self.compaction_upto(mark, during_turn=during_turn)
        self._record(SessionCompacted(upto_seq=upto, summary=summary))
        return upto

    def compaction_upto(self, mark: int, *, during_turn: bool = True) -> int:
        """The ``upto_seq`` a summary read up to ``mark`` would take if recorded now — or the
        refusal ``compact`` would meet (asked before a summarizer is paid, and again when the
        summary is recorded)."""
        self._require_open()
        st = self.state
        if st.last_compaction_seq and st.compacted_upto >= mark:
            raise errors.CompactionDeclined(
                f"the compaction at seq {st.last_compaction_seq} covers up to seq "
                f"{st.compacted_upto}, this summary's mark {mark} included")
        if st.turn_open and st.turn_started_seq > mark:
            if not during_turn:
                raise errors.CompactionDeclined(
                    f"turn {st.turn} is open and its owner (an older release) cannot take a "
                    "summary while it runs; compact between turns")
            upto = mark  # the running turn stays after the summary, whole
        else:
            self.require_compactable()  # R19: an open turn that began before the mark
            if st.turn_started_seq <= mark < st.turn_ended_seq:
                raise errors.CompactionDeclined(
                    f"mark {mark} falls inside turn {st.turn}; compact between turns")
            # A turn that ran since the mark stays as it is after the summary: hidden unread,
            # never; cut from its results, never (the mark is a turn boundary).
            upto = self.version if st.last_visible_seq <= mark else mark
        return upto

    def require_compactable(self) -> None:
        """R19: refuse (``CompactionDeclined``) while a turn is open. A summary taken then would
        swallow the open turn's user message (its steps would answer a summary instead of the
        question), or cut a tool call from its result. Checked again when it is recorded.
        A closed session is refused with ``SessionClosed``."""
        self._require_open()
        if self.state.owed:
            raise errors.CompactionDeclined("a step owes tool results; compact between turns")
        if self.state.turn_open:
            raise errors.CompactionDeclined(
                f"turn {self.state.turn} is open; compact between turns")

    def title(self, title: str, *, by: Actor | None = None, automatic: bool = False) -> str:
        """R20: one automatic title per session; explicit titles replace it. Capped at 80."""
        if not isinstance(title, str):
            raise errors.InvalidPayload(SessionTitled.wire_name, "title",
                                        f"a title is text, not {type(title).__name__}")
        self._storable(SessionTitled.wire_name, title=title)
        self._require_open()
        if automatic and self.state.titled:
            raise errors.AlreadyTitled(f"session {self.id} is already titled")
        title = " ".join(title.split())[:TITLE_MAX].strip()
        self._record(SessionTitled(title=title, by=by))
        return title

    def record_usage(self, purpose: UpkeepPurpose, model: str, usage: UsageData) -> None:
        """A metered model call made for the session outside its steps (a summarizer's or a
        titler's), in the current turn. Recorded on a closed session too: the call was paid
        for while it was open (a title's request races the close)."""
        self._record(UsageRecorded(purpose=purpose, turn=self.state.turn, model=model,
                                   usage=usage))

    def update_policy(self, patterns: Sequence[str], *, by: Actor | None = None) -> None:
        """Malformed patterns (see ``validate_pattern``) are refused with ``InvalidPayload``, and
        so is one string in place of a list (it would be taken as one pattern per character)."""
        if isinstance(patterns, str | bytes):
            raise errors.InvalidPayload(PolicyUpdated.wire_name, "patterns",
                                        f"a list of patterns, not one string "
                                        f"({errors.shown(patterns)})")
        if not isinstance(patterns, Sequence | set | frozenset):
            raise errors.InvalidPayload(PolicyUpdated.wire_name, "patterns", "a list of "
                                        f"patterns, not {type(patterns).__name__}")
        payload = PolicyUpdated(patterns=list(patterns), by=by)
        self._require_open()
        self._record(payload)

    def reset_policy(self, *, by: Actor | None = None) -> None:
        """Withdraw the recorded allow-list (``policy/reset``): the floor of the agent
        definition that runs each call applies again."""
        self._require_open()
        self._record(PolicyReset(by=by))

    def set_model(self, role: str, spec: str, *, by: Actor | None = None,
                  not_a_key: bool = False) -> None:
        """Point ``role`` at ``spec``. A spec whose model looks like an API key
        (``terret.domain.keys``) is refused unless ``not_a_key`` says it is a model name."""
        if not not_a_key and isinstance(spec, str) and looks_like_key(spec):
            raise errors.InvalidPayload(ModelSet.wire_name, "spec", f"{KEY_REFUSED}; "
                                        "not_a_key=True records it all the same")
        payload = ModelSet(role=role, spec=spec, by=by)
        self._require_open()
        self._record(payload)

    def attach(self, agent_id: str, host: str, pid: int, reason: str | None = None, *,
               worker: str | None = None, lease_until: float | None = None,
               taking_over: Actor | None = None) -> int:
        """Take ownership (R28) with the next fencing epoch, which is returned. A session owned
        by another worker is refused with ``SessionOwned`` unless ``taking_over`` names who
        forces the move (the caller has found the owner's lease expired, or the session idle):
        the old ownership is then ended first, attributed (R25)."""
        self._require_open()
        owner = self.state.owner
        if owner is not None and owner.worker != worker:
            if taking_over is None:
                raise errors.SessionOwned(
                    f"session {self.id} is owned by worker {owner.worker} "
                    f"(agent {owner.agent_id}, pid {owner.pid} on {owner.host})")
            self._record(AgentDetached(
                agent_id=owner.agent_id, host=owner.host, pid=owner.pid,
                worker=owner.worker, epoch=owner.epoch, by=taking_over,
                reason=reason or "taken over"))
        epoch = self.state.epoch + 1
        self._record(AgentAttached(agent_id=agent_id, host=host, pid=pid, reason=reason,
                                   worker=worker, epoch=epoch, lease_until=lease_until))
        return epoch

    def run_under(self, revision: int) -> None:
        """The session's turns run under ``revision`` of its agent definition from here on
        (R32): another revision than the one they ran under is recorded (``agent/revised``,
        saying whether an open turn is handed over); the same one changes nothing."""
        current = self.state.agent_revision
        if revision != current:
            self._record(AgentRevised(previous=current, revision=revision,
                                      turn=self.state.turn, in_turn=self.state.turn_open))

    def detach(self, agent_id: str, host: str, pid: int, reason: str | None = None, *,
               worker: str | None = None, by: Actor | None = None) -> None:
        """Release ownership; only the owner's own release is recorded (a stale agent that
        lost the session releases nothing)."""
        owner = self.state.owner
        if owner is not None and owner.agent_id != agent_id:
            return
        self._record(AgentDetached(agent_id=agent_id, host=host, pid=pid, reason=reason,
                                   worker=worker, epoch=self.state.epoch, by=by))

    def close(self, *, by: Actor, reason: str | None = None) -> None:
        self._reason_fits(SessionClosed.wire_name, reason)
        payload = SessionClosed(reason=reason, by=by)
        self._require_open()
        if self.state.turn_open:
            raise errors.TurnAlreadyRunning(
                f"session {self.id} has open turn {self.state.turn}; cancel it first"
            )
        self._record(payload)

    # --- evolution -----------------------------------------------------------------------

    def _apply(self, payload: EventPayload | OpaquePayload, seq: int) -> None:
        evolve(self.state, payload, seq)


def _unanswered(name: str, why: str, *, started: bool, unsure: bool) -> str:
    """The error result of a call a turn ends owing, saying no more than the log knows."""
    if started:
        return f"{name} was interrupted: it started, and whether it took effect is unknown; {why}"
    if unsure:
        return (f"{name} has no result: the process running its step stopped before recording "
                f"one, so it may have run; {why}")
    return f"{name} was not run: {why}"


def _turn_start(turn: int, trigger: str, text: str | None, inbox_id: str | None
                ) -> tuple[TurnStarted, UserMessage | None]:
    message = UserMessage(text=text, inbox_id=inbox_id) if text is not None else None
    if message is not None:
        _message_fits(message)
    return TurnStarted(turn=turn, trigger=trigger), message


def _decided_by(verdict: Verdict) -> str:
    """A recorded verdict as a refusal names it: ``approved by operator ops``."""
    who = verdict.by.actor + (f" {verdict.by.id}" if verdict.by.id else "")
    return f"{verdict.verdict} by {who}"


def _message_fits(payload: UserMessage | InboxQueued) -> None:
    """``PayloadTooLarge`` for a person's text over ``MAX_MESSAGE_BYTES`` as stored: every
    store refuses it the same way, before anything is written."""
    size = len(payload.to_json())
    if size > MAX_MESSAGE_BYTES:
        raise errors.PayloadTooLarge(payload.wire_name, size, MAX_MESSAGE_BYTES)


def _decided_args(wire_name: str, name: str | None, args: dict[str, Any] | None) -> None:
    """``InvalidPayload`` for a tool name or arguments a verdict could never match: a name
    that is no text, arguments that are no JSON object."""
    if name is not None and not isinstance(name, str):
        raise errors.InvalidPayload(wire_name, "name", f"a tool name, not {shown(name)}")
    if args is None:
        return
    try:
        if not isinstance(args, dict):
            raise TypeError(type(args).__name__)
        call_key("", args)
    except (TypeError, ValueError) as exc:
        raise errors.InvalidPayload(wire_name, "args", "the call's arguments as a JSON object "
                                    f"(a dict of JSON values), not {cut(shown(args), 80)} "
                                    f"({exc})") from None


def _decided_on(waiting: WaitingCall, name: str | None, args: dict[str, Any] | None) -> bool:
    """Whether a verdict naming ``name`` and ``args`` (either or both may be left out) is about
    the waiting call: compared as the verdict binds them (R11), canonical JSON — in Python ``1
    == True == 1.0``, but a call with ``{"force": true}`` is not one with ``{"force": 1}``."""
    if name is not None and waiting.name != name:
        return False
    return args is None or call_key(waiting.name, args) == call_key(waiting.name, waiting.args)


GIST = 200
"""How much of a turn's end reason each call it answers repeats."""


def _gist(reason: str) -> str:
    return cut(reason, GIST)
