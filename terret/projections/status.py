"""Turn status per session (R1, R14): idle / running / waiting_approval (or waiting on its budget,
or on a call in doubt), the open turn, its last step and whether that step is open, the calls
owed by the last assistant message, whether a cancel was requested, the pending inbox, closed or
not. Recorded, never inferred from time."""

from __future__ import annotations

import functools
import json
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from terret.projections._typed import handler
from terret.projections.base import LiveWireNames, TypedProjection

if TYPE_CHECKING:  # the aggregate and the codec load every payload class: on first use
    from terret.domain.catalogue import EventPayload
    from terret.domain.codec import RecordedEvent
    from terret.domain.session import SessionState


@dataclass(frozen=True)
class SessionStatus:
    session: str
    status: str = "idle"
    turn: int = 0
    turn_open: bool = False
    step: int = 0
    step_open: bool = False
    owed: list[dict[str, Any]] = field(default_factory=list)
    pending_approvals: int = 0
    cancel_requested: bool = False
    inbox: int = 0
    wake: bool = False
    closed: bool = False
    last_turn_status: str | None = None
    in_doubt: list[dict[str, Any]] = field(default_factory=list)
    """The open turn's calls in doubt without a verdict: ``{id, name, args}``."""
    budget: float | None = None
    """The session's own budget (``budget/set``), None when the deployment's default applies."""
    budget_wait: dict[str, Any] | None = None
    """The open turn is parked on its budget: ``{turn, limit, spent, estimate}``."""
    cost: float = 0.0
    """The session's lifetime cost, as the aggregate sums it (what its budget counts)."""

    @property
    def resumable(self) -> bool:
        """R14: the log has a ``turn/start`` with no ``turn/end`` after it."""
        return self.turn_open


_COLUMNS = ("session, state, turn, turn_open, step, step_open, owed, pending, cancel_requested,"
            " inbox, closed, last_turn_status, waiting")


@functools.cache
def _evolving() -> frozenset[str]:
    """The wire names of the payload classes the aggregate's state has a handler for,
    imported once, when first asked (importing this module does not load the aggregate)."""
    from terret.domain.session import EVOLVING

    return EVOLVING


