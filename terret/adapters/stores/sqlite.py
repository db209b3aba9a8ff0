"""The embedded default store: one SQLite file in WAL mode, durable by default.

Catch-up subscriptions: an append in this process wakes subscribers at once; appends by other
processes are noticed by polling the head, ``SELECT max(position) FROM events`` (cheap: the
primary key's last entry), every ``poll_interval`` seconds.

The file's identity (``store_id``) is written once, when the store is created, in the
``terret_meta`` table. A non-empty file that is not a Terret store is refused before anything
writes to it (``NotATerretStore``). SQLite's failures become typed errors: a damaged file
``StoreCorrupt``, a full disk ``StoreFull``, a lock held too long ``StoreUnavailable``.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any, Concatenate, Literal, ParamSpec, TypeVar
from uuid import UUID, SafeUUID, uuid4

from terret._sqlite_files import file_identity, listed, open_read_only, rollback, table_names
from terret.adapters.stores._rules import AlreadyWritten, Decision, check_size, decide
from terret.adapters.stores._subscription import PositionalStore
from terret.adapters.stores.workers import SQLiteWorkers
from terret.domain.errors import (
    CorruptRecord,
    NotATerretStore,
    StoreCorrupt,
    StoreError,
    StoreFull,
    StoreUnavailable,
    StreamDeleted,
)
from terret.domain.store import (
    AppendResult,
    ExpectedVersion,
    NewRecord,
    StoredRecord,
    Subscription,
)
from terret.domain.workers import WorkerRegistry

Synchronous = Literal["OFF", "NORMAL", "FULL", "EXTRA"]

# STRICT (SQLite 3.37+): SQLite itself refuses a value of the wrong type, so reads need not
# check every column's type; files written before Terret used STRICT keep the full check.
_STRICT = sqlite3.sqlite_version_info >= (3, 37)
_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS events (
    position INTEGER PRIMARY KEY AUTOINCREMENT,
    stream TEXT NOT NULL,
    seq INTEGER NOT NULL,
    event_id BLOB NOT NULL CHECK (length(event_id) = 16),
    wire_name TEXT NOT NULL,
    data BLOB NOT NULL,
    metadata BLOB NOT NULL,
    recorded_at REAL NOT NULL,
    UNIQUE (stream, seq)
){" STRICT" if _STRICT else ""};
CREATE INDEX IF NOT EXISTS events_by_id ON events (event_id);
CREATE TABLE IF NOT EXISTS snapshots (
    stream TEXT PRIMARY KEY,
    version INTEGER NOT NULL,
    state BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS terret_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS deleted_streams (stream TEXT PRIMARY KEY);
"""
_EVENT_COLUMNS = frozenset(
    {"position", "stream", "seq", "event_id", "wire_name", "data", "metadata", "recorded_at"})
"""A file whose ``events`` table has these columns is a Terret store (one created before
``terret_meta`` existed has no identity yet: it gets one when opened)."""

# The last column says whether the row is sound, so that decoding a sound row (nearly all of
# them) is a plain constructor call. In a STRICT table only the id's length can be wrong (a
# CHECK constraint, which ``PRAGMA ignore_check_constraints`` lets a writer bypass).
_FIELDS = "stream, seq, position, event_id, wire_name, data, metadata, recorded_at"
_STRICT_COLUMNS = f"{_FIELDS}, length(event_id) = 16"
_CHECKED_COLUMNS = (
    f"{_FIELDS}, typeof(seq) = 'integer' AND typeof(event_id) = 'blob' AND length(event_id) = 16"
    " AND typeof(data) = 'blob' AND typeof(metadata) = 'blob'"
    " AND typeof(stream) = 'text' AND typeof(wire_name) = 'text'"
    " AND typeof(recorded_at) IN ('real', 'integer')"
)
_INSERT = (
    "INSERT INTO events (stream, seq, event_id, wire_name, data, metadata, recorded_at)"
    " VALUES (?, ?, ?, ?, ?, ?, ?)"
)
# Insert only if the stream's version is the expected one: one statement is one transaction.
_INSERT_AT_VERSION = (
    "INSERT INTO events (stream, seq, event_id, wire_name, data, metadata, recorded_at)"
    " SELECT ?, ?, ?, ?, ?, ?, ?"
    " WHERE coalesce((SELECT max(seq) FROM events WHERE stream = ?), 0) = ?"
)

