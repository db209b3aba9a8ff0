"""Per-session settings recorded in the log: the latest ``policy/updated`` patterns (R23 — the
floor is the runtime's business, not this projection's) and the model roles (``session/started``
roles overridden by ``model/set``)."""

from __future__ import annotations

import json
import sqlite3
from typing import TYPE_CHECKING

from terret.projections._typed import handler
from terret.projections.base import TypedProjection

if TYPE_CHECKING:  # importing the codec loads every payload class
    from terret.domain.codec import RecordedEvent
    from terret.domain.events import ModelSet, PolicyReset, PolicyUpdated, SessionStarted


class PolicyProjection(TypedProjection):
    name = "policy"
    version = 2  # 2: policy/reset withdraws the recorded patterns
    tables = ("policies",)
    schema = "CREATE TABLE IF NOT EXISTS policies (session TEXT PRIMARY KEY, patterns TEXT);"

    @handler
    def _on_policy(self, db: sqlite3.Connection, event: RecordedEvent, p: PolicyUpdated
                   ) -> None:
        db.execute("INSERT OR REPLACE INTO policies VALUES (?, ?)",
                   (event.stream, json.dumps(p.patterns)))

    @handler
    def _on_reset(self, db: sqlite3.Connection, event: RecordedEvent, p: PolicyReset) -> None:
        db.execute("DELETE FROM policies WHERE session = ?", (event.stream,))


def read_policy(db: sqlite3.Connection, stream: str) -> list[str] | None:
    """The recorded patterns, or None when the session never recorded a policy."""
    row = db.execute("SELECT patterns FROM policies WHERE session = ?", (stream,)).fetchone()
    return json.loads(row[0]) if row else None


class ModelsProjection(TypedProjection):
    name = "models"
    tables = ("model_roles",)
    schema = """CREATE TABLE IF NOT EXISTS model_roles (
        session TEXT NOT NULL, role TEXT NOT NULL, spec TEXT NOT NULL,
        PRIMARY KEY (session, role)) WITHOUT ROWID;"""

    @handler
    def _on_started(self, db: sqlite3.Connection, event: RecordedEvent, p: SessionStarted
                    ) -> None:
        db.executemany("INSERT OR REPLACE INTO model_roles VALUES (?, ?, ?)",
                       [(event.stream, role, spec) for role, spec in p.roles.items()])

    @handler
    def _on_model_set(self, db: sqlite3.Connection, event: RecordedEvent, p: ModelSet) -> None:
        db.execute("INSERT OR REPLACE INTO model_roles VALUES (?, ?, ?)",
                   (event.stream, p.role, p.spec))


def read_roles(db: sqlite3.Connection, stream: str) -> dict[str, str]:
    return dict(db.execute("SELECT role, spec FROM model_roles WHERE session = ?", (stream,)))
