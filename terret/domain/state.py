"""The ``Session`` aggregate's state and how each event evolves it.

``SessionState`` holds what the aggregate's invariants need, as small typed records (the calls
owed, the approvals and calls in doubt waiting, their verdicts, the inbox, the owner, the cancel
request, the budget wait). Its snapshot (``to_json``) keeps the JSON shape the state had when it
was a dict of dicts, so a snapshot (or a status view row) written before loads unchanged.

Each event type has one handler taking its payload class (``@_on(TurnStarted)``), so mypy checks
every handler against its payload; ``evolve`` dispatches on the payload's class. An opaque
payload, or a class no handler is registered for (an extension's), changes nothing but the
model-visible mark.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from terret.domain.events import (
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
    ToolInDoubt,
    ToolResult,
    ToolStarted,
    TurnEnded,
    TurnStarted,
    UsageData,
    UsageRecorded,
    UserMessage,
)
from terret.domain.payloads import EventPayload, OpaquePayload


def call_key(name: str, args: dict[str, Any]) -> str:
    """What binds a verdict to its call: the tool and its arguments, canonical (R11)."""
    return json.dumps([name, args], sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class OwedCall:
    """A tool call of the last reply that has no ``tool/result`` yet."""

    id: str
    name: str
    args: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "args": self.args}


@dataclass(frozen=True, slots=True)
class WaitingCall:
    """A call waiting on a human: a pending approval, or a call in doubt."""

    name: str
    args: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "args": self.args}


@dataclass(frozen=True, slots=True)
class Verdict:
    """A verdict of the open turn (``approved``/``denied``, or ``rerun``/``skipped`` on a call
    in doubt), bound to the call's tool and arguments by ``key``."""

    verdict: str
    reason: str | None
    by: Actor
    key: str

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "reason": self.reason,
                "by": self.by.model_dump(exclude_none=True), "key": self.key}


    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Verdict:
        return cls(d["verdict"], d.get("reason"), Actor(**d["by"]), d["key"])


@dataclass(frozen=True, slots=True)
class InboxEntry:
    """Text queued in the durable inbox (R24), waiting for a step."""

    text: str
    wake: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.text, "wake": self.wake}


@dataclass(frozen=True, slots=True)
class Owner:
    """The agent owning the session (R28), as its ``agent/attached`` records it."""

    agent_id: str
    host: str
    pid: int
    worker: str | None = None
    epoch: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"agent_id": self.agent_id, "worker": self.worker, "host": self.host,
                "pid": self.pid, "epoch": self.epoch}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Owner:
        return cls(d["agent_id"], d["host"], d["pid"], d.get("worker"), d.get("epoch", 0))


@dataclass(frozen=True, slots=True)
class CancelRequest:
    """A recorded ``turn/cancel_requested`` of the open turn."""

    by: Actor
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class BudgetWait:
    """The open turn is parked on its budget (``budget/exceeded``) until its next step."""

    turn: int
    limit: float
    spent: float
    estimate: float

    def to_dict(self) -> dict[str, Any]:
        return {"turn": self.turn, "limit": self.limit, "spent": self.spent,
                "estimate": self.estimate}