# A read of some streams' events passes their names as one JSON array (``json_each``): one
# parameter however many streams, where ``IN (?, …)`` would meet SQLite's parameter limit.
_IN_STREAMS = " AND stream IN (SELECT value FROM json_each(?))"
_STREAM_LENGTHS = (
    "SELECT coalesce(sum((SELECT max(seq) FROM events WHERE stream = value)), 0)"
    " FROM json_each(?)"
)
SCAN_SPAN = 10_000
"""A read of some streams spanning at most this many positions scans them (by position);
over a longer span it may take the streams' index instead (``_by_stream_is_cheaper``)."""
SIFT_RATIO = 4
"""A read of some streams spanning at most 1/``SIFT_RATIO`` as many positions as there are
streams reads the span and sifts it here: SQLite would spend longer building the set."""

# One change signal per database file in this process, shared by every store instance on it,
# so that two instances on one file (a server and a CLI command in tests) wake each other at once.
_signals: dict[str, threading.Condition] = {}
_signals_lock = threading.Lock()


def _signal_for(path: str) -> threading.Condition:
    with _signals_lock:
        return _signals.setdefault(path, threading.Condition())


# UUID's own slots, set straight through their descriptors: UUID.__setattr__ refuses writes.
_set_int = UUID.__dict__["int"].__set__
_set_is_safe = UUID.__dict__["is_safe"].__set__


def _uuid(raw: bytes, _new: Any = object.__new__, _from_bytes: Any = int.from_bytes,
          _unknown: SafeUUID = SafeUUID.unknown) -> UUID:
    """``UUID(bytes=raw)`` for 16 bytes SQLite already checked, without re-validating them:
    a third of the cost, on the path every read and rebuild takes for every event."""
    value = _new(UUID)
    _set_int(value, _from_bytes(raw, "big"))
    _set_is_safe(value, _unknown)
    return value


def store_error(exc: sqlite3.Error, path: str) -> StoreError:
    """The typed error for a failure of SQLite on the file at ``path``."""
    code = getattr(exc, "sqlite_errorcode", None)
    primary = code & 0xFF if isinstance(code, int) else None
    text = " ".join(str(exc).split())
    if primary == sqlite3.SQLITE_FULL or "disk is full" in text:
        return StoreFull(f"the disk holding {path} is full ({text}): nothing was written; "
                         "free some space and retry")
    if primary in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB) or "malformed" in text:
        return StoreCorrupt(f"the SQLite store {path} is damaged ({text}): restore it from "
                            "a backup")
    if primary in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
        return StoreUnavailable(f"the SQLite store {path} is locked: {text}")
    return StoreUnavailable(f"the SQLite store {path} failed: {text}")


P = ParamSpec("P")
R = TypeVar("R")


