"""Views know which log they were built from (issue 11, item 4).

A view file records the store's id and the last event it applied. A runner opened on a log
that is not the one — another store, or a copy of this one that is behind the views or was
written to differently since (a restored backup) — empties the views and rebuilds them from
the log, with a warning; a runner still using views another process reset stops instead of
writing into them. Views opened on their own log are never rebuilt.

Every case runs on the memory store, SQLite and the EventStoreDB emulator. "A restored copy"
of a store is played by a second store of the same kind behind ``SameId``, which claims the
first store's id (as a file copy or a restored database would); SQLite also copies the file.
"""

from __future__ import annotations

import logging
import shutil
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from terret import Session
from terret.adapters.stores import MemoryStore, SQLiteStore
from terret.domain.errors import NotAViewsFile, StoreFull, ViewsCorrupt, ViewsMismatch
from terret.domain.store import (
    EventStore,
)
from terret.projections import Projection as ProjectionBase
from terret.projections import ProjectionRunner, Views, ViewStore, default_projections
from terret.runtime.retention import purge_session
from tests.projections.conftest import OpenedStore
from tests.projections.logs import OPERATOR, Writer
from tests.support.esdb_emulator import EsdbEmulator
from tests.support.stores import DelegatingStore

WAIT = 15.0
REBUILT = "rebuilding them from position 0"


class SameId(DelegatingStore):
    """Another log presenting the identity of the store it stands in for: what a restored
    copy looks like (same id, another history)."""

    def __init__(self, inner: EventStore, like: EventStore | None) -> None:
        super().__init__(inner)
        self.like = like

    def store_id(self) -> str | None:
        return self.like.store_id() if self.like is not None else None

    def describe(self) -> str:
        return f"copy of {self.inner.describe()}"


@pytest.fixture
def another(opened_store: OpenedStore, tmp_path: Path,
            request: pytest.FixtureRequest) -> Iterator[Callable[[], EventStore]]:
    """Opens a second, empty store of the kind under test (a log of its own)."""
    made: list[EventStore] = []

    def make() -> EventStore:
        if opened_store.kind == "memory":
            store: EventStore = MemoryStore()
        elif opened_store.kind == "sqlite":
            store = SQLiteStore(tmp_path / f"other-{len(made)}.db", synchronous="OFF")
        else:
            from terret.adapters.stores.eventstoredb import EventStoreDBStore

            emulator = EsdbEmulator().start(host="127.0.0.1", port=0)
            request.addfinalizer(emulator.stop)
            store = EventStoreDBStore(emulator.uri)
        made.append(store)
        return store

    yield make
    for store in made:
        store.close()


@pytest.fixture
def views_path(tmp_path: Path) -> str:
    return str(tmp_path / "views.db")


def built(store: EventStore, path: str) -> tuple[ProjectionRunner, ViewStore]:
    view_store = ViewStore(path)
    runner = ProjectionRunner(store, view_store, default_projections())
    runner.catch_up()
    return runner, view_store


def policy_of(store: EventStore, path: str, sid: UUID) -> list[str] | None:
    runner, view_store = built(store, path)
    try:
        return Views(view_store).policy(sid)
    finally:
        view_store.close()


def sessions_in(store: EventStore, path: str) -> set[UUID]:
    _, view_store = built(store, path)
    try:
        return {UUID(s.id) for s in Views(view_store).sessions()}
    finally:
        view_store.close()


def titled(title: str) -> Callable[[Session], Any]:
    return lambda s: s.title(title)


def tracked_in(path: str) -> int:
    db = sqlite3.connect(path)
    try:
        return int(db.execute("SELECT max(position) FROM tracking").fetchone()[0])
    finally:
        db.close()


def rebuilt(caplog: pytest.LogCaptureFixture) -> bool:
    return any(REBUILT in r.getMessage() for r in caplog.records)


