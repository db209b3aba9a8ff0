"""Durable approvals (R8–R13): the execute-stage gate that parks a call on a recorded request
and wakes when a verdict — from this process or any other — arrives through the subscription.
The same wait parks a turn on its spend budget and a call in doubt on an operator's verdict
(``ApprovalGate.wait``): what the turn waits for is a recorded event, whatever process records it.

A parked call waits on a condition; the ``approval/resolved``, ``turn/cancel_requested`` and
``turn/end`` listener signals it, and the call then re-reads the verdict from the log (the
session's tail, so a verdict another process appended counts at once), bound to call id, tool
and arguments (R11). There is no timeout by default (R12); with
``max_wait`` set, the reaper records a durable denial ``by: reaper`` when the wait runs out.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar
from uuid import UUID

from terret.domain.codec import RecordedEvent
from terret.domain.errors import ApprovalNotPending
from terret.domain.events import (
    Actor,
    AgentAttached,
    ApprovalRequested,
    ApprovalResolved,
    BudgetSet,
    CancelRequested,
    InDoubtResolved,
    TurnEnded,
    TurnStarted,
)
from terret.domain.session import Session
from terret.domain.store import session_stream
from terret.runtime.stops import TurnCancelled, TurnSuspended
from terret.runtime.tools import CallContext, Tool, ToolOutcome
from terret.runtime.writer import SessionWriter

__all__ = ["WAKING", "ApprovalGate", "ApprovalSignals", "TurnCancelled", "TurnSuspended"]

log = logging.getLogger("terret.approvals")

T = TypeVar("T")

WAKING = frozenset(e.wire_name for e in (ApprovalResolved, CancelRequested, TurnEnded,
                                          AgentAttached, BudgetSet, InDoubtResolved))
"""What a parked wait waits for: a verdict, a cancel, the turn's end, a takeover, a budget, a
verdict on a call in doubt. ``Runtime.start`` signals the parked waits on these."""


class ApprovalSignals:
    """Wakes parked calls of a session when something they wait for is recorded.

    Each signal takes the next tick and sets its session's generation to it; a session with
    no entry reads as the floor, the tick when entries were last dropped. Entries are dropped
    all at once past ``KEEP`` sessions — a serving process hears of every session's turns, and
    kept, they would grow with every session it saw over weeks. A generation only grows, and
    every signal raises its session's above all before, so no wait misses one; a drop wakes
    the waits of that moment once more (each reads its session again, finds nothing new)."""

    KEEP = 4096

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._generation: dict[UUID, int] = {}
        self._tick = self._floor = 0

    def signal(self, session_id: UUID) -> None:
        with self._condition:
            if len(self._generation) >= self.KEEP and session_id not in self._generation:
                self._generation.clear()
                self._floor = self._tick  # at least every generation dropped
            self._tick += 1
            self._generation[session_id] = self._tick
            self._condition.notify_all()

    def generation(self, session_id: UUID) -> int:
        with self._condition:
            return self._generation.get(session_id, self._floor)

    def wait(self, session_id: UUID, seen: int, timeout: float) -> int:
        with self._condition:
            self._condition.wait_for(
                lambda: self._generation.get(session_id, self._floor) != seen, timeout
            )
            return self._generation.get(session_id, self._floor)

    def on_event(self, event: RecordedEvent) -> None:
        if event.session_id is not None:
            self.signal(event.session_id)


class ApprovalGate:
    """The execute-stage gate of one agent. ``on_park``/``on_unpark`` flip its status."""

    def __init__(
        self,
        writer: SessionWriter,
        signals: ApprovalSignals,
        *,
        max_wait: float | None = None,
        on_park: Callable[[], None] = lambda: None,
        on_unpark: Callable[[], None] = lambda: None,
        poll: float = 1.0,
        stopping: threading.Event | None = None,
        fence: Callable[[Session], None] = lambda s: None,
        aside: threading.Event | None = None,
    ) -> None:
        self.stopping = stopping or threading.Event()
        self.aside = aside or threading.Event()
        """Set to end a park that has no verdict yet (``TurnSuspended``): its agent is set
        aside to make room at the agent cap; the turn stays open for the verdict."""
        self.writer = writer
        self.signals = signals
        self.max_wait = max_wait
        self.on_park = on_park
        self.on_unpark = on_unpark
        self.poll = poll
        self.fence = fence

    def __call__(self, tool: Tool, ctx: CallContext) -> ToolOutcome | None:
        sid = ctx.session_id
        seen, session = self._read(sid)
        self.fence(session)
        if session.state.cancel_requested:
            raise TurnCancelled(f"turn {ctx.turn} of {sid} was cancelled")
        verdict = session.verdict_for(ctx.call_id, ctx.name, ctx.args)
        asked_at: float | None = None
        if verdict is None and ctx.call_id not in session.state.pending:
            def request(s: Session) -> Session:
                self.fence(s)
                s.request_approval(ctx.call_id, ctx.name, ctx.args)
                return s

            # The state as of that append (and whatever it folded in): no second store read.
            asked_at = time.time()
            session, _ = self.writer.execute(sid, request, owner=True)
        if verdict is None:
            # A request a dead process made is re-parked without asking again. Its maximum
            # wait counts from the request's recorded time, whichever process waits now: a
            # restart or a deploy does not extend it (one past it is reaped at once). A
            # request made here counts from this process's clock: the recorded time is the
            # store's (EventStoreDB's server), which a skewed clock would shift.
            deadline = None
            if self.max_wait is not None:
                deadline = (asked_at if asked_at is not None
                            else self._requested_at(sid, ctx.call_id)) + self.max_wait
            verdict = self.wait(
                sid, lambda s: s.verdict_for(ctx.call_id, ctx.name, ctx.args),
                what=f"{ctx.call_id} is parked", deadline=deadline,
                on_deadline=lambda: self._reap(ctx), session=session, seen=seen)
        if verdict.verdict == "approved":
            return None
        reason = verdict.reason
        text = f"{tool.name} was denied by {verdict.by.actor}" + (f": {reason}" if reason else "")
        return ToolOutcome(text, is_error=True)

    def _read(self, sid: UUID) -> tuple[int, Session]:
        """The signal generation, then the session with the store's tail applied (a verdict or
        a cancel may come from another process): whatever lands after this read signals a
        generation other than the one returned, so a wait on it cannot miss it."""
        seen = self.signals.generation(sid)
        return seen, self.writer.load(sid)

    def wait(self, sid: UUID, decide: Callable[[Session], T | None], *, what: str,
             deadline: float | None = None, on_deadline: Callable[[], None] | None = None,
             on_park: Callable[[], None] | None = None, session: Session | None = None,
             seen: int | None = None) -> T:
        """Park until ``decide`` returns something for the session as the store holds it:
        each round decides on one read of the session (the first on ``session`` as read at
        generation ``seen``, when given), and waits for the next signal (or ``poll``) between
        rounds. A recorded cancel raises ``TurnCancelled``, a stopping process
        ``TurnSuspended``, a takeover ``LostOwnership`` (the fence); past ``deadline`` (a
        wall-clock time), ``on_deadline`` runs once per round and the next read decides.

        Its branches are the wait's exits, one per recorded event a parked turn waits for;
        they are kept in one loop so that every round decides on one read."""
        if session is None or seen is None:
            seen, session = self._read(sid)
        (on_park or self.on_park)()
        try:
            while True:
                found = decide(session)
                if found is not None:
                    self.aside.clear()  # decided first: the turn goes on, nothing is set aside
                    return found
                if self.stopping.is_set():
                    raise TurnSuspended(f"stopping while {what}")
                if self.aside.is_set():
                    raise TurnSuspended(f"set aside while {what}")
                if session.state.cancel_requested:
                    raise TurnCancelled(f"turn {session.current_turn} of {sid} was cancelled "
                                        f"while {what}")
                remaining = deadline - time.time() if deadline is not None else None
                if remaining is not None and remaining <= 0 and on_deadline is not None:
                    on_deadline()  # the next read finds what it recorded, or what won
                else:
                    timeout = self.poll if remaining is None else max(0.0, min(self.poll,
                                                                               remaining))
                    self.signals.wait(sid, seen, timeout)
                seen, session = self._read(sid)
                self.fence(session)  # a takeover (this worker was frozen past its lease) ends it
        finally:
            self.on_unpark()

    def _requested_at(self, sid: UUID, call_id: str) -> float:
        """When the open turn's request for ``call_id`` was recorded (read back through the
        turn's tail; now when it cannot be found, so a wait is never shortened by guessing)."""
        store, stream = self.writer.repository.store, session_stream(sid)
        before: int | None = None
        while before is None or before > 1:
            page = store.read_stream(stream, from_seq=before, backwards=True, limit=64)
            for record in page:
                if record.wire_name == TurnStarted.wire_name:
                    return time.time()
                if record.wire_name == ApprovalRequested.wire_name:
                    try:
                        asked = json.loads(record.data).get("call_id")
                    except (ValueError, AttributeError):
                        continue
                    if asked == call_id:
                        return record.recorded_at
            if len(page) < 64:
                break
            before = page[-1].seq - 1
        return time.time()

    def _reap(self, ctx: CallContext) -> None:
        def deny(s: Session) -> None:
            s.resolve_approval(ctx.call_id, "denied", by=Actor(actor="reaper"),
                               reason=f"no verdict within {self.max_wait:g}s")

        try:
            self.writer.execute(ctx.session_id, deny)
            log.warning("approval of %s in %s reaped after %ss", ctx.call_id, ctx.session_id,
                        self.max_wait)
        except ApprovalNotPending:
            pass  # a verdict landed meanwhile