def _typed(method: Callable[Concatenate[SQLiteStore, P], R]
           ) -> Callable[Concatenate[SQLiteStore, P], R]:
    """Raise SQLite's failures in ``method`` as typed errors (``store_error``)."""

    @functools.wraps(method)
    def wrapper(self: SQLiteStore, *args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return method(self, *args, **kwargs)
        except sqlite3.Error as exc:
            raise store_error(exc, self.path) from None

    return wrapper


def refuse_foreign_file(path: str, busy_timeout: float = 30.0) -> None:
    """Raise ``NotATerretStore`` unless the file at ``path`` is missing, empty (no tables) or
    a Terret store. The file is read through a read-only connection, so a refused file is left
    exactly as it was (no table added, no journal mode changed, no ``-wal`` created)."""
    conn = open_read_only(path, busy_timeout)
    if conn is None:
        return  # missing or empty: the store creates it (opening it tells what else is wrong)
    try:
        names = table_names(conn)
        if not names or "terret_meta" in names:
            return
        if "events" in names:
            if _EVENT_COLUMNS <= {row[1] for row in conn.execute("PRAGMA table_info(events)")}:
                return
    except sqlite3.Error as exc:
        code = getattr(exc, "sqlite_errorcode", None)
        if code == sqlite3.SQLITE_NOTADB:
            raise NotATerretStore(f"{path} is not a SQLite database, so not a Terret store "
                                  "(or one damaged beyond repair); it was left untouched"
                                  ) from None
        if isinstance(code, int) and code & 0xFF == sqlite3.SQLITE_CORRUPT:
            raise store_error(exc, path) from None
        return  # read-only access failed (no -shm yet, a lock): opening the store will tell
    finally:
        conn.close()
    shown = listed(names)
    hint = " (it looks like a views file: pass it as --views)" if "tracking" in names else ""
    raise NotATerretStore(f"{path} is not a Terret store: it is another SQLite database "
                          f"(tables {shown}){hint}; it was left untouched")


def _while_busy(work: Callable[[], R], timeout: float) -> R:
    """Run ``work``, again while SQLite answers "locked" without waiting: processes opening a
    new file at once race to switch it to WAL and create the schema, and SQLite refuses a lock
    upgrade that could deadlock at once instead of calling its busy handler."""
    deadline = time.monotonic() + timeout
    pause = 0.005
    while True:
        try:
            return work()
        except sqlite3.OperationalError as exc:
            code = getattr(exc, "sqlite_errorcode", None)
            busy = isinstance(code, int) and code & 0xFF in (sqlite3.SQLITE_BUSY,
                                                             sqlite3.SQLITE_LOCKED)
            if not busy or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.2)


def _row(row: tuple[Any, ...]) -> StoredRecord:
    stream, seq, position, event_id, wire_name, data, metadata, recorded_at, sound = row
    if sound:
        return StoredRecord(stream, seq, position, _uuid(event_id), wire_name, data,
                            metadata, float(recorded_at))
    reason = "event id is not 16 bytes"
    if isinstance(event_id, bytes) and len(event_id) == 16:
        reason = "a column holds a value of the wrong type (data and metadata must be blobs)"
    raise CorruptRecord(position, reason)


def _decide(
    conn: sqlite3.Connection,
    stream: str,
    records: Sequence[NewRecord],
    expected: ExpectedVersion,
    current: int,
) -> Decision:
    """The shared rules' decision on an append, reading the stream's ids from ``conn``."""

    def id_at(seq: int) -> UUID | None:
        found = conn.execute(
            "SELECT event_id FROM events WHERE stream = ? AND seq = ?", (stream, seq)
        ).fetchone()
        return UUID(bytes=found[0]) if found else None

    def seq_of(event_id: UUID) -> int | None:
        found = conn.execute(
            "SELECT seq FROM events WHERE event_id = ? AND stream = ?",
            (event_id.bytes, stream),
        ).fetchone()
        return found[0] if found else None

    return decide(stream, records, expected, current, id_at, seq_of)


def _position_at(conn: sqlite3.Connection, stream: str, seq: int) -> int | None:
    found = conn.execute(
        "SELECT position FROM events WHERE stream = ? AND seq = ?", (stream, seq)
    ).fetchone()
    return found[0] if found else None


def _insert(
    conn: sqlite3.Connection, stream: str, records: Sequence[NewRecord], seq: int
) -> AppendResult:
    """Insert ``records`` from ``seq`` on."""
    now = time.time()
    if len(records) == 1:  # the common case: one statement, its rowid is the position
        r = records[0]
        cursor = conn.execute(
            _INSERT, (stream, seq, r.event_id.bytes, r.wire_name, r.data, r.metadata, now)
        )
        assert cursor.lastrowid is not None
        return AppendResult(position=cursor.lastrowid, version=seq)
    conn.executemany(
        _INSERT,
        [
            (stream, seq + i, r.event_id.bytes, r.wire_name, r.data, r.metadata, now)
            for i, r in enumerate(records)
        ],
    )
    last = conn.execute("SELECT last_insert_rowid()").fetchone()[0]
    return AppendResult(position=last, version=seq + len(records) - 1)


