"""Cost accounting (R21): tokens, cost and model calls, per session, per turn and per model.

Every model call whose reply is in the log counts once. A metered reply (``assistant/message``
version 2) carries its model and usage: it counts when it is written, so a turn cancelled while
parked, a process killed mid-tool, a resume (whose ``step/end`` carries no usage) lose nothing
and count nothing twice. Logs written before carry the usage on the ``step/end`` (the model from
the step's ``step/start``); a ``step/end`` of theirs without usage counts the step with no
tokens. ``steps`` counts the model calls (the steps, in older logs)."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from terret.domain.money import cost_figure
from terret.projections._typed import handler
from terret.projections.base import TypedProjection

if TYPE_CHECKING:  # importing the codec loads every payload class
    from terret.domain.codec import RecordedEvent
    from terret.domain.events import (
        AssistantMessage,
        StepEnded,
        StepStarted,
        UsageData,
        UsageRecorded,
    )


@dataclass(frozen=True)
class UsageTotals:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    steps: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cost": cost_figure(self.cost),
            "steps": self.steps,
        }


class UsageProjection(TypedProjection):
    name = "usage"
    # 2: usage from metered replies; usage_steps knows whether the step was metered.
    # 3: upkeep calls (usage/recorded) in usage_upkeep.
    version = 3
    tables = ("usage_steps", "usage_turns", "usage_models", "usage_upkeep")
    schema = """
    CREATE TABLE IF NOT EXISTS usage_steps (
        session TEXT NOT NULL, turn INTEGER NOT NULL, step INTEGER NOT NULL, model TEXT NOT NULL,
        metered INTEGER NOT NULL, PRIMARY KEY (session, turn, step)
    ) WITHOUT ROWID;
    CREATE TABLE IF NOT EXISTS usage_turns (
        session TEXT NOT NULL, turn INTEGER NOT NULL, prompt_tokens INTEGER NOT NULL,
        completion_tokens INTEGER NOT NULL, cost REAL NOT NULL, steps INTEGER NOT NULL,
        last_prompt_tokens INTEGER, PRIMARY KEY (session, turn)
    ) WITHOUT ROWID;
    CREATE TABLE IF NOT EXISTS usage_models (
        session TEXT NOT NULL, model TEXT NOT NULL, prompt_tokens INTEGER NOT NULL,
        completion_tokens INTEGER NOT NULL, cost REAL NOT NULL, steps INTEGER NOT NULL,
        PRIMARY KEY (session, model)
    ) WITHOUT ROWID;
    CREATE TABLE IF NOT EXISTS usage_upkeep (
        session TEXT NOT NULL, purpose TEXT NOT NULL, model TEXT NOT NULL,
        prompt_tokens INTEGER NOT NULL, completion_tokens INTEGER NOT NULL, cost REAL NOT NULL,
        calls INTEGER NOT NULL, PRIMARY KEY (session, purpose, model)
    ) WITHOUT ROWID;
    """

    def __init__(self) -> None:
        # What a batch touched, loaded once and written once at its end (``flush``): each
        # session's open step (turn, step, model, metered), and the running totals per turn and
        # per model ([prompt, completion, cost, steps(, last prompt)]), summed in log order, as
        # one UPDATE per event would (the same float additions in the same order).
        self._steps: dict[str, tuple[int, int, str, bool]] = {}
        self._turns: dict[tuple[str, int], list[Any]] = {}
        self._models: dict[tuple[str, str], list[Any]] = {}
        self._last_turn: dict[str, int] = {}
        self._upkeep: dict[tuple[str, str, str], list[Any]] = {}

    def begin(self) -> None:
        self._steps, self._turns, self._models, self._upkeep = {}, {}, {}, {}
        self._last_turn = {}  # the highest turn the view held, per session, at first touch

    # A model call counts once: with its reply when the reply is metered (version 2 of
    # ``assistant/message``: its model and usage), else with its step's ``step/end`` (logs
    # written before, whose replies carry no usage).

    @handler
    def _on_step_started(self, db: sqlite3.Connection, event: RecordedEvent, p: StepStarted
                         ) -> None:
        # Only the open step is needed; older rows of the session are dropped.
        self._steps[event.stream] = (p.turn, p.step, p.model, False)

    @handler
    def _on_reply(self, db: sqlite3.Connection, event: RecordedEvent, p: AssistantMessage
                  ) -> None:
        if p.model is None:
            return  # unmetered: its usage, if any, comes with the step/end
        session = event.stream
        turn_no, step_no, _, _ = self._open_step(db, session) or (0, 0, p.model, False)
        self._steps[session] = (turn_no, step_no, p.model, True)
        self._count(db, session, turn_no, p.model, p.usage)

    @handler
    def _on_step_ended(self, db: sqlite3.Connection, event: RecordedEvent, p: StepEnded
                       ) -> None:
        open_step = self._open_step(db, event.stream)
        if open_step is not None and open_step[0] == p.turn and open_step[1] == p.step:
            if open_step[3]:
                return  # its reply was metered: counted there (a resumed step/end too)
            model = open_step[2]
        else:
            model = "unknown"
        self._count(db, event.stream, p.turn, model, p.usage)

    @handler
    def _on_upkeep(self, db: sqlite3.Connection, event: RecordedEvent, p: UsageRecorded
                   ) -> None:
        # Apart from the steps' figures (R21 sums the steps): a summary's request would also
        # set its turn's last prompt size, which is what asks for a compaction.
        key = (event.stream, p.purpose, p.model)
        totals = self._upkeep.get(key)
        if totals is None:
            found = db.execute(
                "SELECT prompt_tokens, completion_tokens, cost, calls FROM usage_upkeep"
                " WHERE session = ? AND purpose = ? AND model = ?", key).fetchone()
            totals = self._upkeep[key] = list(found) if found else [0, 0, 0.0, 0]
        _add(totals, p.usage.prompt_tokens, p.usage.completion_tokens, p.usage.cost or 0.0)

    def _open_step(self, db: sqlite3.Connection, session: str
                   ) -> tuple[int, int, str, bool] | None:
        step = self._steps.get(session)
        if step is None:
            row = db.execute("SELECT turn, step, model, metered FROM usage_steps"
                             " WHERE session = ?", (session,)).fetchone()
            if row is not None:
                step = self._steps[session] = (row[0], row[1], row[2], bool(row[3]))
        return step

    def _count(self, db: sqlite3.Connection, session: str, turn_no: int, model: str,
               usage: UsageData | None) -> None:
        """One model call (or one unmetered step) into its turn's and its model's totals."""
        prompt = usage.prompt_tokens if usage else 0
        completion = usage.completion_tokens if usage else 0
        cost = (usage.cost or 0.0) if usage else 0.0
        turn = self._turn_totals(db, session, turn_no)
        _add(turn, prompt, completion, cost)
        turn[4] = usage.prompt_tokens if usage else None
        _add(self._model_totals(db, session, model), prompt, completion, cost)

    def _turn_totals(self, db: sqlite3.Connection, session: str, turn_no: int) -> list[Any]:
        """The running totals of a turn: [prompt, completion, cost, steps, last prompt]."""
        key = (session, turn_no)
        turn = self._turns.get(key)
        if turn is None:
            found = None
            last_turn = self._last_turn.get(session)
            if last_turn is None:
                row = db.execute("SELECT max(turn) FROM usage_turns WHERE session = ?",
                                 (session,)).fetchone()
                last_turn = self._last_turn[session] = row[0] or 0
            if turn_no <= last_turn:  # a turn the view may hold already
                found = db.execute(
                    "SELECT prompt_tokens, completion_tokens, cost, steps, last_prompt_tokens"
                    " FROM usage_turns WHERE session = ? AND turn = ?", key).fetchone()
            turn = self._turns[key] = list(found) if found else [0, 0, 0.0, 0, None]
        return turn

    def _model_totals(self, db: sqlite3.Connection, session: str, model: str) -> list[Any]:
        """The running totals of a model in the session: [prompt, completion, cost, steps]."""
        key = (session, model)
        totals = self._models.get(key)
        if totals is None:
            found = db.execute(
                "SELECT prompt_tokens, completion_tokens, cost, steps FROM usage_models"
                " WHERE session = ? AND model = ?", key).fetchone()
            totals = self._models[key] = list(found) if found else [0, 0, 0.0, 0]
        return totals

    def flush(self, db: sqlite3.Connection) -> None:
        for session, (turn, step, model, metered) in self._steps.items():
            db.execute("DELETE FROM usage_steps WHERE session = ?", (session,))
            db.execute("INSERT INTO usage_steps VALUES (?, ?, ?, ?, ?)",
                       (session, turn, step, model, int(metered)))
        turns = [(*key, *totals) for key, totals in self._turns.items()]
        if turns:
            db.executemany("INSERT OR REPLACE INTO usage_turns VALUES (?, ?, ?, ?, ?, ?, ?)",
                           turns)
        models = [(*key, *totals) for key, totals in self._models.items()]
        if models:
            db.executemany("INSERT OR REPLACE INTO usage_models VALUES (?, ?, ?, ?, ?, ?)",
                           models)
        upkeep = [(*key, *totals) for key, totals in self._upkeep.items()]
        if upkeep:
            db.executemany("INSERT OR REPLACE INTO usage_upkeep VALUES (?, ?, ?, ?, ?, ?, ?)",
                           upkeep)
        self.begin()


def _totals(row: tuple[Any, ...] | None) -> UsageTotals:
    if row is None or row[3] is None:
        return UsageTotals()
    return UsageTotals(int(row[0]), int(row[1]), cost_figure(float(row[2])), int(row[3]))


def session_usage(db: sqlite3.Connection, stream: str) -> UsageTotals:
    return _totals(db.execute(
        "SELECT sum(prompt_tokens), sum(completion_tokens), sum(cost), sum(steps)"
        " FROM usage_turns WHERE session = ?", (stream,)).fetchone())


def usage_by_turn(db: sqlite3.Connection, stream: str) -> dict[int, UsageTotals]:
    return {
        row[0]: _totals(row[1:])
        for row in db.execute(
            "SELECT turn, prompt_tokens, completion_tokens, cost, steps FROM usage_turns"
            " WHERE session = ? ORDER BY turn", (stream,))
    }


def usage_by_model(db: sqlite3.Connection, stream: str | None = None) -> dict[str, UsageTotals]:
    sql = ("SELECT model, sum(prompt_tokens), sum(completion_tokens), sum(cost), sum(steps)"
           " FROM usage_models")
    params: tuple[str, ...] = ()
    if stream is not None:
        sql += " WHERE session = ?"
        params = (stream,)
    return {row[0]: _totals(row[1:]) for row in db.execute(sql + " GROUP BY model", params)}


def upkeep_usage(db: sqlite3.Connection, stream: str | None = None
                 ) -> dict[str, UsageTotals]:
    """The upkeep calls' totals by purpose (``compaction``, ``title``), of one session or all;
    ``steps`` counts the calls."""
    sql = ("SELECT purpose, sum(prompt_tokens), sum(completion_tokens), sum(cost), sum(calls)"
           " FROM usage_upkeep")
    params: tuple[str, ...] = ()
    if stream is not None:
        sql += " WHERE session = ?"
        params = (stream,)
    return {row[0]: _totals(row[1:]) for row in db.execute(sql + " GROUP BY purpose", params)}


def last_prompt_tokens(db: sqlite3.Connection, stream: str, turn: int) -> int | None:
    row = db.execute(
        "SELECT last_prompt_tokens FROM usage_turns WHERE session = ? AND turn = ?",
        (stream, turn),
    ).fetchone()
    return row[0] if row else None


def _add(totals: list[Any], prompt: int, completion: int, cost: float) -> None:
    """One step into running totals [prompt, completion, cost, steps, ...]."""
    totals[0] += prompt
    totals[1] += completion
    totals[2] += cost
    totals[3] += 1
