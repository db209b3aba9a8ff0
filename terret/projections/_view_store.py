"""The SQLite view store projections write to (re-exported by ``terret.projections.base``).

A projection owns some tables in the view store, handles some wire names, and processes one
event at a time inside a transaction the runner opens; the runner records the projection's
tracked position in the same transaction. Several processes may share one view file: each
batch re-reads the tracked positions inside its write transaction and skips what another process
already applied, so an event is never applied twice.

The view store is the ``eventsourcing`` library's ``TrackingRecorder``: a projection's tracked
position (its ``Tracking`` record, the projection's name as the application name) only moves
forward, and ``insert_tracking`` refuses one at or behind it with the library's
``IntegrityError``. The runner records positions the same way (``track``), inside the batch's
transaction; only a reset (``forget``, ``reset``, a new version) removes them.

The view store also records which log the views were built from (``views_log``): the store's
id, and the position, stream, seq and id of the last event applied. The runner compares them
with the store when it starts or catches up (``ProjectionRunner.check_log``) and rebuilds views
built from another store, or from a log that is not the store's (a restored older copy).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Protocol
from uuid import UUID, uuid4

from eventsourcing.persistence import IntegrityError, Tracking, TrackingRecorder

from terret._sqlite_files import listed, open_read_only, sql_statements, table_names
from terret.domain.errors import (
    NotAViewsFile,
    ProjectionNotHalted,
    RuntimeStopping,
    StoreFull,
    ViewsBusy,
    ViewsCorrupt,
)
from terret.domain.store import StoredRecord
from terret.projections._rebuild_lock import RebuildLock


class Projection(Protocol):
    """What the view store needs of a projection (``terret.projections.base.Projection``):
    its name, version and tables, and how to create, drop and dump them."""

    name: ClassVar[str]
    tables: ClassVar[tuple[str, ...]]
    version: ClassVar[int]

    def create(self, db: sqlite3.Connection) -> None: ...

    def drop(self, db: sqlite3.Connection) -> None: ...

    def dump(self, db: sqlite3.Connection) -> dict[str, list[tuple[object, ...]]]: ...

log = logging.getLogger("terret.projections")

BUSY_TIMEOUT_MS = 30_000
"""How long a write waits for another connection's transaction (a runner's batch elsewhere)."""

VIEW_SCHEMA = """
CREATE TABLE IF NOT EXISTS tracking (projection TEXT PRIMARY KEY, position INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS projection_versions (
    projection TEXT PRIMARY KEY, version INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS projection_faults (
    projection TEXT PRIMARY KEY, position INTEGER NOT NULL, error TEXT NOT NULL,
    recorded_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS views_log (
    id INTEGER PRIMARY KEY CHECK (id = 0), store_id TEXT, generation TEXT NOT NULL,
    position INTEGER, stream TEXT, seq INTEGER, event_id BLOB
);
CREATE TABLE IF NOT EXISTS projection_skips (
    projection TEXT NOT NULL, position INTEGER NOT NULL, error TEXT NOT NULL, by TEXT NOT NULL,
    recorded_at REAL NOT NULL, PRIMARY KEY (projection, position)
);
"""

BOOKKEEPING_TABLES = frozenset({"tracking", "projection_versions", "projection_faults",
                                "views_log", "projection_skips"})
"""The view store's own tables (``VIEW_SCHEMA``): no projection may claim one."""


def table_clash(projections: Sequence[Projection]) -> str | None:
    """What is wrong when two projections claim one table, or one claims the view store's own
    (a rebuild of one would empty the other's), or a projection's ``tables`` is not a tuple of
    names; None when nothing is."""
    owner = dict.fromkeys(BOOKKEEPING_TABLES, "the view store's own bookkeeping")
    for p in projections:
        tables = getattr(p, "tables", None)
        if not isinstance(tables, tuple) or not all(isinstance(t, str) and t for t in tables):
            return f"projection {p.name!r}: tables is a tuple of table names, not {tables!r}"
        for table in tables:
            mine = f"projection {p.name!r}"
            if owner.setdefault(table, mine) != mine:
                return (f"{mine} claims table {table!r}, which is {owner[table]}: a rebuild "
                        "of one would empty the other's")
    return None


@dataclass(frozen=True)
class LogMark:
    """Which log a view file was built from: the store's id (None: the store could not tell),
    the generation (new each time the views are reset), and the last event applied (None
    before the first)."""

    store_id: str | None
    generation: str
    position: int | None
    stream: str | None
    seq: int | None
    event_id: UUID | None


def views_error(exc: sqlite3.Error, path: str) -> Exception | None:
    """The typed error for a damaged views file or a full disk; None for other failures."""
    code = getattr(exc, "sqlite_errorcode", None)
    primary = code & 0xFF if isinstance(code, int) else None
    text = " ".join(str(exc).split())
    if primary == sqlite3.SQLITE_FULL:
        return StoreFull(f"the disk holding the views {path} is full ({text}): nothing was "
                         "written; free some space and retry")
    if primary in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB):
        return ViewsCorrupt(f"the views file {path} is damaged or not a views file ({text}): "
                            "delete it; the views are rebuilt from the log")
    return None


def _create(db: sqlite3.Connection, projection: Projection) -> None:
    """The projection's tables, and the version that wrote them."""
    projection.create(db)
    db.execute("INSERT OR REPLACE INTO projection_versions VALUES (?, ?)",
               (projection.name, projection.version))


def is_busy(exc: sqlite3.OperationalError) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    return isinstance(code, int) and code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


def refuse_foreign_views(path: str) -> None:
    """Raise ``NotAViewsFile`` unless the file at ``path`` is missing, empty (no tables) or a
    views file (it has the ``tracking`` table and no event log). The file is read through a
    read-only connection, so a refused file is left exactly as it was: views files are dropped
    whole when they belong to another log, which another application's tables must never be."""
    db = open_read_only(path)
    if db is None:
        return  # missing or empty: created on open (opening tells what else is wrong)
    try:
        names = table_names(db)
    except sqlite3.Error:
        if not _sqlite_header(path):  # someone's notes, not a damaged views file: keep it
            raise NotAViewsFile(f"{path} is not a views file: it is not a SQLite database; it "
                                "was left untouched (give the views a file of their own)") from None
        return  # damaged, locked: opening the views gives the typed error
    finally:
        db.close()
    store = names & {"events", "terret_meta"}
    if not names or ("tracking" in names and not store):
        return
    what = "a Terret store" if store else "another SQLite database"
    hint = ": pass it as --store, and give the views a file of their own" if store else ""
    raise NotAViewsFile(f"{path} is not a views file: it is {what} (tables {listed(names)}){hint}; "
                        "it was left untouched")


def _sqlite_header(path: str) -> bool:
    """Whether the file starts as every SQLite database does (or cannot be read here)."""
    try:
        with open(path, "rb") as f:
            return f.read(16) == b"SQLite format 3\x00"
    except OSError:
        return True


def _identity(path: str) -> tuple[int, int] | None:
    """The file at ``path`` (device and inode), None for ``:memory:`` or a missing file."""
    if path == ":memory:":
        return None
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_dev, stat.st_ino


class ViewStore(TrackingRecorder):
    """The SQLite database holding the views. ``":memory:"`` keeps them in memory (tests).

    Subclass it for a view of your own under the ``eventsourcing`` library's
    ``ProjectionRunner``: record your rows and ``track(db, tracking.application_name,
    tracking.notification_id)`` in one ``transaction()``."""

    def __init__(self, path: str = ":memory:", *, synchronous: str = "NORMAL") -> None:
        self.path = path if path == ":memory:" else str(Path(path).resolve())
        if self.path != ":memory:":
            refuse_foreign_views(self.path)  # before anything writes to it
        # One connection, serialised by a lock: the runner's batches and the readers'
        # queries interleave at transaction granularity, which also works for ":memory:".
        self.db = sqlite3.connect(
            self.path, isolation_level=None, check_same_thread=False,
            timeout=BUSY_TIMEOUT_MS / 1000)
        self.lock = threading.RLock()
        self.closed = False
        self.rebuild_lock = RebuildLock(self.path)
        self._exclusive = False
        self.wait_for_rebuilds = True
        """Whether a write waits for a rebuild another process runs (else ``ViewsBusy``):
        off once the views, or the runner writing them, are being stopped, and for a CLI read
        command, which shows the views as they were rather than wait for a rebuild."""
        self._file = _identity(self.path)
        try:
            if self.path != ":memory:":
                self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute(f"PRAGMA synchronous={synchronous}")
            self.db.execute("PRAGMA secure_delete=ON")  # a purged session's rows: overwritten
            # 16 MiB of page cache (SQLite's default is 2): a rebuild's one transaction
            # otherwise spills pages of the messages index and reads them back (~3 % of it).
            self.db.execute("PRAGMA cache_size=-16384")
            with self.lock:
                self.db.executescript(VIEW_SCHEMA)
        except sqlite3.Error as exc:
            self.db.close()
            typed = views_error(exc, self.path)
            if typed is not None:
                raise typed from None
            raise

    def still_at_path(self) -> bool:
        """Whether the file this store has open is still the one at its path: deleted (or
        replaced) under an open connection, the old file lives on unseen by every other
        process, which builds a new one at the path."""
        return self._file is None or _identity(self.path) == self._file

    def ensure(self, projection: Projection) -> bool:
        """Create the projection's tables. A view written by another version of the projection
        is dropped with its tracked position and fault (it then replays from position 0);
        returns True when that happened. A damaged file or a full disk: typed (as every read)."""
        with self.lock, self._typed():
            row = self.db.execute("SELECT version FROM projection_versions WHERE projection = ?",
                                  (projection.name,)).fetchone()
            recorded = row[0] if row is not None else None
            if recorded is None and self.db.execute(
                    "SELECT 1 FROM tracking WHERE projection = ?", (projection.name,)).fetchone():
                recorded = 1  # written before views recorded their versions
            stale = recorded is not None and recorded != projection.version
            if recorded == projection.version and self._has_tables(projection):
                return False  # as it was: nothing written (a rebuild elsewhere holds the lock)
            if recorded is not None and recorded > projection.version:
                # A newer release's view (a rolling deploy, an old command beside new
                # workers): never downgraded by merely opening the file. This process leaves
                # it alone (the applier says so); the newer release maintains it.
                return False
            if stale:
                projection.drop(self.db)
                self.db.execute("DELETE FROM tracking WHERE projection = ?", (projection.name,))
                self.db.execute("DELETE FROM projection_faults WHERE projection = ?",
                                (projection.name,))
            _create(self.db, projection)
            return stale

    def _has_tables(self, projection: Projection) -> bool:
        names = {row[0] for row in self.db.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'")}
        return all(table in names for table in projection.tables)

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """A write transaction; inside ``exclusive`` (same thread), a savepoint of its
        transaction instead, so that what is applied commits with the whole operation."""
        with self.lock, self._typed():
            if self._exclusive:
                self.db.execute("SAVEPOINT part")
                done, undone = ["RELEASE part"], ["ROLLBACK TO part", "RELEASE part"]
            else:
                self._begin_write()
                done, undone = ["COMMIT"], ["ROLLBACK"]
            try:
                yield self.db
                for statement in done:
                    self.db.execute(statement)
            except BaseException:
                if self.db.in_transaction:  # SQLite rolled back already on SQLITE_FULL
                    for statement in undone:
                        self.db.execute(statement)
                raise

    def undo(self, db: sqlite3.Connection) -> None:
        """Inside ``transaction``: undo what it wrote so far and go on in it from the start."""
        if self._exclusive:
            db.execute("ROLLBACK TO part")  # the savepoint stays open
        else:
            db.execute("ROLLBACK")
            self._begin_write()

    @contextmanager
    def exclusive(self) -> Iterator[sqlite3.Connection]:
        """One write transaction for a whole operation on the views (a rebuild, a skip and
        its replay), under the rebuild lock (``ViewsBusy`` if another process holds it). A
        runner elsewhere waits for it to commit; every reader, here and elsewhere, sees the
        views as they were until then; a process that dies midway changes nothing."""
        with self.rebuild_lock.held(), self.lock, self._typed():
            self._begin_write()
            self._exclusive = True
            try:
                yield self.db
                self.db.execute("COMMIT")
            except BaseException:
                if self.db.in_transaction:
                    self.db.execute("ROLLBACK")
                raise
            finally:
                self._exclusive = False

    def _begin_write(self) -> None:
        """``BEGIN IMMEDIATE``, waiting as long as a rebuild in another process holds the file,
        unless ``wait_for_rebuilds`` is off (then ``ViewsBusy``); other writers (a runner's
        batch elsewhere) are waited for up to ``BUSY_TIMEOUT_MS``. Short attempts, so that a
        rebuild that begins meanwhile, or a stop, is seen within half a second."""
        said = ""  # the holder waited for, once said
        deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
        self.db.execute("PRAGMA busy_timeout = 500")
        try:
            while True:
                try:
                    self.db.execute("BEGIN IMMEDIATE")
                    if said:  # the operator reading serve's log sees it go on again
                        log.warning("views %s: the rebuild by %s is over; going on",
                                    self.path, said)
                    return
                except sqlite3.OperationalError as exc:
                    if not is_busy(exc):
                        raise
                    holder = self.rebuild_lock.holder()
                    if holder is None:
                        if time.monotonic() > deadline:
                            raise
                        continue
                if not self.wait_for_rebuilds:
                    raise ViewsBusy(f"{holder} is rebuilding the views {self.path}: not "
                                    "waited for")
                if not said:
                    log.warning("views %s: waiting for the rebuild by %s", self.path, holder)
                    said = holder
                deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
        finally:
            self.db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")

    @contextmanager
    def reading(self) -> Iterator[sqlite3.Connection]:
        with self.lock, self._typed():
            yield self.db

    @contextmanager
    def _typed(self) -> Iterator[None]:
        """A damaged file or a full disk as a typed error; other failures unchanged."""
        try:
            yield
        except sqlite3.ProgrammingError:
            if self.closed:  # read through a runtime's views after the runtime was closed
                raise RuntimeStopping(f"the views {self.path} are closed (so is what opened "
                                      "them): make a new runtime to go on") from None
            raise
        except sqlite3.Error as exc:
            typed = views_error(exc, self.path)
            if typed is None:
                raise
            raise typed from None

    # --- which log the views were built from ---------------------------------------------

    def log_mark(self) -> LogMark | None:
        """None for views that never recorded one (new, or written before views did)."""
        with self.reading() as db:
            row = db.execute("SELECT store_id, generation, position, stream, seq, event_id"
                             " FROM views_log WHERE id = 0").fetchone()
        if row is None:
            return None
        event_id = UUID(bytes=row[5]) if isinstance(row[5], bytes) and len(row[5]) == 16 \
            else None
        return LogMark(row[0], row[1], row[2], row[3], row[4], event_id)

    def max_tracked(self) -> int:
        """The highest tracked position of any projection in the file."""
        with self.reading() as db:
            return int(db.execute("SELECT coalesce(max(position), 0) FROM tracking"
                                  ).fetchone()[0])

    def adopt(self, store_id: str | None, position: int | None = None) -> str:
        """Record that the views belong to the store ``store_id`` (if they recorded no store
        yet); ``position``: how far views that had no mark yet got (their event unknown).
        Returns the views' generation."""
        query = "SELECT store_id, generation FROM views_log WHERE id = 0"
        with self.reading() as db:
            row = db.execute(query).fetchone()
            if row is None:
                db.execute("INSERT OR IGNORE INTO views_log (id, store_id, generation, position)"
                           " VALUES (0, ?, ?, ?)", (store_id, uuid4().hex, position))
                row = db.execute(query).fetchone()
            if row[0] is None and store_id is not None:
                db.execute("UPDATE views_log SET store_id = ? WHERE id = 0 AND store_id IS NULL",
                           (store_id,))
            return str(row[1])

    def reset(self, store_id: str | None, expected: str | None,
              projections: Sequence[Projection] = ()) -> str | None:
        """Empty the file as if it were new — drop every table, the projections' and the
        bookkeeping — and record ``store_id`` with a new generation, creating the tables of
        ``projections`` again in the same transaction: a reader in another process meanwhile
        sees the views as they were or empty, never without their tables. Only if the
        generation is still ``expected`` (None: no mark): returns None, changing nothing, when
        another process reset or marked the views meanwhile."""
        generation = uuid4().hex
        with self.reading() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                row = db.execute("SELECT generation FROM views_log WHERE id = 0").fetchone()
                if (row[0] if row else None) != expected:
                    db.execute("ROLLBACK")
                    return None
                objects = db.execute("SELECT type, name FROM sqlite_master WHERE type IN"
                                     " ('table', 'view') AND name NOT LIKE 'sqlite_%'").fetchall()
                for kind, name in objects:
                    quoted = name.replace('"', '""')
                    db.execute(f'DROP {kind.upper()} IF EXISTS "{quoted}"')
                for statement in sql_statements(VIEW_SCHEMA):
                    db.execute(statement)
                db.execute("INSERT INTO views_log (id, store_id, generation) VALUES (0, ?, ?)",
                           (store_id, generation))
                for projection in projections:
                    _create(db, projection)
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
        return generation

    @staticmethod
    def generation_in(db: sqlite3.Connection) -> str | None:
        row = db.execute("SELECT generation FROM views_log WHERE id = 0").fetchone()
        return row[0] if row else None

    @staticmethod
    def note_applied(db: sqlite3.Connection, record: StoredRecord) -> None:
        """Mark ``record`` as the last event applied (unless one after it already is)."""
        db.execute("UPDATE views_log SET position = ?, stream = ?, seq = ?, event_id = ?"
                   " WHERE id = 0 AND (position IS NULL OR position < ?)",
                   (record.position, record.stream, record.seq, record.event_id.bytes,
                    record.position))

    # --- tracking (the library's TrackingRecorder) ---------------------------------------

    def insert_tracking(self, tracking: Tracking) -> None:
        with self.transaction() as db:
            self.track(db, tracking.application_name, tracking.notification_id)

    def max_tracking_id(self, application_name: str) -> int | None:
        with self.reading() as db:
            row = db.execute("SELECT position FROM tracking WHERE projection = ?",
                             (application_name,)).fetchone()
        return int(row[0]) if row else None

    @staticmethod
    def track(db: sqlite3.Connection, name: str, position: int) -> None:
        """Inside a transaction: ``name`` has processed the log up to ``position``. Positions
        only move forward: one at or behind the recorded one raises ``IntegrityError`` (the
        library's rule, which also refuses to fill a gap behind it)."""
        moved = db.execute("INSERT INTO tracking (projection, position) VALUES (?, ?)"
                           " ON CONFLICT (projection) DO UPDATE SET position = excluded.position"
                           " WHERE excluded.position > tracking.position",
                           (name, position)).rowcount
        if not moved:
            raise IntegrityError(f"{name} has processed position {position} already")

    def tracked(self, name: str) -> int:
        """The position ``name`` has processed up to (0: nothing yet)."""
        return self.max_tracking_id(name) or 0

    @staticmethod
    def positions(db: sqlite3.Connection, names: list[str]) -> dict[str, int]:
        """Each of ``names``' tracked position (0 when none)."""
        tracked = dict(db.execute("SELECT projection, position FROM tracking").fetchall())
        return {name: tracked.get(name, 0) for name in names}

    def bookkeeping(self) -> tuple[dict[str, int], dict[str, tuple[int, str]]]:
        """Every projection the file tracks (name → position) and every fault (name →
        position, error), whether or not this process maintains it."""
        with self.reading() as db:
            tracked = dict(db.execute("SELECT projection, position FROM tracking").fetchall())
            faults = {row[0]: (row[1], row[2]) for row in db.execute(
                "SELECT projection, position, error FROM projection_faults")}
        return tracked, faults

    @staticmethod
    def forget(db: sqlite3.Connection, projection: Projection) -> None:
        """Inside a transaction: empty a projection's tables and drop its tracked position
        and fault: it replays from position 0 (its recorded skips stay: an event skipped
        that still fails is passed over again). Its tables stay
        (nobody sharing the file finds one missing), rows deleted in the transaction."""
        db.execute("DELETE FROM tracking WHERE projection = ?", (projection.name,))
        db.execute("DELETE FROM projection_faults WHERE projection = ?", (projection.name,))
        for table in projection.tables:
            db.execute(f"DELETE FROM {table}")

    # --- faults and skips -------------------------------------------------------------------

    @staticmethod
    def halted(db: sqlite3.Connection) -> set[str]:
        """The projections halted at a fault."""
        return {row[0] for row in db.execute("SELECT projection FROM projection_faults")}

    @staticmethod
    def versions(db: sqlite3.Connection) -> dict[str, int]:
        """The version each projection's view was written by (``ensure`` records it)."""
        return dict(db.execute("SELECT projection, version FROM projection_versions"))

    @staticmethod
    def record_fault(db: sqlite3.Connection, name: str, position: int, error: str) -> None:
        db.execute(
            "INSERT OR REPLACE INTO projection_faults VALUES (?, ?, ?, ?)",
            (name, position, error, time.time()),
        )

    @staticmethod
    def skips(db: sqlite3.Connection) -> set[tuple[str, int]]:
        """(projection, position) of every recorded skip."""
        return {(r[0], r[1]) for r in db.execute(
            "SELECT projection, position FROM projection_skips")}

    @staticmethod
    def unskip(db: sqlite3.Connection, name: str, position: int) -> None:
        """Inside a transaction: drop a skip whose event a replay applied after all."""
        db.execute("DELETE FROM projection_skips WHERE projection = ? AND position = ?",
                   (name, position))

    def skip(self, name: str, by: str) -> tuple[int, str]:
        """Record that ``by`` skipped the event ``name`` halted at, and lift the fault; the
        position and error skipped. ``ProjectionNotHalted`` if ``name`` is not halted."""
        with self.transaction() as db:
            row = db.execute("SELECT position, error FROM projection_faults WHERE projection = ?",
                             (name,)).fetchone()
            if row is None:
                raise ProjectionNotHalted(f"projection {name!r} is not halted: nothing to skip")
            db.execute("INSERT OR REPLACE INTO projection_skips VALUES (?, ?, ?, ?, ?)",
                       (name, row[0], row[1], by, time.time()))
            db.execute("DELETE FROM projection_faults WHERE projection = ?", (name,))
        return int(row[0]), str(row[1])

    def skips_of(self, name: str) -> list[tuple[object, ...]]:
        with self.reading() as db:
            return db.execute("SELECT * FROM projection_skips WHERE projection = ?",
                              (name,)).fetchall()

    def add_skips(self, rows: list[tuple[object, ...]]) -> None:
        with self.transaction() as db:
            db.executemany("INSERT OR REPLACE INTO projection_skips VALUES (?, ?, ?, ?, ?)", rows)

    def dump(self, projection: Projection) -> dict[str, list[tuple[object, ...]]]:
        with self.reading() as db:
            return projection.dump(db)

    def snapshot(self, projections: Iterable[Projection]
                 ) -> tuple[dict[str, int], dict[str, dict[str, list[tuple[object, ...]]]]]:
        """The projections' tracked positions and rows (``dump``), read in one transaction:
        what they held at one moment, whatever another process commits meanwhile."""
        with self.reading() as db:
            nested = db.in_transaction  # inside exclusive(): its own transaction is the moment
            if not nested:
                db.execute("BEGIN")
            try:
                chosen = list(projections)
                positions = self.positions(db, [p.name for p in chosen])
                return positions, {p.name: p.dump(db) for p in chosen}
            finally:
                if not nested:
                    db.execute("COMMIT")

    def fault(self, name: str) -> tuple[int, str] | None:
        with self.reading() as db:
            row = db.execute(
                "SELECT position, error FROM projection_faults WHERE projection = ?", (name,)
            ).fetchone()
        return (row[0], row[1]) if row else None

    def close(self) -> None:
        self.wait_for_rebuilds = False  # a thread waiting for one gives up (it holds lock)
        with self.lock:
            self.closed = True
            self.db.close()
