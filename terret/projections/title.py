"""The session's title (R20): the latest ``session/titled``."""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING, Any

from terret.projections.base import Projection, WireNames

if TYPE_CHECKING:  # importing the codec loads every payload class
    from terret.domain.codec import RecordedEvent


class TitleProjection(Projection):
    name = "title"
    handles = WireNames(lambda ev: (ev.SessionTitled,))
    tables = ("titles",)
    schema = "CREATE TABLE IF NOT EXISTS titles (session TEXT PRIMARY KEY, title TEXT NOT NULL);"

    def process(self, db: sqlite3.Connection, event: RecordedEvent) -> None:
        p: Any = event.payload
        db.execute("INSERT OR REPLACE INTO titles VALUES (?, ?)", (event.stream, p.title))


def read_title(db: sqlite3.Connection, stream: str) -> str | None:
    row = db.execute("SELECT title FROM titles WHERE session = ?", (stream,)).fetchone()
    return row[0] if row else None
