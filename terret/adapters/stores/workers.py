"""Worker registries (``terret.domain.workers``) for the three stores.

* memory — ``terret.domain.workers.MemoryWorkers``, shared by every runtime on one store object;
* SQLite — ``SQLiteWorkers``: the ``terret_workers`` table in the store's file, one row per
  worker, replaced at each beat (workers silent for an hour are dropped);
* EventStoreDB — ``_esdb_workers.EsdbWorkers``: the ``terret-workers`` stream, capped with
  ``$maxCount`` (``WORKERS_MAX_COUNT`` beats: at the default TTL of 15 s and a beat every TTL/5,
  enough for 50 workers); beats are of an internal event type that no read of ``$all``
  delivers. Kept in a module of its own, so that the SQLite store never loads esdbclient.

None of them writes to a session stream: an idle session's log never grows with time.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path

from terret._sqlite_files import rollback
from terret.domain.errors import StoreError
from terret.domain.workers import MemoryWorkers, WorkerBeat, WorkerRegistry

__all__ = ["LEFT", "MemoryWorkers", "SQLiteWorkers"]

CLOSE_WAIT = 0.2
"""Seconds ``close`` waits for a beat under way before it leaves the connection open."""

FORGET_AFTER = 3600.0
"""Seconds after its last beat that a silent worker is dropped from the SQLite registry."""

LEFT = -1.0
"""The ttl of the beat a worker writes when it stops (a stream cannot delete it): gone at once."""


_SQLITE_SCHEMA = """CREATE TABLE IF NOT EXISTS terret_workers (
    worker TEXT PRIMARY KEY, at REAL NOT NULL, beat TEXT NOT NULL) WITHOUT ROWID;"""


class SQLiteWorkers(WorkerRegistry):
    """Rows in the store's own file, so every process on the host that opens the store sees
    them. One connection, serialised by a lock: a beat is one small write every few seconds."""

    def __init__(self, path: str, *, busy_timeout: float = 30.0,
                 check: Callable[[], None] = lambda: None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        self._busy_timeout = busy_timeout
        self._check = check
        """Raises if the store's file is no longer the one opened (``check_in_place``)."""

    def _conn(self) -> sqlite3.Connection:
        self._check()
        if self._db is None:
            db = sqlite3.connect(f"{Path(self.path).as_uri()}?mode=rw", uri=True,
                                 isolation_level=None, check_same_thread=False,
                                 timeout=self._busy_timeout)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(_SQLITE_SCHEMA)
            self._db = db
        return self._db

    def _run(self, what: str, sql: str, *params: object) -> list[tuple[object, ...]]:
        with self._lock:
            try:
                return self._conn().execute(sql, params).fetchall()
            except sqlite3.Error as exc:
                raise StoreError(f"the worker registry in {self.path}: {what} failed: {exc}") \
                    from None

    def beat(self, beat: WorkerBeat) -> None:
        with self._lock:
            try:
                db = self._conn()
                db.execute("BEGIN IMMEDIATE")
                try:
                    db.execute("INSERT OR REPLACE INTO terret_workers VALUES (?, ?, ?)",
                               (beat.worker, beat.at, beat.to_json().decode()))
                    db.execute("DELETE FROM terret_workers WHERE at < ?",
                               (beat.at - FORGET_AFTER,))
                    db.execute("COMMIT")
                except BaseException:
                    rollback(db)
                    raise
            except sqlite3.Error as exc:
                raise StoreError(f"the worker registry in {self.path}: beat failed: {exc}") \
                    from None

    def leave(self, worker: str) -> None:
        self._run("leave", "DELETE FROM terret_workers WHERE worker = ?", worker)

    def latest(self, worker: str) -> WorkerBeat | None:
        rows = self._run("read", "SELECT beat FROM terret_workers WHERE worker = ?", worker)
        return WorkerBeat.from_json(str(rows[0][0])) if rows else None

    def beats(self) -> list[WorkerBeat]:
        rows = self._run("read", "SELECT beat FROM terret_workers ORDER BY worker")
        return [WorkerBeat.from_json(str(r[0])) for r in rows]

    def close(self) -> None:
        """Close the registry's connection — unless a beat holds it past a moment (a lock on
        the store another process holds, waited on for the busy timeout): the connection is
        then left to the process's end, and a stop is not held for the timeout (30 s)."""
        if not self._lock.acquire(timeout=CLOSE_WAIT):
            return
        try:
            if self._db is not None:
                self._db.close()
                self._db = None
        finally:
            self._lock.release()
