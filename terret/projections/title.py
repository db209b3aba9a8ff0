"""The session's title (R20): the latest ``session/titled``."""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING

from terret.projections._typed import handler
from terret.projections.base import TypedProjection

if TYPE_CHECKING:  # importing the codec loads every payload class
    from terret.domain.codec import RecordedEvent
    from terret.domain.events import SessionTitled


class TitleProjection(TypedProjection):
    name = "title"
    tables = ("titles",)
    schema = "CREATE TABLE IF NOT EXISTS titles (session TEXT PRIMARY KEY, title TEXT NOT NULL);"

    @handler
    def _on_titled(self, db: sqlite3.Connection, event: RecordedEvent, p: SessionTitled
                   ) -> None:
        db.execute("INSERT OR REPLACE INTO titles VALUES (?, ?)", (event.stream, p.title))


def read_title(db: sqlite3.Connection, stream: str) -> str | None:
    row = db.execute("SELECT title FROM titles WHERE session = ?", (stream,)).fetchone()
    return row[0] if row else None
