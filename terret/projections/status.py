"""Turn status per session (R1, R14): idle / running / waiting_approval, the open turn, its last
step and whether that step is open, the calls owed by the last assistant message, whether a
cancel was requested, the pending inbox, closed or not. Recorded, never inferred from time."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from typing import Any

from terret.domain.codec import RecordedEvent
from terret.projections.base import Projection


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


_COLUMNS = ("session, turn, turn_open, step, step_open, owed, pending, cancel_requested,"
            " inbox, closed, last_turn_status")


class StatusProjection(Projection):
    name = "status"
    handles = frozenset({
        "session/started", "turn/start", "step/start", "assistant/message", "tool/result",
        "step/end", "turn/end", "approval/requested", "approval/resolved",
        "turn/cancel_requested", "inbox/queued", "user/message", "context/injected",
        "session/closed",
    })
    tables = ("status",)
    schema = """
    CREATE TABLE IF NOT EXISTS status (
        session TEXT PRIMARY KEY, turn INTEGER NOT NULL, turn_open INTEGER NOT NULL,
        step INTEGER NOT NULL, step_open INTEGER NOT NULL, owed TEXT NOT NULL,
        pending TEXT NOT NULL, cancel_requested INTEGER NOT NULL, inbox TEXT NOT NULL,
        closed INTEGER NOT NULL, last_turn_status TEXT
    );
    """

    def __init__(self) -> None:
        # The rows a batch touched, loaded once and written once at its end (``flush``).
        self._rows: dict[str, _Row] = {}

    def begin(self) -> None:
        self._rows = {}

    def process(self, db: sqlite3.Connection, event: RecordedEvent) -> None:
        s = self._rows.get(event.stream)
        if s is None:
            row = db.execute(f"SELECT {_COLUMNS} FROM status WHERE session = ?",
                             (event.stream,)).fetchone()
            s = self._rows[event.stream] = _Row.load(event.stream, row)
        s.apply(event)

    def flush(self, db: sqlite3.Connection) -> None:
        if self._rows:
            db.executemany(f"INSERT OR REPLACE INTO status ({_COLUMNS}) VALUES"
                           " (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                           [s.dump() for s in self._rows.values()])
            self._rows = {}


class _Row:
    def __init__(self, session: str) -> None:
        self.session = session
        self.turn = 0
        self.turn_open = False
        self.step = 0
        self.step_open = False
        self.owed: dict[str, dict[str, Any]] = {}
        self.pending: list[str] = []
        self.cancel = False
        self.inbox: dict[str, bool] = {}
        self.closed = False
        self.last_status: str | None = None

    @classmethod
    def load(cls, session: str, row: tuple[Any, ...] | None) -> _Row:
        s = cls(session)
        if row is not None:
            (_, s.turn, turn_open, s.step, step_open, owed, pending, cancel, inbox, closed,
             s.last_status) = row
            s.turn_open, s.step_open, s.cancel, s.closed = (
                bool(turn_open), bool(step_open), bool(cancel), bool(closed))
            s.owed, s.pending, s.inbox = json.loads(owed), json.loads(pending), json.loads(inbox)
        return s

    def dump(self) -> tuple[Any, ...]:
        return (self.session, self.turn, int(self.turn_open), self.step, int(self.step_open),
                json.dumps(self.owed), json.dumps(self.pending), int(self.cancel),
                json.dumps(self.inbox), int(self.closed), self.last_status)

    def apply(self, event: RecordedEvent) -> None:
        p: Any = event.payload
        name = event.wire_name
        if name == "turn/start":
            self.turn, self.turn_open, self.step, self.step_open = p.turn, True, 0, False
            self.owed, self.pending, self.cancel = {}, [], False
        elif name == "step/start":
            self.step, self.step_open = p.step, True
        elif name == "assistant/message":
            self.owed = {c.id: {"id": c.id, "name": c.name, "args": c.args}
                         for c in p.tool_calls}
        elif name == "tool/result":
            self.owed.pop(p.call_id, None)
        elif name == "step/end":
            self.step_open = False
        elif name == "turn/end":
            self.turn_open, self.step_open, self.owed, self.pending = False, False, {}, []
            self.cancel, self.last_status = False, p.status
        elif name == "approval/requested" and self.turn_open:
            self.pending.append(p.call_id)
        elif name == "approval/resolved" and p.call_id in self.pending:
            self.pending.remove(p.call_id)
        elif name == "turn/cancel_requested" and self.turn_open:
            self.cancel = True
        elif name == "inbox/queued":
            self.inbox[p.inbox_id] = p.wake
        elif name in ("user/message", "context/injected") and p.inbox_id:
            self.inbox.pop(p.inbox_id, None)
        elif name == "session/closed":
            self.closed = True


def read_status(db: sqlite3.Connection, stream: str) -> SessionStatus | None:
    row = db.execute(f"SELECT {_COLUMNS} FROM status WHERE session = ?", (stream,)).fetchone()
    if row is None:
        return None
    s = _Row.load(stream, row)
    state = "idle"
    if s.turn_open:
        state = "waiting_approval" if s.pending else "running"
    if s.closed:
        state = "closed"
    return SessionStatus(
        session=stream, status=state, turn=s.turn, turn_open=s.turn_open, step=s.step,
        step_open=s.step_open, owed=list(s.owed.values()), pending_approvals=len(s.pending),
        cancel_requested=s.cancel, inbox=len(s.inbox), wake=any(s.inbox.values()),
        closed=s.closed, last_turn_status=s.last_status,
    )


def resumable_sessions(db: sqlite3.Connection) -> list[str]:
    return [r[0] for r in db.execute(
        "SELECT session FROM status WHERE turn_open = 1 AND closed = 0 ORDER BY session")]


def sessions_to_wake(db: sqlite3.Connection) -> list[str]:
    return [r[0] for r in db.execute(
        "SELECT session FROM status WHERE turn_open = 0 AND closed = 0 AND EXISTS"
        " (SELECT 1 FROM json_each(status.inbox) WHERE json_each.type = 'true')"
        " ORDER BY session")]