@dataclass
class SessionState:
    """Everything the invariants need; serialised as the snapshot."""

    agent: str = "default"
    agent_revision: int = 1
    """The revision of the agent definition the session's turns run under (R32): its
    ``session/started``'s, then each ``agent/revised``'s."""
    turn: int = 0
    turn_open: bool = False
    step: int = 0
    step_open: bool = False
    step_answered: bool = False
    owed: dict[str, OwedCall] = field(default_factory=dict)
    pending: dict[str, WaitingCall] = field(default_factory=dict)
    verdicts: dict[str, Verdict] = field(default_factory=dict)
    cancel: CancelRequest | None = None
    turn_input: bool = False
    last_reply_final: bool = False
    titled: bool = False
    closed: bool = False
    last_compaction_seq: int = 0
    last_visible_seq: int = 0
    """The seq of the last model-visible event but a compaction: what a summary may cover."""
    turn_started_seq: int = 0
    """The seq of the last ``turn/start`` (0 in a snapshot from before it was kept)."""
    turn_ended_seq: int = 0
    """The seq of the last ``turn/end``."""
    compacted_upto: int = 0
    """The latest compaction's ``upto_seq``: what its summary covers (R18)."""
    inbox: dict[str, InboxEntry] = field(default_factory=dict)
    attached: str | None = None
    owner: Owner | None = None
    """The owning agent (R28)."""
    epoch: int = 0
    """The log's last fencing epoch: each ``agent/attached`` takes the next."""
    released: bool = False
    """The last owner let the session go itself (``agent/detached`` without ``by``): its turn
    had stopped at a boundary or a park, so no call of the open step was under way when it
    left. A takeover (a forced detach, an attach over an owner that never detached) clears it:
    that owner may have been running a call that records no start."""
    roles: dict[str, str] = field(default_factory=dict)
    policy_seq: int = 0
    policy: list[str] | None = None
    """The patterns of the last ``policy/updated`` (R23), None while the session has none."""
    last_turn_status: str | None = None
    step_metered: bool = False
    """The open step's reply carries its usage (a metered ``assistant/message``)."""
    call_steps: dict[str, int] = field(default_factory=dict)
    """The open turn's call ids, each with the step of the first reply that called it: a
    later step reusing an id makes another call (its own idempotency key)."""
    started: dict[str, str] = field(default_factory=dict)
    """The open turn's calls with a ``tool/started`` and no ``tool/result`` yet (id -> tool)."""
    doubts: dict[str, WaitingCall] = field(default_factory=dict)
    """Calls in doubt (``tool/in_doubt``) waiting for a verdict."""
    doubt_verdicts: dict[str, Verdict] = field(default_factory=dict)
    """The open turn's verdicts on calls in doubt, bound to id, tool and arguments."""
    spent: float = 0.0
    """The cost of the turns before the last one, summed turn by turn (as the usage view)."""
    turn_cost: float = 0.0
    """The cost of the last (or open) turn, summed model call by model call."""
    dearest_call: float = 0.0
    """The highest cost of one model call (or one unmetered step) in the session."""
    budget: float | None = None
    budget_set: bool = False
    """Whether the session has a budget of its own (``budget/set`` with a limit)."""
    budget_wait: BudgetWait | None = None
    """The open turn is parked on its budget (``budget/exceeded``) until its next step."""
    created_on: float | None = field(default=None, compare=False)
    """When the session was created: its ``session/started`` as recorded (a new session's own
    clock until it is loaded back). Not part of the invariants' state (not compared); None in
    a snapshot from before it was kept."""

    @property
    def total_cost(self) -> float:
        """The session's lifetime cost: every model call whose reply is in the log."""
        return self.spent + self.turn_cost

    @property
    def cancel_requested(self) -> bool:
        return self.cancel is not None

    def waits_on_a_person(self, *, approvals: bool = True) -> bool:
        """Whether the open turn can go no further without a person: the first call it owes
        (calls run in order) waits on an approval (counted when ``approvals``) or is in doubt,
        with no verdict recorded for it, and no cancel is recorded. A worker resuming it would
        only park again."""
        if not self.turn_open or self.cancel is not None or not self.owed:
            return False
        first = next(iter(self.owed.values()))
        key = call_key(first.name, first.args)
        if first.id in self.doubts:
            decided = self.doubt_verdicts.get(first.id)
        elif approvals and first.id in self.pending:
            decided = self.verdicts.get(first.id)
        else:
            return False
        return decided is None or decided.key != key

    @property
    def cancel_by(self) -> dict[str, Any] | None:
        """Who asked for the cancel, as JSON (``cancel.by`` is the typed ``Actor``)."""
        return self.cancel.by.model_dump() if self.cancel is not None else None

    @property
    def cancel_reason(self) -> str | None:
        return self.cancel.reason if self.cancel is not None else None

    def to_json(self) -> bytes:
        # The JSON shape of the dict-of-dict state this replaced: old snapshots read the same.
        fields = dict(vars(self))
        cancel = fields.pop("cancel")
        fields["owed"] = {k: c.to_dict() for k, c in self.owed.items()}
        fields["pending"] = {k: c.to_dict() for k, c in self.pending.items()}
        fields["verdicts"] = {k: v.to_dict() for k, v in self.verdicts.items()}
        fields["cancel_requested"] = cancel is not None
        fields["cancel_by"] = cancel.by.model_dump() if cancel is not None else None
        fields["cancel_reason"] = cancel.reason if cancel is not None else None
        fields["inbox"] = {k: e.to_dict() for k, e in self.inbox.items()}
        fields["owner"] = self.owner.to_dict() if self.owner is not None else None
        fields["doubts"] = {k: c.to_dict() for k, c in self.doubts.items()}
        fields["doubt_verdicts"] = {k: v.to_dict() for k, v in self.doubt_verdicts.items()}
        fields["budget_wait"] = self.budget_wait.to_dict() if self.budget_wait else None
        return json.dumps(fields, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes | str) -> SessionState:
        """A snapshot back; ``ValueError``/``TypeError`` for one that cannot be used (the
        repository then replays the log)."""
        f = json.loads(data)
        if not isinstance(f, dict):
            raise ValueError("a snapshot is a JSON object")
        if f.get("policy_seq") and "policy" not in f:
            # A snapshot from before the state kept the patterns: not usable, replay instead.
            raise ValueError("snapshot without the session's policy patterns")
        if "agent_revision" not in f:
            # A snapshot from before the state kept the revision: replay instead.
            raise ValueError("snapshot without the session's agent revision")
        if f.get("turn") and "spent" not in f:
            # A snapshot from before the state kept the session's cost: replay instead.
            raise ValueError("snapshot without the session's cost")
        try:
            f["owed"] = {k: OwedCall(**c) for k, c in f.get("owed", {}).items()}
            f["pending"] = {k: WaitingCall(**c) for k, c in f.get("pending", {}).items()}
            f["verdicts"] = {k: Verdict.from_dict(v) for k, v in f.get("verdicts", {}).items()}
            requested, by = f.pop("cancel_requested", False), f.pop("cancel_by", None)
            reason = f.pop("cancel_reason", None)
            f["cancel"] = CancelRequest(Actor(**by), reason) if requested and by else None
            f["inbox"] = {k: InboxEntry(**e) for k, e in f.get("inbox", {}).items()}
            f["owner"] = Owner.from_dict(f["owner"]) if f.get("owner") else None
            f["doubts"] = {k: WaitingCall(**c) for k, c in f.get("doubts", {}).items()}
            f["doubt_verdicts"] = {k: Verdict.from_dict(v)
                                   for k, v in f.get("doubt_verdicts", {}).items()}
            f["budget_wait"] = BudgetWait(**f["budget_wait"]) if f.get("budget_wait") else None
            if "compacted_upto" not in f:
                # A snapshot from before a summary could cover less than all before it: its
                # compaction covered up to the seq before it, and counted as model-visible.
                compacted = int(f.get("last_compaction_seq", 0))
                f["compacted_upto"] = max(0, compacted - 1)
                if compacted and int(f.get("last_visible_seq", 0)) == compacted:
                    f["last_visible_seq"] = compacted - 1
        except (KeyError, AttributeError) as exc:
            raise ValueError(f"snapshot of another shape: {exc}") from None
        return cls(**f)