class StatusProjection(TypedProjection):
    """Each session's state is the ``Session`` aggregate's own (``SessionState``), evolved by
    the aggregate's typed handlers — one per payload class, in ``terret/domain/state.py`` —
    and kept as JSON beside the columns operators and queries read. The view keeps no second
    copy of the turn rules: its one handler hands every event the state evolves on to
    ``evolve``, which dispatches on the payload's class."""

    name = "status"
    # 7: the state keeps the agent revision the session's turns run under (agent/revised).
    # 6: a budget/set's limit read as a cost figure (rounded as every report rounds it).
    # 5: the state keeps the open turn's start (a summary may be recorded while it runs).
    # 4: the state folds usage/recorded (the upkeep's cost, counted by the budget).
    version = 7  # 3: what an open turn waits on (waiting); 2: the aggregate's state is the truth
    handles = LiveWireNames(_evolving)
    tables = ("status",)
    schema = """
    CREATE TABLE IF NOT EXISTS status (
        session TEXT PRIMARY KEY, state TEXT NOT NULL, turn INTEGER NOT NULL,
        turn_open INTEGER NOT NULL, step INTEGER NOT NULL, step_open INTEGER NOT NULL,
        owed TEXT NOT NULL, pending TEXT NOT NULL, cancel_requested INTEGER NOT NULL,
        inbox TEXT NOT NULL, closed INTEGER NOT NULL, last_turn_status TEXT, waiting TEXT
    );
    """

    def __init__(self) -> None:
        # The states a batch touched, loaded once and written once at its end (``flush``).
        self._states: dict[str, SessionState] = {}

    def begin(self) -> None:
        self._states = {}

    @handler
    def _evolve(self, db: sqlite3.Connection, event: RecordedEvent, p: EventPayload) -> None:
        state_class, evolve = _aggregate()
        state = self._states.get(event.stream)
        if state is None:
            state = self._states[event.stream] = read_state(db, event.stream) or state_class()
        evolve(state, p, event.seq)

    def flush(self, db: sqlite3.Connection) -> None:
        if self._states:
            db.executemany(f"INSERT OR REPLACE INTO status ({_COLUMNS}) VALUES"
                           " (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                           [_row(session, s) for session, s in self._states.items()])
            self._states = {}


@functools.cache
def _aggregate() -> tuple[type[SessionState], Callable[[SessionState, Any, int], None]]:
    """The aggregate's state and ``evolve``, imported once, when first needed (a per-event
    import statement cost a tenth of a rebuild)."""
    from terret.domain.session import SessionState, evolve

    return SessionState, evolve


def _row(session: str, s: SessionState) -> tuple[Any, ...]:
    return (session, s.to_json().decode(), s.turn, int(s.turn_open), s.step, int(s.step_open),
            json.dumps([c.to_dict() for c in s.owed.values()]), json.dumps(list(s.pending)),
            int(s.cancel_requested), json.dumps({k: e.wake for k, e in s.inbox.items()}),
            int(s.closed), s.last_turn_status, waiting_on(s))


def waiting_on(s: SessionState) -> str | None:
    """What the open turn waits on, as its log records it: ``in_doubt`` (a call in doubt has
    no verdict), ``approval`` (a request has none), ``budget`` (parked on its budget)."""
    if not s.turn_open:
        return None
    if s.doubts:
        return "in_doubt"
    if s.pending:
        return "approval"
    if s.budget_wait is not None:
        return "budget"
    return None


def status_name(turn_open: bool, waiting: bool | str | None, closed: bool) -> str:
    """R1: idle / running / waiting_approval (an approval of the open turn has no verdict),
    waiting_budget, waiting_in_doubt, or closed. ``waiting`` is what the turn waits on
    (``True`` is an approval)."""
    if closed:
        return "closed"
    if turn_open:
        if waiting is True:
            waiting = "approval"
        return f"waiting_{waiting}" if waiting else "running"
    return "idle"


def read_status(db: sqlite3.Connection, stream: str) -> SessionStatus | None:
    from terret.domain.session import SessionState

    row = db.execute("SELECT state FROM status WHERE session = ?", (stream,)).fetchone()
    if row is None:
        return None
    return status_of(stream, SessionState.from_json(row[0]))


def status_of(stream: str, s: SessionState) -> SessionStatus:
    """The view's status of a session in state ``s`` (as the aggregate evolves it)."""
    return SessionStatus(
        session=stream, status=status_name(s.turn_open, waiting_on(s), s.closed),
        turn=s.turn, turn_open=s.turn_open, step=s.step,
        step_open=s.step_open, owed=[c.to_dict() for c in s.owed.values()],
        pending_approvals=len(s.pending), cancel_requested=s.cancel_requested,
        inbox=len(s.inbox), wake=any(e.wake for e in s.inbox.values()), closed=s.closed,
        last_turn_status=s.last_turn_status,
        in_doubt=[{"id": k, **v.to_dict()} for k, v in s.doubts.items()],
        budget=s.budget if s.budget_set else None,
        budget_wait=s.budget_wait.to_dict() if s.budget_wait is not None else None,
        cost=s.total_cost,
    )


def parked_on_budget(db: sqlite3.Connection) -> list[SessionStatus]:
    """Every session whose open turn is parked on its budget."""
    rows = db.execute("SELECT session FROM status WHERE waiting = 'budget' AND closed = 0"
                      " ORDER BY session").fetchall()
    return [found for (stream,) in rows if (found := read_status(db, stream)) is not None]


def in_doubt_calls(db: sqlite3.Connection, stream: str | None = None
                   ) -> list[tuple[SessionStatus, dict[str, Any]]]:
    """The calls in doubt of open turns (of one session, or all), with their session's
    status."""
    sql = "SELECT session FROM status WHERE waiting = 'in_doubt' AND closed = 0"
    params: tuple[str, ...] = ()
    if stream is not None:
        sql += " AND session = ?"
        params = (stream,)
    out: list[tuple[SessionStatus, dict[str, Any]]] = []
    for (session,) in db.execute(sql + " ORDER BY session", params).fetchall():
        found = read_status(db, session)
        if found is not None:
            out.extend((found, call) for call in found.in_doubt)
    return out


def read_state(db: sqlite3.Connection, stream: str) -> SessionState | None:
    """The session's state as the aggregate evolves it (its owner, who asked for a cancel, …)
    up to the view's position; None for a session the view does not know."""
    from terret.domain.session import SessionState

    row = db.execute("SELECT state FROM status WHERE session = ?", (stream,)).fetchone()
    return SessionState.from_json(row[0]) if row is not None else None


def resumable_sessions(db: sqlite3.Connection) -> list[str]:
    return [r[0] for r in db.execute(
        "SELECT session FROM status WHERE turn_open = 1 AND closed = 0 ORDER BY session")]


def sessions_to_wake(db: sqlite3.Connection) -> list[str]:
    return [r[0] for r in db.execute(
        "SELECT session FROM status WHERE turn_open = 0 AND closed = 0 AND EXISTS"
        " (SELECT 1 FROM json_each(status.inbox) WHERE json_each.type = 'true')"
        " ORDER BY session")]