def _wire_names_clause(wire_names: Collection[str] | None) -> tuple[str, list[object]]:
    """The condition on wire names of a read of ``events`` (empty for None), and its
    parameters."""
    if wire_names is None:
        return "", []
    names: list[object] = list(wire_names)
    return f" AND wire_name IN ({','.join('?' * len(names))})", names


class SQLiteStore(PositionalStore):
    """``SQLiteStore("terret.db")``; ``":memory:"`` is not supported (use ``MemoryStore``)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        synchronous: Synchronous = "FULL",
        poll_interval: float = 0.05,
        busy_timeout: float = 30.0,
    ) -> None:
        self.path = str(Path(path).resolve())
        self.synchronous = synchronous
        self.poll_interval = poll_interval
        self._busy_timeout = busy_timeout
        self._local = threading.local()
        self._write_lock = threading.Lock()
        self._signal = _signal_for(self.path)
        # Each thread has its own connection; a thread's is closed once the thread is gone
        # (checked whenever another thread opens one), so short-lived threads leak nothing.
        self._connections: list[tuple[weakref.ref[threading.Thread], sqlite3.Connection]] = []
        self._connections_lock = threading.Lock()
        self._workers: WorkerRegistry | None = None
        self._file: tuple[int, int] | None = None  # set once the file is there
        refuse_foreign_file(self.path, busy_timeout)  # before anything writes to the file
        try:
            strict = _while_busy(self._initialise, busy_timeout)
        except sqlite3.Error as exc:
            self.close()
            raise store_error(exc, self.path) from None
        self._columns = _STRICT_COLUMNS if strict else _CHECKED_COLUMNS
        self._file = file_identity(self.path)

    def check_in_place(self) -> None:
        """Raise ``StoreUnavailable`` if the file at ``path`` is no longer the one this store
        opened (moved, deleted, replaced by a restore): the connections open on it would go on
        writing into a file no other process opens, and a new one would create an empty file
        at the path. Checked at every operation (a ``stat``); fine again if it is put back."""
        if self._file is not None and file_identity(self.path) != self._file:
            raise StoreUnavailable(
                f"the SQLite store {self.path} was moved, deleted or replaced while this "
                "process had it open: nothing more is read from or written to it here; put "
                "it back, or restart this process on the file now at that path")

    def _initialise(self) -> bool:
        """Create the schema if missing and read the store's id; whether ``events`` is STRICT."""
        conn = self._conn()
        conn.executescript(_SCHEMA)
        self._store_id = self._identity(conn)
        return bool(_STRICT and conn.execute("PRAGMA table_list(events)").fetchone()[5])

    @staticmethod
    def _identity(conn: sqlite3.Connection) -> str:
        """The store's id, written once: when the file is created (or, for a file created
        before stores had one, when it is first opened)."""
        row = conn.execute("SELECT value FROM terret_meta WHERE key = 'store_id'").fetchone()
        if row is None:
            conn.execute("INSERT OR IGNORE INTO terret_meta VALUES ('store_id', ?)",
                         (uuid4().hex,))
            row = conn.execute("SELECT value FROM terret_meta WHERE key = 'store_id'").fetchone()
        return str(row[0])

    def describe(self) -> str:
        return f"sqlite:{self.path} (WAL, synchronous={self.synchronous})"

    def store_id(self) -> str:
        return self._store_id

    def workers(self) -> WorkerRegistry:
        """The worker registry in this file (the ``terret_workers`` table)."""
        with self._connections_lock:
            if self._workers is None:
                self._workers = SQLiteWorkers(self.path, busy_timeout=self._busy_timeout,
                                              check=self.check_in_place)
            return self._workers

    @_typed
    def check_integrity(self) -> None:
        """``PRAGMA quick_check``: raise ``StoreCorrupt`` if the file is damaged. It reads the
        whole file (about a second per gigabyte), so it runs on demand (``terret doctor``, and
        before the CLI says a session does not exist), not on every open."""
        rows = self._conn().execute("PRAGMA quick_check").fetchall()
        if rows != [("ok",)]:
            lines = [line for row in rows for line in str(row[0]).splitlines()
                     if line.strip() and not line.startswith("***")]
            first = lines[0][:160] if lines else "no answer"
            more = (f", and {len(lines) - 1} more problem{'s' if len(lines) > 2 else ''}"
                    if len(lines) > 1 else "")
            raise StoreCorrupt(f"the SQLite store {self.path} is damaged ({first}{more}): "
                               "restore it from a backup")

    def checkpoint(self) -> tuple[bool, str | None]:
        """Fold the WAL into the file (``PRAGMA wal_checkpoint(TRUNCATE)``), as a backup by
        copying the file needs. ``(True, None)`` when it is all in the file; ``(False, None)``
        when another process's connection kept part of it (a running ``serve``: back up with
        SQLite's online backup then); ``(False, why)`` when it could not be written (a full
        disk: the file alone is missing the last events)."""
        try:
            busy, logged, moved = self._conn().execute(
                "PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        except sqlite3.Error as exc:
            return False, " ".join(str(exc).split())
        if busy or (logged >= 0 and moved < logged):
            return False, None
        return True, None

    def _conn(self) -> sqlite3.Connection:
        self.check_in_place()
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(
                # Only the first connection may create the file (mode=rwc); a later one to a
                # file gone meanwhile fails instead of creating an empty one.
                f"{Path(self.path).as_uri()}?mode={'rw' if self._file else 'rwc'}", uri=True,
                isolation_level=None,
                check_same_thread=False,
                timeout=self._busy_timeout,
            )
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={self.synchronous}")
            # A purge's deleted rows are overwritten, not left in free pages, whatever the
            # SQLite build's default (docs/operations.md, retention).
            conn.execute("PRAGMA secure_delete=ON")
            self._local.conn = conn
            with self._connections_lock:
                self._close_orphans_locked()
                self._connections.append((weakref.ref(threading.current_thread()), conn))
        return conn

    def _close_orphans_locked(self) -> None:
        alive = []
        for owner, conn in self._connections:
            thread = owner()
            if thread is not None and thread.is_alive():
                alive.append((owner, conn))
            else:
                try:
                    conn.close()
                except sqlite3.Error:
                    pass
        self._connections = alive

    # --- writes --------------------------------------------------------------------------

    @_typed
    def append(
        self, stream: str, records: Sequence[NewRecord], expected_version: ExpectedVersion
    ) -> AppendResult:
        check_size(records, self.max_record_bytes)
        conn = self._conn()
        with self._write_lock:
            result = self._append_one_at(conn, stream, records, expected_version)
            if result is None:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    result = self._append_locked(conn, stream, records, expected_version)
                    conn.execute("COMMIT")
                except BaseException:
                    rollback(conn)
                    raise
        self._wake_all()
        return result

    def _append_one_at(
        self,
        conn: sqlite3.Connection,
        stream: str,
        records: Sequence[NewRecord],
        expected: ExpectedVersion,
    ) -> AppendResult | None:
        """The common case — one event at an exact expected version that matches — as a
        single statement (its own transaction). None: not that case; take the general path,
        which also answers conflicts and idempotent retries."""
        if len(records) != 1:
            return None
        # A stream's first events take the general path: it checks the stream was not deleted.
        if not isinstance(expected, int) or expected < 1:
            return None
        r = records[0]
        cursor = conn.execute(
            _INSERT_AT_VERSION,
            (stream, expected + 1, r.event_id.bytes, r.wire_name, r.data, r.metadata,
             time.time(), stream, expected),
        )
        if cursor.rowcount != 1 or cursor.lastrowid is None:
            return None
        return AppendResult(position=cursor.lastrowid, version=expected + 1)

    def _append_locked(
        self,
        conn: sqlite3.Connection,
        stream: str,
        records: Sequence[NewRecord],
        expected: ExpectedVersion,
    ) -> AppendResult:
        row = conn.execute("SELECT max(seq) FROM events WHERE stream = ?", (stream,)).fetchone()
        current = row[0] or 0
        if current == 0 and records and conn.execute(
                "SELECT 1 FROM deleted_streams WHERE stream = ?", (stream,)).fetchone():
            # As EventStoreDB's tombstone: a purged session's id is never written again (its
            # purge is on record; a new session under it would read as that purge unfinished).
            raise StreamDeleted(f"stream {stream!r} was deleted")
        decision = _decide(conn, stream, records, expected, current)
        if isinstance(decision, AlreadyWritten):
            # R7: the original write's result, even if the stream moved on since
            position = _position_at(conn, stream, decision.last_seq)
            assert position is not None
            return AppendResult(position=position, version=decision.last_seq)
        if not records:
            return AppendResult(position=_position_at(conn, stream, current) or 0, version=current)
        return _insert(conn, stream, records, decision.first_seq)

    @_typed
    def delete_stream(self, stream: str) -> None:
        conn = self._conn()
        with self._write_lock:
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.execute("DELETE FROM events WHERE stream = ?", (stream,))
                conn.execute("DELETE FROM snapshots WHERE stream = ?", (stream,))
                conn.execute("INSERT OR IGNORE INTO deleted_streams VALUES (?)", (stream,))
                conn.execute("COMMIT")
            except BaseException:
                rollback(conn)  # never leave the connection inside a transaction
                raise

    @_typed
    def write_snapshot(self, stream: str, version: int, state: bytes) -> None:
        conn = self._conn()
        with self._write_lock:
            conn.execute(
                "INSERT INTO snapshots (stream, version, state) VALUES (?, ?, ?)"
                " ON CONFLICT (stream) DO UPDATE SET version = excluded.version,"
                " state = excluded.state WHERE excluded.version > snapshots.version",
                (stream, version, state),
            )

    # --- reads ---------------------------------------------------------------------------

    @_typed
    def read_snapshot(self, stream: str) -> tuple[int, bytes] | None:
        row = (
            self._conn()
            .execute("SELECT version, state FROM snapshots WHERE stream = ?", (stream,))
            .fetchone()
        )
        return (row[0], row[1]) if row else None

    @_typed
    def read_stream(
        self,
        stream: str,
        *,
        from_seq: int | None = None,
        backwards: bool = False,
        limit: int | None = None,
    ) -> list[StoredRecord]:
        if backwards:
            sql = (f"SELECT {self._columns} FROM events WHERE stream = ? AND seq <= ?"
                   " ORDER BY seq DESC")
            start = from_seq if from_seq is not None else 2**62
        else:
            sql = f"SELECT {self._columns} FROM events WHERE stream = ? AND seq >= ? ORDER BY seq"
            start = from_seq if from_seq is not None else 1
        params: tuple[object, ...] = (stream, start)
        if limit is not None:
            sql += " LIMIT ?"
            params += (limit,)
        return [_row(r) for r in self._conn().execute(sql, params)]

    @_typed
    def stream_version(self, stream: str) -> int:
        row = self._conn().execute(
            "SELECT max(seq) FROM events WHERE stream = ?", (stream,)
        ).fetchone()
        return row[0] or 0

    @_typed
    def head_position(self) -> int:
        row = self._conn().execute("SELECT max(position) FROM events").fetchone()
        return row[0] or 0

    @_typed
    def _read_range(
        self, after: int, upto: int, limit: int, wire_names: Collection[str] | None,
        streams: Collection[str] | None = None,
    ) -> list[StoredRecord]:
        if streams is not None:
            return self._read_streams(after, upto, limit, wire_names, streams)
        sql = f"SELECT {self._columns} FROM events WHERE position > ? AND position <= ?"
        params: list[object] = [after, upto]
        if wire_names is not None:
            names = list(wire_names)
            sql += f" AND wire_name IN ({','.join('?' * len(names))})"
            params.extend(names)
        sql += " ORDER BY position LIMIT ?"
        params.append(limit)
        return [_row(r) for r in self._conn().execute(sql, params)]

    def _read_streams(
        self, after: int, upto: int, limit: int, wire_names: Collection[str] | None,
        streams: Collection[str],
    ) -> list[StoredRecord]:
        """``_read_range`` of some streams' events, filtered by SQLite, in the cheapest of three
        ways: a short span of many streams (a live reader's wake-up) is read whole and sifted
        here before decoding; a long span of short streams (a reader catching up on a few
        sessions in a long log) is read through the streams' index; anything else is scanned
        by position with SQLite keeping the streams' rows."""
        span = upto - after
        if not streams or span <= 0:
            return []
        conn = self._conn()
        clause, params = _wire_names_clause(wire_names)
        if span * SIFT_RATIO <= len(streams):
            wanted = streams if isinstance(streams, frozenset | set) else frozenset(streams)
            rows = conn.execute(f"SELECT {self._columns} FROM events WHERE position > ?"
                                f" AND position <= ?{clause} ORDER BY position",
                                [after, upto, *params])
            return [_row(r) for r in itertools.islice((r for r in rows if r[0] in wanted),
                                                      limit)]
        names = json.dumps(list(streams))
        plan = "" if self._by_stream_is_cheaper(conn, names, span, limit) else " NOT INDEXED"
        sql = (f"SELECT {self._columns} FROM events{plan} WHERE position > ? AND position <= ?"
               f"{_IN_STREAMS}{clause} ORDER BY position LIMIT ?")
        return [_row(r) for r in conn.execute(sql, [after, upto, names, *params, limit])]

    @staticmethod
    def _by_stream_is_cheaper(conn: sqlite3.Connection, names: str, span: int,
                              limit: int) -> bool:
        """Whether reading the streams (a JSON array) through their index costs less than
        scanning ``span`` positions for ``limit`` of their events. The index read visits each
        of their events (and sorts those in the span) on every page; the scan stops at a full
        page, after about ``limit * span / events`` positions if their events are spread over
        the span. Twice as cheap is the margin: the estimate is rough."""
        if span <= SCAN_SPAN:
            return False
        (events,) = conn.execute(_STREAM_LENGTHS, (names,)).fetchone()
        return bool(2 * events * max(events, limit) < span * limit)

    # --- subscriptions -------------------------------------------------------------------

    def _wait_for_change(self, seen_head: int, timeout: float, sub: Subscription) -> None:
        """Return once the head moved past ``seen_head``: at once for an append in this process
        (it notifies the signal after committing), within ``timeout`` for another process's."""
        while not sub.stopped:
            with self._signal:
                # Checked under the signal's lock: an append that commits after this check
                # notifies while we wait, so no wake-up is lost between the check and the wait.
                if self.head_position() > seen_head:
                    return
                self._signal.wait(timeout)

    def close(self) -> None:
        """Close this thread's connection and those of threads that ended. Another live
        thread's (a subscription still following, a runtime not closed first) is let go
        instead: dropped with the thread-local storage, it closes as soon as that thread is
        not using it — closing it under a query running there crashes the interpreter."""
        self._wake_all()
        if self._workers is not None:
            self._workers.close()
        current = threading.current_thread()
        with self._connections_lock:
            for owner, conn in self._connections:
                thread = owner()
                if thread is current or thread is None or not thread.is_alive():
                    try:
                        conn.close()
                    except sqlite3.Error:
                        pass
            self._connections.clear()
        self._local = threading.local()