# --- evolution ---------------------------------------------------------------------------

P = TypeVar("P", bound=EventPayload)
Handler = Callable[[SessionState, Any, int], None]

_APPLY: dict[type[EventPayload], Handler] = {}


def _on(cls: type[P]) -> Callable[[Callable[[SessionState, P, int], None]],
                                   Callable[[SessionState, P, int], None]]:
    """Register the handler of a payload class (typed: mypy checks it against the class)."""

    def register(fn: Callable[[SessionState, P, int], None]
                 ) -> Callable[[SessionState, P, int], None]:
        _APPLY[cls] = fn
        return fn

    return register


def evolve(state: SessionState, payload: EventPayload | OpaquePayload, seq: int) -> None:
    """Apply one event at ``seq`` to a session's state. The aggregate and the status view both
    evolve their state through this, so they cannot disagree about a log. An opaque event (a
    wire name this process does not know, or a newer schema version of one it does) changes
    nothing: its shape is unknown here."""
    if isinstance(payload, OpaquePayload):
        return
    if payload.model_visible and not isinstance(payload, SessionCompacted):
        state.last_visible_seq = seq
    handler = _APPLY.get(type(payload))
    if handler is not None:
        handler(state, payload, seq)


@_on(SessionStarted)
def _on_started(s: SessionState, p: SessionStarted, seq: int) -> None:
    s.agent = p.agent
    s.agent_revision = p.agent_revision
    s.roles = dict(p.roles)