def older_copy(writer_of: Callable[[EventStore], Writer], store: EventStore, sid: UUID,
               policy: list[str], padding: int = 0) -> None:
    """Write into ``store`` what the older copy holds: session ``sid`` with ``policy``, and
    ``padding`` more sessions (so that its head can pass the views' position)."""
    writer = writer_of(store)
    writer.repo.save(Session.start(sid, agent="default", roles={"main": "openrouter:x/y"}))
    writer.do(sid, lambda s: s.update_policy(policy, by=OPERATOR))
    for _ in range(padding):
        other = writer.start()
        writer.do(other, lambda s: s.title("padding"))


# --- views opened on another log are rebuilt -------------------------------------------------


def test_views_built_from_another_store_are_rebuilt_from_its_log(
        store: EventStore, writer: Writer, another: Callable[[], EventStore], views_path: str,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "terret.projections")
    sid = writer.start()
    writer.do(sid, lambda s: s.update_policy(["status", "noop"], by=OPERATOR))
    assert policy_of(store, views_path, sid) == ["status", "noop"]
    assert not rebuilt(caplog)

    other = another()  # ahead of the views (more events), so positions alone cannot tell
    older_copy(Writer, other, sid, ["status"], padding=6)
    assert other.head_position() > tracked_in(views_path)
    assert policy_of(other, views_path, sid) == ["status"]
    assert rebuilt(caplog)
    only_other = sessions_in(other, views_path)
    assert sid in only_other and len(only_other) == 7  # nothing left of the first store


def test_views_emptied_for_another_store_never_lack_their_tables(
        store: EventStore, writer: Writer, another: Callable[[], EventStore], views_path: str,
        caplog: pytest.LogCaptureFixture) -> None:
    """The reset dropped every table and left the projections' to the runner afterwards: a
    command reading the same views file in another process meanwhile (two stores' CLIs in one
    directory share ``terret-views.db``) failed with sqlite's raw ``no such table``. Now the
    reset creates them in its own transaction: a reader sees the views as they were, or empty."""
    from terret.projections._logcheck import LogCheck

    caplog.set_level(logging.WARNING, "terret.projections")
    sid = writer.start()
    _, first = built(store, views_path)
    first.close()
    other = another()
    older_copy(Writer, other, sid, ["status"], padding=2)
    resetting = ViewStore(views_path)
    reader = ViewStore(views_path)  # another process's connection, reading meanwhile
    try:
        assert LogCheck(other, resetting, default_projections()).check()  # emptied
        assert Views(reader).sessions() == [] and Views(reader).policy(sid) is None
        runner = ProjectionRunner(other, resetting, default_projections())
        assert runner._log.projections == runner.projections  # the runner's reset does it too
        runner.catch_up()
        assert {UUID(s.id) for s in Views(reader).sessions()} == sessions_in(other, views_path)
    finally:
        resetting.close()
        reader.close()


class OwnCreate(ProjectionBase):
    """A projection creating its tables its own way — ``executescript``, which commits."""

    name = "acme.own_create"
    handles = frozenset({"session/titled"})
    tables = ("acme_own",)
    schema = "CREATE TABLE IF NOT EXISTS acme_own (session TEXT)"

    def create(self, db: sqlite3.Connection) -> None:
        db.executescript(self.schema)

    def process(self, db: sqlite3.Connection, event: Any) -> None:
        db.execute("INSERT INTO acme_own VALUES (?)", (event.stream,))


def test_a_projection_with_a_create_of_its_own_is_created_after_a_reset(
        store: EventStore, writer: Writer, another: Callable[[], EventStore],
        views_path: str) -> None:
    """Its create may commit: it stays out of the reset's transaction (which would be cut in
    two) and the runner creates its tables after, as before."""
    sid = writer.start()
    writer.do(sid, titled("first"))
    view_store = ViewStore(views_path)
    ProjectionRunner(store, view_store, [*default_projections(), OwnCreate()]).catch_up()
    view_store.close()
    other = another()
    older_copy(Writer, other, sid, ["status"])
    Writer(other).do(sid, titled("again"))
    view_store = ViewStore(views_path)
    try:
        runner = ProjectionRunner(other, view_store, [*default_projections(), OwnCreate()])
        assert [p.name for p in runner._log.projections] == [
            p.name for p in default_projections()]
        runner.catch_up()
        with view_store.reading() as db:
            assert db.execute("SELECT count(*) FROM acme_own").fetchone()[0] == 1
    finally:
        view_store.close()


