"""Pending approvals of the open turn (R10, R11). A closed turn's approvals are settled: its
rows are dropped at ``turn/end``."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from terret.projections._typed import handler
from terret.projections.base import TypedProjection

if TYPE_CHECKING:  # importing the codec loads every payload class
    from terret.domain.codec import RecordedEvent
    from terret.domain.events import ApprovalRequested, ApprovalResolved, TurnEnded, TurnStarted


@dataclass(frozen=True)
class PendingApproval:
    session: str
    call_id: str
    name: str
    args: dict[str, Any]
    turn: int
    requested_seq: int


@dataclass(frozen=True)
class RecordedVerdict:
    verdict: str
    reason: str | None
    by: dict[str, Any] | None


class ApprovalsProjection(TypedProjection):
    name = "approvals"
    schema = """
    CREATE TABLE IF NOT EXISTS approvals (
        session TEXT NOT NULL, call_id TEXT NOT NULL, name TEXT NOT NULL, args TEXT NOT NULL,
        turn INTEGER NOT NULL, seq INTEGER NOT NULL, verdict TEXT, reason TEXT, by TEXT,
        PRIMARY KEY (session, call_id)
    ) WITHOUT ROWID;
    CREATE TABLE IF NOT EXISTS approval_turns (session TEXT PRIMARY KEY, turn INTEGER);
    """
    tables = ("approvals", "approval_turns")

    def __init__(self) -> None:
        # Within a batch: each touched session's open turn (written once, at ``flush``), and
        # the sessions whose approval rows are known to be gone (no second DELETE needed).
        self._turns: dict[str, int | None] = {}
        self._cleared: set[str] = set()

    def begin(self) -> None:
        self._turns, self._cleared = {}, set()

    @handler
    def _on_turn_started(self, db: sqlite3.Connection, event: RecordedEvent, p: TurnStarted
                         ) -> None:
        self._clear(db, event.stream)
        self._turns[event.stream] = p.turn

    @handler
    def _on_turn_ended(self, db: sqlite3.Connection, event: RecordedEvent, p: TurnEnded
                       ) -> None:
        self._clear(db, event.stream)
        self._turns[event.stream] = None

    def _clear(self, db: sqlite3.Connection, session: str) -> None:
        """A turn's boundary settles the session's approvals: their rows go."""
        if session not in self._cleared:
            db.execute("DELETE FROM approvals WHERE session = ?", (session,))
            self._cleared.add(session)

    @handler
    def _on_requested(self, db: sqlite3.Connection, event: RecordedEvent,
                      p: ApprovalRequested) -> None:
        session = event.stream
        if session in self._turns:
            turn = self._turns[session]
        else:
            row = db.execute("SELECT turn FROM approval_turns WHERE session = ?",
                             (session,)).fetchone()
            turn = row[0] if row else None
        if turn is None:
            return  # outside an open turn: it belongs to no turn and is never pending
        db.execute(
            "INSERT OR REPLACE INTO approvals VALUES (?, ?, ?, ?, ?, ?, NULL, NULL, NULL)",
            (session, p.call_id, p.name, _canonical(p.args), turn, event.seq),
        )
        self._cleared.discard(session)

    @handler
    def _on_resolved(self, db: sqlite3.Connection, event: RecordedEvent, p: ApprovalResolved
                     ) -> None:
        db.execute(
            "UPDATE approvals SET verdict = ?, reason = ?, by = ?"
            " WHERE session = ? AND call_id = ? AND verdict IS NULL",
            (p.verdict, p.reason, p.by.model_dump_json(), event.stream, p.call_id),
        )

    def flush(self, db: sqlite3.Connection) -> None:
        if self._turns:
            db.executemany("INSERT OR REPLACE INTO approval_turns VALUES (?, ?)",
                           list(self._turns.items()))
        self.begin()


def _canonical(args: dict[str, Any]) -> str:
    return json.dumps(args, sort_keys=True, separators=(",", ":"))


def pending(db: sqlite3.Connection, stream: str | None = None) -> list[PendingApproval]:
    sql = "SELECT session, call_id, name, args, turn, seq FROM approvals WHERE verdict IS NULL"
    params: tuple[str, ...] = ()
    if stream is not None:
        sql += " AND session = ?"
        params = (stream,)
    return [
        PendingApproval(r[0], r[1], r[2], json.loads(r[3]), r[4], r[5])
        for r in db.execute(sql + " ORDER BY session, seq", params)
    ]


def verdict_for(db: sqlite3.Connection, stream: str, call_id: str, name: str,
                args: dict[str, Any]) -> RecordedVerdict | None:
    """R11: a verdict counts only when a request in the open turn names the same call id, tool
    and arguments."""
    row = db.execute(
        "SELECT verdict, reason, by FROM approvals WHERE session = ? AND call_id = ?"
        " AND name = ? AND args = ? AND verdict IS NOT NULL",
        (stream, call_id, name, _canonical(args)),
    ).fetchone()
    if row is None:
        return None
    return RecordedVerdict(row[0], row[1], json.loads(row[2]) if row[2] else None)