@_on(AgentRevised)
def _on_revised(s: SessionState, p: AgentRevised, seq: int) -> None:
    s.agent_revision = p.revision


@_on(ModelSet)
def _on_model_set(s: SessionState, p: ModelSet, seq: int) -> None:
    s.roles[p.role] = p.spec


@_on(PolicyUpdated)
def _on_policy(s: SessionState, p: PolicyUpdated, seq: int) -> None:
    s.policy_seq = seq
    s.policy = list(p.patterns)


@_on(PolicyReset)
def _on_policy_reset(s: SessionState, p: PolicyReset, seq: int) -> None:
    s.policy_seq = seq
    s.policy = None


def _clear_turn(s: SessionState) -> None:
    s.owed, s.pending, s.verdicts, s.cancel, s.call_steps = {}, {}, {}, None, {}
    s.started, s.doubts, s.doubt_verdicts, s.budget_wait = {}, {}, {}, None
    s.step_metered = False


@_on(TurnStarted)
def _on_turn_start(s: SessionState, p: TurnStarted, seq: int) -> None:
    s.turn, s.turn_open, s.step, s.step_open, s.step_answered = p.turn, True, 0, False, False
    s.turn_started_seq = seq
    _clear_turn(s)
    s.turn_input = s.last_reply_final = False
    # The last turn's cost joins the total: summed turn by turn, as the usage view sums them.
    s.spent += s.turn_cost
    s.turn_cost = 0.0


@_on(StepStarted)
def _on_step_start(s: SessionState, p: StepStarted, seq: int) -> None:
    s.step, s.step_open, s.step_answered = p.step, True, False
    s.step_metered = False
    s.budget_wait = None


def _cost(s: SessionState, usage: UsageData | None) -> None:
    cost = (usage.cost or 0.0) if usage is not None else 0.0
    s.turn_cost += cost
    s.dearest_call = max(s.dearest_call, cost)


@_on(AssistantMessage)
def _on_assistant(s: SessionState, p: AssistantMessage, seq: int) -> None:
    s.step_answered = True
    s.last_reply_final = not p.tool_calls
    s.owed = {c.id: OwedCall(c.id, c.name, c.args) for c in p.tool_calls}
    for call in p.tool_calls:
        s.call_steps.setdefault(call.id, s.step)
    s.started = {}
    s.step_metered = p.model is not None
    if s.step_metered:
        _cost(s, p.usage)


@_on(ToolResult)
def _on_tool_result(s: SessionState, p: ToolResult, seq: int) -> None:
    s.owed.pop(p.call_id, None)
    s.started.pop(p.call_id, None)
    s.doubts.pop(p.call_id, None)
    # The verdict is spent by the call it decided (R11): a later step of the turn reusing the
    # id, with the same tool and arguments too, is asked about again (some servers number
    # their call ids afresh in every reply).
    s.verdicts.pop(p.call_id, None)


@_on(StepEnded)
def _on_step_end(s: SessionState, p: StepEnded, seq: int) -> None:
    if not s.step_metered and p.usage is not None:
        _cost(s, p.usage)  # the older shape: the step's usage on its step/end
    s.step_open, s.step_answered = False, False
    s.step_metered = False


@_on(TurnEnded)
def _on_turn_end(s: SessionState, p: TurnEnded, seq: int) -> None:
    s.last_turn_status = p.status
    s.turn_ended_seq = seq
    s.turn_open, s.step_open, s.step_answered = False, False, False
    _clear_turn(s)


@_on(ToolStarted)
def _on_tool_started(s: SessionState, p: ToolStarted, seq: int) -> None:
    if p.call_id in s.owed:
        s.started[p.call_id] = p.name
        s.doubts.pop(p.call_id, None)
        s.doubt_verdicts.pop(p.call_id, None)  # a rerun verdict is spent by the run it allowed