def test_views_ahead_of_a_restored_copy_are_rebuilt(
        store: EventStore, writer: Writer, another: Callable[[], EventStore], views_path: str,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "terret.projections")
    sid = writer.start()
    writer.do(sid, lambda s: s.update_policy(["status"], by=OPERATOR))
    writer.do(sid, lambda s: s.update_policy(["status", "noop"], by=OPERATOR))
    writer.do(sid, lambda s: s.title("after the backup"))
    assert policy_of(store, views_path, sid) == ["status", "noop"]

    restored = SameId(another(), like=store)  # the backup: the first two events only
    older_copy(Writer, restored, sid, ["status"])
    assert restored.head_position() < tracked_in(views_path)
    assert policy_of(restored, views_path, sid) == ["status"]
    assert rebuilt(caplog)
    _, view_store = built(restored, views_path)
    assert Views(view_store).title(sid) is None
    view_store.close()


def test_a_restored_copy_written_past_the_views_position_is_still_caught(
        store: EventStore, writer: Writer, another: Callable[[], EventStore], views_path: str,
        caplog: pytest.LogCaptureFixture) -> None:
    """The copy was written to (by processes without these views) until its head passed the
    views' position: the event the views applied last is not the one the copy holds there."""
    caplog.set_level(logging.WARNING, "terret.projections")
    sid = writer.start()
    writer.do(sid, lambda s: s.update_policy(["status", "noop"], by=OPERATOR))
    assert policy_of(store, views_path, sid) == ["status", "noop"]

    restored = SameId(another(), like=store)
    older_copy(Writer, restored, sid, ["status"])  # same stream and seq, other events
    restored_writer = Writer(restored)
    for n in range(8):
        restored_writer.do(sid, titled(f"since the restore {n}"))
    assert restored.head_position() >= tracked_in(views_path)
    assert policy_of(restored, views_path, sid) == ["status"]
    assert rebuilt(caplog)


