"""Projections and the SQLite view store they write to.

A projection owns some tables in the view store, handles some wire names, and processes one
event at a time inside a transaction the runner opens; the runner records the projection's
tracked position in the same transaction. Several processes may share one view file: each
batch re-reads the tracked positions inside its write transaction and skips what another process
already applied, so an event is never applied twice.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import ClassVar

from terret.domain.codec import RecordedEvent
from terret.domain.store import SESSION_PREFIX

_VIEW_SCHEMA = """
CREATE TABLE IF NOT EXISTS tracking (projection TEXT PRIMARY KEY, position INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS projection_versions (
    projection TEXT PRIMARY KEY, version INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS projection_faults (
    projection TEXT PRIMARY KEY, position INTEGER NOT NULL, error TEXT NOT NULL,
    recorded_at REAL NOT NULL
);
"""


PURGED = "session/purged"


class Projection(ABC):
    """A read model. Subclasses declare ``name``, ``handles`` (wire names), ``tables`` and
    ``schema`` (CREATE statements), and implement ``process``."""

    name: ClassVar[str]
    handles: ClassVar[frozenset[str]]
    tables: ClassVar[tuple[str, ...]]
    schema: ClassVar[str]
    version: ClassVar[int] = 1
    """Bump it when the tables' layout or meaning changes: a view file written by another
    version of the projection is then dropped and rebuilt from the log on open."""

    @abstractmethod
    def process(self, db: sqlite3.Connection, event: RecordedEvent) -> None:
        """Apply one event to this projection's tables (inside the runner's transaction)."""

    def begin(self) -> None:  # noqa: B027 - an optional hook
        """Called when the runner opens a transaction (a batch), and again when it rolls one
        back: a projection that keeps state in memory during a batch resets it here."""

    def flush(self, db: sqlite3.Connection) -> None:  # noqa: B027 - an optional hook
        """Called before the runner records the tracked position (and after each event on its
        careful path): write what the batch kept in memory, in the same transaction."""

    def wants(self, wire_name: str) -> bool:
        """Whether the runner feeds this projection the event: what it handles, and the purge
        of a session (R27), which every projection applies by forgetting the session."""
        return wire_name in self.handles or wire_name == PURGED

    def apply(self, db: sqlite3.Connection, event: RecordedEvent) -> None:
        if event.wire_name == PURGED:
            session_id = getattr(event.payload, "session_id", None)
            if session_id:
                self.flush(db)  # what the batch holds in memory goes first
                self.purge(db, f"{SESSION_PREFIX}{session_id}")
        if event.wire_name in self.handles:
            self.process(db, event)

    def purge(self, db: sqlite3.Connection, stream: str) -> None:
        """Forget a purged session: delete its rows from every table with a ``session``
        column. Override when a projection keys sessions differently."""
        for table in self.tables:
            columns = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
            if "session" in columns:
                db.execute(f"DELETE FROM {table} WHERE session = ?", (stream,))

    def create(self, db: sqlite3.Connection) -> None:
        db.executescript(self.schema)

    def drop(self, db: sqlite3.Connection) -> None:
        for table in self.tables:
            db.execute(f"DROP TABLE IF EXISTS {table}")

    def dump(self, db: sqlite3.Connection) -> dict[str, list[tuple[object, ...]]]:
        """Every row of every table, sorted — what ``verify`` compares."""
        return {
            table: sorted(db.execute(f"SELECT * FROM {table}").fetchall(), key=repr)
            for table in self.tables
        }


class ViewStore:
    """The SQLite database holding the views. ``":memory:"`` keeps them in memory (tests)."""

    def __init__(self, path: str = ":memory:", *, synchronous: str = "NORMAL") -> None:
        self.path = path if path == ":memory:" else str(Path(path).resolve())
        # One connection, serialised by a lock: the runner's batches and the readers'
        # queries interleave at transaction granularity, which also works for ":memory:".
        self.db = sqlite3.connect(
            self.path, isolation_level=None, check_same_thread=False, timeout=30.0
        )
        if self.path != ":memory:":
            self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute(f"PRAGMA synchronous={synchronous}")
        self.lock = threading.RLock()
        with self.lock:
            self.db.executescript(_VIEW_SCHEMA)

    def ensure(self, projection: Projection) -> bool:
        """Create the projection's tables. A view written by another version of the projection
        is dropped with its tracked position and fault (it then replays from position 0);
        returns True when that happened."""
        with self.lock:
            row = self.db.execute("SELECT version FROM projection_versions WHERE projection = ?",
                                  (projection.name,)).fetchone()
            recorded = row[0] if row is not None else None
            if recorded is None and self.db.execute(
                    "SELECT 1 FROM tracking WHERE projection = ?", (projection.name,)).fetchone():
                recorded = 1  # written before views recorded their versions
            stale = recorded is not None and recorded != projection.version
            if stale:
                projection.drop(self.db)
                self.db.execute("DELETE FROM tracking WHERE projection = ?", (projection.name,))
                self.db.execute("DELETE FROM projection_faults WHERE projection = ?",
                                (projection.name,))
            projection.create(self.db)
            self.db.execute("INSERT OR REPLACE INTO projection_versions VALUES (?, ?)",
                            (projection.name, projection.version))
            return stale

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        with self.lock:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                yield self.db
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
            self.db.execute("COMMIT")

    @contextmanager
    def reading(self) -> Iterator[sqlite3.Connection]:
        with self.lock:
            yield self.db

    def tracked(self, name: str) -> int:
        with self.lock:
            row = self.db.execute(
                "SELECT position FROM tracking WHERE projection = ?", (name,)
            ).fetchone()
        return row[0] if row else 0

    @staticmethod
    def set_tracked(db: sqlite3.Connection, name: str, position: int) -> None:
        db.execute(
            "INSERT INTO tracking (projection, position) VALUES (?, ?)"
            " ON CONFLICT (projection) DO UPDATE SET position = excluded.position",
            (name, position),
        )

    @staticmethod
    def record_fault(db: sqlite3.Connection, name: str, position: int, error: str) -> None:
        db.execute(
            "INSERT OR REPLACE INTO projection_faults VALUES (?, ?, ?, ?)",
            (name, position, error, time.time()),
        )

    def fault(self, name: str) -> tuple[int, str] | None:
        with self.lock:
            row = self.db.execute(
                "SELECT position, error FROM projection_faults WHERE projection = ?", (name,)
            ).fetchone()
        return (row[0], row[1]) if row else None

    def close(self) -> None:
        with self.lock:
            self.db.close()