def _wait(waiting: dict[str, WaitingCall], verdicts: dict[str, Verdict],
          p: ToolInDoubt | ApprovalRequested) -> None:
    """A call of the open turn waits for a verdict. An id reused for another tool or other
    arguments is a new ask: the verdict on the earlier call does not carry over to it (R11)."""
    verdicts.pop(p.call_id, None)
    waiting[p.call_id] = WaitingCall(p.name, p.args)


def _decide(waiting: dict[str, WaitingCall], verdicts: dict[str, Verdict],
            p: InDoubtResolved | ApprovalResolved) -> None:
    """The verdict on a waiting call, bound to its tool and arguments."""
    call = waiting.pop(p.call_id, None)
    if call is not None:
        verdicts[p.call_id] = Verdict(p.verdict, p.reason, p.by, call_key(call.name, call.args))


@_on(ToolInDoubt)
def _on_in_doubt(s: SessionState, p: ToolInDoubt, seq: int) -> None:
    if s.turn_open:
        _wait(s.doubts, s.doubt_verdicts, p)


@_on(InDoubtResolved)
def _on_doubt_resolved(s: SessionState, p: InDoubtResolved, seq: int) -> None:
    _decide(s.doubts, s.doubt_verdicts, p)


@_on(BudgetSet)
def _on_budget_set(s: SessionState, p: BudgetSet, seq: int) -> None:
    s.budget, s.budget_set = p.limit, p.limit is not None


@_on(BudgetExceeded)
def _on_budget_exceeded(s: SessionState, p: BudgetExceeded, seq: int) -> None:
    if s.turn_open:
        s.budget_wait = BudgetWait(p.turn, p.limit, p.spent, p.estimate)


@_on(ApprovalRequested)
def _on_requested(s: SessionState, p: ApprovalRequested, seq: int) -> None:
    if s.turn_open:
        _wait(s.pending, s.verdicts, p)


@_on(ApprovalResolved)
def _on_resolved(s: SessionState, p: ApprovalResolved, seq: int) -> None:
    _decide(s.pending, s.verdicts, p)


@_on(InboxQueued)
def _on_inbox(s: SessionState, p: InboxQueued, seq: int) -> None:
    s.inbox[p.inbox_id] = InboxEntry(p.text, p.wake)


def _on_taken(s: SessionState, p: UserMessage | ContextInjected, seq: int) -> None:
    if s.turn_open:
        s.turn_input = True
    if p.inbox_id:
        s.inbox.pop(p.inbox_id, None)


_on(UserMessage)(_on_taken)
_on(ContextInjected)(_on_taken)


@_on(CancelRequested)
def _on_cancel(s: SessionState, p: CancelRequested, seq: int) -> None:
    if s.turn_open:
        s.cancel = CancelRequest(p.by, p.reason)


@_on(SessionTitled)
def _on_titled(s: SessionState, p: SessionTitled, seq: int) -> None:
    s.titled = True


@_on(UsageRecorded)
def _on_usage(s: SessionState, p: UsageRecorded, seq: int) -> None:
    # Counted where the usage view counts it, in the turn it names; not a candidate for the
    # dearest call, which estimates the next step's request (R21 budget), not an upkeep's.
    cost = p.usage.cost or 0.0
    if p.turn == s.turn:
        s.turn_cost += cost
    else:
        s.spent += cost


@_on(SessionClosed)
def _on_closed(s: SessionState, p: SessionClosed, seq: int) -> None:
    s.closed = True


@_on(SessionCompacted)
def _on_compacted(s: SessionState, p: SessionCompacted, seq: int) -> None:
    s.last_compaction_seq = seq
    s.compacted_upto = p.upto_seq


@_on(AgentAttached)
def _on_attached(s: SessionState, p: AgentAttached, seq: int) -> None:
    if s.attached is not None and s.attached != p.agent_id:
        s.released = False
    s.attached = p.agent_id
    s.epoch = max(s.epoch, p.epoch)
    s.owner = Owner(p.agent_id, p.host, p.pid, p.worker, p.epoch)


@_on(AgentDetached)
def _on_detached(s: SessionState, p: AgentDetached, seq: int) -> None:
    if s.attached == p.agent_id:
        s.attached = None
        s.owner = None
        s.released = p.by is None


EVOLVING = frozenset(cls.wire_name for cls in _APPLY)
"""The wire names the state evolves on (the status view handles these)."""