def test_a_sqlite_store_replaced_by_an_older_copy_of_its_file(
        opened_store: OpenedStore, writer: Writer, views_path: str, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    if opened_store.kind != "sqlite":
        pytest.skip("a file copy is SQLite's backup")
    caplog.set_level(logging.WARNING, "terret.projections")
    assert opened_store.uri is not None
    path = Path(opened_store.uri)
    sid = writer.start()
    writer.do(sid, lambda s: s.update_policy(["status"], by=OPERATOR))
    backup = tmp_path / "backup.db"
    source, copy = sqlite3.connect(path), sqlite3.connect(backup)
    source.backup(copy)
    source.close()
    copy.close()
    writer.do(sid, lambda s: s.update_policy(["status", "noop"], by=OPERATOR))
    assert policy_of(opened_store.store, views_path, sid) == ["status", "noop"]

    opened_store.store.close()
    for suffix in ("-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    shutil.copyfile(backup, path)
    restored = SQLiteStore(path)
    opened_store.store = restored  # closed by the fixture
    assert policy_of(restored, views_path, sid) == ["status"]
    assert rebuilt(caplog)
    with sqlite3.connect(backup) as copy:  # the copy kept the store's id (its head told)
        assert copy.execute("SELECT value FROM terret_meta").fetchone()[0] == \
            restored.store_id()


def test_views_written_before_views_recorded_their_log_are_checked_by_position(
        store: EventStore, writer: Writer, another: Callable[[], EventStore], views_path: str,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "terret.projections")
    sid = writer.start()
    for n in range(4):
        writer.do(sid, titled(f"title {n}"))
    _, view_store = built(store, views_path)
    with view_store.reading() as db:
        db.execute("DROP TABLE IF EXISTS views_log")  # as an older Terret left it
    view_store.close()
    restored = SameId(another(), like=None)
    older_copy(Writer, restored, sid, ["status"])
    _, view_store = built(restored, views_path)
    assert Views(view_store).title(sid) is None and rebuilt(caplog)
    view_store.close()


# --- views opened on their own log are kept --------------------------------------------------


def test_views_reopened_on_their_own_log_are_never_rebuilt(
        store: EventStore, writer: Writer, views_path: str,
        caplog: pytest.LogCaptureFixture) -> None:
    """Not after filtered-out records (snapshots: EventStoreDB checkpoints past the last event
    a reader is given), nor after the last event the views applied was purged."""
    caplog.set_level(logging.WARNING, "terret.projections")
    kept, doomed = writer.start(), writer.start()
    writer.turn(kept, "hello")
    writer.do(doomed, lambda s: s.title("doomed"))
    view_store = ViewStore(views_path)
    runner = ProjectionRunner(store, view_store, default_projections()).start()
    try:
        runner.wait_until(store.head_position(), timeout=WAIT)
        for n in range(30):  # records no reader is given
            store.write_snapshot(f"noise-{n}", 1, b"{}")
    finally:
        runner.stop()
        view_store.close()
    writer.do(doomed, lambda s: s.close(by=OPERATOR))
    view_store = ViewStore(views_path)
    ProjectionRunner(store, view_store, default_projections()).catch_up()
    view_store.close()
    # the last event the views applied (the close) is gone
    purge_session(writer.repo, doomed, by=OPERATOR)
    _, view_store = built(store, views_path)
    assert not rebuilt(caplog)
    assert [m.text for m in Views(view_store).messages(kept)] == ["hello", "ok"]
    view_store.close()
    writer.turn(kept, "again")
    _, view_store = built(store, views_path)
    assert not rebuilt(caplog)
    view_store.close()


# --- a process whose views were reset under it ------------------------------------------------


def test_a_runner_stops_using_views_another_process_rebuilt_from_another_store(
        store: EventStore, writer: Writer, another: Callable[[], EventStore],
        views_path: str) -> None:
    sid = writer.start()
    mine = ViewStore(views_path)
    runner = ProjectionRunner(store, mine, default_projections()).start()
    try:
        runner.wait_until(store.head_position(), timeout=WAIT)
        other = another()
        older_copy(Writer, other, sid, ["status"])
        _, theirs = built(other, views_path)  # "another process" resets the file
        theirs.close()
        position = writer.do(sid, lambda s: s.update_policy(["noop"], by=OPERATOR)).position
        with pytest.raises(ViewsMismatch):
            runner.wait_until(position, timeout=WAIT)
        assert Views(mine).policy(sid) == ["status"]  # nothing of this log written into it
    finally:
        runner.stop()
        mine.close()


# --- a damaged views file, a full disk ---------------------------------------------------------


def test_a_damaged_views_file_is_a_typed_error(tmp_path: Path) -> None:
    """A SQLite file whose pages are garbage: damaged, to be deleted (a file that is not
    SQLite at all is someone else's: ``NotAViewsFile``, left untouched)."""
    path = tmp_path / "views.db"
    path.write_bytes(b"SQLite format 3\x00" + b"these are not the views you are looking for" * 100)
    with pytest.raises(ViewsCorrupt, match="delete it"):
        ViewStore(str(path))
    notes = tmp_path / "notes.txt"
    notes.write_bytes(b"these are not the views you are looking for" * 100)
    with pytest.raises(NotAViewsFile, match="not a SQLite database"):
        ViewStore(str(notes))
    assert notes.read_bytes() == b"these are not the views you are looking for" * 100


def test_a_full_disk_under_the_views_is_a_typed_error(tmp_path: Path) -> None:
    store = MemoryStore()
    writer = Writer(store)
    sid = writer.start()
    view_store = ViewStore(str(tmp_path / "views.db"))
    runner = ProjectionRunner(store, view_store, default_projections())
    runner.catch_up()
    pages = view_store.db.execute("PRAGMA page_count").fetchone()[0]
    view_store.db.execute(f"PRAGMA max_page_count = {pages}")
    for n in range(20):
        writer.turn(sid, f"{n:04d} a message long enough to need pages of its own " * 40)
    with pytest.raises(StoreFull, match="is full"):
        runner.catch_up()
    view_store.close()
