"""Turn status per session (R1, R14): idle / running / waiting_approval, the open turn, its last
step and whether that step is open, the calls owed by the last assistant message, whether a
cancel was requested, the pending inbox, closed or not. Recorded, never inferred from time."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from terret.projections.base import Projection

if TYPE_CHECKING:  # the aggregate and the codec load every payload class: on first use
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

    @property
    def resumable(self) -> bool:
        """R14: the log has a ``turn/start`` with no ``turn/end`` after it."""
        return self.turn_open


_COLUMNS = ("session, state, turn, turn_open, step, step_open, owed, pending, cancel_requested,"
            " inbox, closed, last_turn_status")


class _Evolving(frozenset[str]):
    """The wire names the aggregate's state evolves on (``terret.domain.session.EVOLVING``),
    looked up when first asked: importing this module does not load the aggregate."""

    def __contains__(self, name: object) -> bool:
        from terret.domain.session import EVOLVING

        return name in EVOLVING


class StatusProjection(Projection):
    """Each session's state is the ``Session`` aggregate's own (``SessionState``, evolved by
    the same ``evolve``), kept as JSON beside the columns operators and queries read."""

    name = "status"
    version = 2  # 2: the aggregate's state is the row's truth
    handles = _Evolving()
    tables = ("status",)
    schema = """
    CREATE TABLE IF NOT EXISTS status (
        session TEXT PRIMARY KEY, state TEXT NOT NULL, turn INTEGER NOT NULL,
        turn_open INTEGER NOT NULL, step INTEGER NOT NULL, step_open INTEGER NOT NULL,
        owed TEXT NOT NULL, pending TEXT NOT NULL, cancel_requested INTEGER NOT NULL,
        inbox TEXT NOT NULL, closed INTEGER NOT NULL, last_turn_status TEXT
    );
    """

    def __init__(self) -> None:
        # The states a batch touched, loaded once and written once at its end (``flush``).
        self._states: dict[str, SessionState] = {}

    def begin(self) -> None:
        self._states = {}

    def process(self, db: sqlite3.Connection, event: RecordedEvent) -> None:
        from terret.domain.session import SessionState, evolve

        state = self._states.get(event.stream)
        if state is None:
            row = db.execute("SELECT state FROM status WHERE session = ?",
                             (event.stream,)).fetchone()
            state = SessionState.from_json(row[0]) if row else SessionState()
            self._states[event.stream] = state
        evolve(state, event.payload, event.seq)

    def flush(self, db: sqlite3.Connection) -> None:
        if self._states:
            db.executemany(f"INSERT OR REPLACE INTO status ({_COLUMNS}) VALUES"
                           " (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                           [_row(session, s) for session, s in self._states.items()])
            self._states = {}


def _row(session: str, s: SessionState) -> tuple[Any, ...]:
    return (session, s.to_json().decode(), s.turn, int(s.turn_open), s.step, int(s.step_open),
            json.dumps(list(s.owed.values())), json.dumps(list(s.pending)),
            int(s.cancel_requested), json.dumps({k: e["wake"] for k, e in s.inbox.items()}),
            int(s.closed), s.last_turn_status)


def status_name(turn_open: bool, waiting: bool, closed: bool) -> str:
    """R1: idle / running / waiting_approval (an approval of the open turn has no verdict), or
    closed."""
    if closed:
        return "closed"
    if turn_open:
        return "waiting_approval" if waiting else "running"
    return "idle"


def read_status(db: sqlite3.Connection, stream: str) -> SessionStatus | None:
    from terret.domain.session import SessionState

    row = db.execute("SELECT state FROM status WHERE session = ?", (stream,)).fetchone()
    if row is None:
        return None
    s = SessionState.from_json(row[0])
    return SessionStatus(
        session=stream, status=status_name(s.turn_open, bool(s.pending), s.closed),
        turn=s.turn, turn_open=s.turn_open, step=s.step,
        step_open=s.step_open, owed=list(s.owed.values()), pending_approvals=len(s.pending),
        cancel_requested=s.cancel_requested, inbox=len(s.inbox),
        wake=any(e["wake"] for e in s.inbox.values()), closed=s.closed,
        last_turn_status=s.last_turn_status,
    )


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
