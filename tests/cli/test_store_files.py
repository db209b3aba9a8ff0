"""Store files the CLI must not trust blindly (issue 11, items 4 and 5), through ``terret`` as
a subprocess:

* a store restored from an older copy while its views file stays (SQLite: the file replaced
  by a copy taken earlier; EventStoreDB: a fresh emulator — another store — holding the older
  history, with the same views file): ``policy show`` and the policy a runtime enforces are the
  restored log's, and a tool the restored policy denies is not run;
* another application's SQLite file: refused in one line, left byte for byte as it was;
* a damaged SQLite file: one typed line, never a traceback, never a false ``SessionNotFound``;
* a full disk: one typed line that says so (SQLite ``max_page_count`` caps the file:
  ``tests/cli/full_disk.py`` runs ``terret`` with every connection to it capped).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from terret import AgentDefinition, Runtime, ScriptedProvider, StaticResolver
from terret.adapters.stores import SQLiteStore
from terret.domain.errors import StoreFull
from terret.domain.events import Actor
from terret.domain.repository import SessionRepository
from terret.domain.session import Session
from terret.domain.store import EventStore, NewRecord, StreamState, session_stream
from terret.runtime.writer import SessionWriter
from tests.cli.conftest import ROOT, Target, one_line_error, subprocess_env
from tests.runtime.kit import Kit, calls, final, only, read_log
from tests.support.esdb_emulator import EsdbEmulator

OPERATOR = Actor(actor="operator", id="ops")
ROLES = {"main": "demo:ops-model-1"}


def json_of(result: subprocess.CompletedProcess[str]) -> Any:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def failed(result: subprocess.CompletedProcess[str], error: str) -> str:
    """The command failed with exit 1 and one ``Error: <error>: …`` line, stdout empty."""
    assert result.returncode == 1, (result.returncode, result.stdout, result.stderr)
    assert result.stdout == ""
    line = one_line_error(result.stderr)
    assert line.startswith(f"Error: {error}: "), line
    return line


# --- a store restored from an older copy ---------------------------------------------------------


def set_policy(store: EventStore, sid: UUID, patterns: list[str]) -> None:
    SessionWriter(SessionRepository(store)).execute(
        sid, lambda s: s.update_policy(patterns, by=OPERATOR))


def older_history(store: EventStore, sid: UUID, padding: int) -> None:
    """What the older copy holds: the session with the narrow policy (and, on the fresh
    emulator, other sessions, so that its head passes the views' position)."""
    writer = SessionWriter(SessionRepository(store))
    writer.create(Session.start(sid, agent="demo", roles=ROLES))
    set_policy(store, sid, ["status"])
    for _ in range(padding):
        other = Session.start(agent="demo", roles=ROLES)
        writer.create(other)
        writer.execute(other.id, lambda s: s.title("padding"))


def restore(target: Target, backup: Path | None, request: pytest.FixtureRequest,
            sid: UUID) -> Target:
    """Replace the target's store by its older copy; the views file stays."""
    target.close()
    if target.kind == "sqlite":
        assert backup is not None
        path = Path(target.uri)
        for suffix in ("-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        shutil.copyfile(backup, path)
        return Target("sqlite", target.uri, target.views, target.cwd)
    emulator = EsdbEmulator().start(host="127.0.0.1", port=0)
    request.addfinalizer(emulator.stop)
    restored = Target("esdb", emulator.uri, target.views, target.cwd)
    older_history(restored.store(), sid, padding=12)
    return restored


def test_a_store_restored_from_an_older_copy_governs_policy_show_and_the_runtime(
        target: Target, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    # the backup's state: the session's recorded policy allows `status` only
    store = target.store()
    sid = uuid.uuid4()
    if target.kind == "sqlite":
        older_history(store, sid, padding=0)
        backup: Path | None = tmp_path / "backup.db"
        source, copy = sqlite3.connect(target.uri), sqlite3.connect(str(backup))
        source.backup(copy)
        source.close()
        copy.close()
    else:
        older_history(store, sid, padding=0)
        backup = None
    # after the backup: the policy widened to `noop`, and the views built from that log
    set_policy(store, sid, ["status", "noop"])
    SessionWriter(SessionRepository(store)).execute(sid, lambda s: s.title("after"))
    assert json_of(target.run("--json", "policy", "show", str(sid)))["patterns"] == [
        "status", "noop"]
    runtime_views = tmp_path / "runtime-views.db"  # the runtime's own copy of the stale views
    shutil.copyfile(target.views, runtime_views)

    restored = restore(target, backup, request, sid)
    try:
        # the CLI: the views are rebuilt from the restored log (a warning says why)
        shown = restored.run("--json", "policy", "show", str(sid))
        assert json_of(shown)["patterns"] == ["status"]
        assert "rebuilding them from position 0" in shown.stderr
        assert json_of(restored.run("--json", "title", str(sid)))["title"] is None

        # a runtime on the stale views: the restored policy denies `noop`, so it never runs
        kit = Kit()
        provider = ScriptedProvider([calls(("noop", {}), ("status", {"env": "prod"})),
                                     final("done")])
        runtime = Runtime(restored.store(), resolver=StaticResolver({"demo": provider}),
                          views=str(runtime_views),
                          agents=[AgentDefinition(name="demo", tools=kit.tools, allow=["*"])])
        runtime.start()
        try:
            runtime.catch_up_views()
            assert runtime.views.policy(sid) == ["status"]
            assert runtime.run_turn(sid, "go").status == "completed"
        finally:
            runtime.close(grace=5.0)
        assert kit.ran == [("status", {"env": "prod"})]
        results = only(read_log(restored.store(), sid), "tool/result")
        assert [r.data["is_error"] for r in results] == [True, False]
        assert results[0].data["content"] == "vetoed: noop is not allowed by the session's policy"
    finally:
        restored.close()


# --- another application's SQLite file -----------------------------------------------------------


def foreign_file(path: Path, *tables: str) -> str:
    db = sqlite3.connect(path)
    for table in tables:
        db.execute(f"CREATE TABLE {table} (id INTEGER PRIMARY KEY, name TEXT NOT NULL)")
        db.execute(f"INSERT INTO {table} (name) VALUES ('ann'), ('bob')")
    db.commit()
    db.close()
    return hashlib.sha256(path.read_bytes()).hexdigest()


def terret(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "terret", *args], capture_output=True,
                          text=True, timeout=60, cwd=cwd, env=subprocess_env())


@pytest.mark.parametrize("tables", [("users", "orders"), ("users", "events")],
                         ids=["own-tables", "an-events-table-of-its-own"])
def test_another_applications_sqlite_file_is_refused_and_left_untouched(
        tmp_path: Path, tables: tuple[str, ...]) -> None:
    app_db = tmp_path / "app.db"
    digest = foreign_file(app_db, *tables)
    before = sorted(p.name for p in tmp_path.iterdir())
    for command in (["sessions", "list"], ["sessions", "new"], ["doctor"],
                    ["projections", "status"], ["policy", "show", str(uuid.uuid4())],
                    ["serve"]):
        result = terret(tmp_path, "--store", str(app_db), *command)
        line = failed(result, "NotATerretStore")
        assert "is not a Terret store" in line and str(app_db) in line, line
    assert hashlib.sha256(app_db.read_bytes()).hexdigest() == digest
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no -wal, -shm, views
    db = sqlite3.connect(app_db)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "delete"  # not switched to WAL
    db.close()


def test_a_file_that_is_not_sqlite_is_refused_and_left_untouched(tmp_path: Path) -> None:
    notes = tmp_path / "notes.db"
    notes.write_text("shopping: milk, eggs\n" * 200)
    digest = hashlib.sha256(notes.read_bytes()).hexdigest()
    failed(terret(tmp_path, "--store", str(notes), "sessions", "new"), "NotATerretStore")
    assert hashlib.sha256(notes.read_bytes()).hexdigest() == digest
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.db"]


def test_empty_files_and_terret_stores_are_opened(tmp_path: Path) -> None:
    empty = tmp_path / "empty.db"
    empty.touch()  # e.g. made by mktemp
    sid = terret(tmp_path, "--store", str(empty), "sessions", "new").stdout.strip()
    assert UUID(sid)
    listed = terret(tmp_path, "--json", "--store", str(empty), "sessions", "list")
    assert [s["id"] for s in json_of(listed)] == [sid]
    views = tmp_path / "empty.views.db"
    line = failed(terret(tmp_path, "--store", str(views), "sessions", "list"),
                  "NotATerretStore")
    assert "views file" in line  # the views passed as the store: the message says so


# --- a damaged SQLite file ------------------------------------------------------------------


def _pages(path: Path) -> tuple[int, dict[str, int]]:
    db = sqlite3.connect(path)
    try:
        size = db.execute("PRAGMA page_size").fetchone()[0]
        roots = dict(db.execute("SELECT name, rootpage FROM sqlite_master"))
    finally:
        db.close()
    return size, roots


def _damage(path: Path, page: int, size: int, start: int, fill: bytes) -> None:
    data = bytearray(path.read_bytes())
    offset = (page - 1) * size
    data[offset + start:offset + size] = fill * (size - start)
    path.write_bytes(bytes(data))


@pytest.fixture
def damaged(sqlite_target: Target) -> tuple[Target, UUID]:
    """A SQLite store holding a parked session, closed cleanly (no -wal left)."""
    sid = sqlite_target.parked()
    sqlite_target.close()
    assert not Path(f"{sqlite_target.uri}-wal").exists()
    return sqlite_target, sid


def test_a_damaged_events_table_is_one_typed_line_for_every_command(
        damaged: tuple[Target, UUID]) -> None:
    target, sid = damaged
    path = Path(target.uri)
    size, roots = _pages(path)
    _damage(path, roots["events"], size, 0, b"\xab")
    for command in (["sessions", "list"], ["sessions", "show", str(sid)], ["doctor"],
                    ["projections", "status"], ["projections", "verify"],
                    ["projections", "rebuild"], ["policy", "show", str(sid)],
                    ["log", str(sid)], ["approve", str(sid), "call-deploy"],
                    ["serve", "--app", "terret.cli.demo_app:demo_app"]):
        line = failed(target.run(*command, timeout=60), "StoreCorrupt")
        assert "is damaged" in line and "restore it from a backup" in line, line


def test_a_damaged_index_is_not_reported_as_a_missing_session(
        damaged: tuple[Target, UUID]) -> None:
    """A damaged index can make a session's events invisible without any SQLite error: before
    the CLI says a session does not exist, it checks the file."""
    target, sid = damaged
    path = Path(target.uri)
    size, roots = _pages(path)
    _damage(path, roots["sqlite_autoindex_events_1"], size, 8, b"\x00")  # its cell pointers
    for command in (["policy", "show", str(sid)], ["approve", str(sid), "call-deploy"],
                    ["title", str(sid)], ["sessions", "show", str(sid)], ["log", str(sid)],
                    ["doctor"]):
        line = failed(target.run(*command), "StoreCorrupt")
        assert "is damaged" in line, line


# --- a full disk ----------------------------------------------------------------------------


def _fill(path: Path) -> None:
    """Append tiny records through a connection capped at the file's size until SQLite refuses
    every one: the pages are full, as on a full disk."""
    store = SQLiteStore(path)
    try:
        conn = store._conn()  # noqa: SLF001 - the cap is per connection
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        conn.execute(f"PRAGMA max_page_count = {pages + 2}")
        refused = 0
        while refused < 50:
            try:
                store.append("f", [NewRecord(uuid.uuid4(), "t", b"{}", b"{}")], StreamState.ANY)
                refused = 0
            except StoreFull:
                refused += 1
        with pytest.raises(StoreFull, match="is full"):  # a session's event does not fit
            store.append(session_stream(uuid.uuid4()),
                         [NewRecord(uuid.uuid4(), "session/started", b"{}", b"{}")],
                         StreamState.NO_STREAM)
    finally:
        store.close()


def full(target: Target, *args: str) -> subprocess.CompletedProcess[str]:
    """``terret`` with every SQLite connection to the store capped at the file's size."""
    env = {**subprocess_env(), "TERRET_TEST_FULL_DB": target.uri}
    return subprocess.run([sys.executable, "-m", "tests.cli.full_disk", *target.args(*args)],
                          capture_output=True, text=True, timeout=60, cwd=ROOT, env=env)


def test_a_full_disk_is_one_typed_line_that_says_so(sqlite_target: Target) -> None:
    target = sqlite_target
    open_sid = target.new_session()
    closed_sid = target.closed()
    target.close()
    _fill(Path(target.uri))
    before = target.snapshot()
    target.close()
    for command in (["sessions", "new"], ["title", str(open_sid), "a new title"],
                    ["inject", str(open_sid), "hello"],
                    ["policy", "set", str(open_sid), "status"],
                    ["sessions", "close", str(open_sid)],
                    ["sessions", "purge", str(closed_sid), "--yes"]):
        line = failed(full(target, *command), "StoreFull")
        assert "is full" in line and "nothing was written" in line, line
    assert target.snapshot() == before
    listed = full(target, "--json", "sessions", "list")  # reading still works
    assert {s["id"] for s in json_of(listed)} == {
        str(open_sid), str(closed_sid)}


# --- a file copy after a crash (docs/operations.md, Backups and restores) --------------------

KILLED_WRITER = """
import os, signal, sys
from terret.adapters.stores import SQLiteStore
from terret.runtime.commands import SessionCommands

commands = SessionCommands.on(SQLiteStore(sys.argv[1]))
for _ in range(3):
    commands.create(agent="demo")
os.kill(os.getpid(), signal.SIGKILL)  # closes nothing: the events stay in the WAL
"""


def test_a_file_copy_after_a_crash_holds_every_event_once_the_store_was_opened(
        tmp_path: Path) -> None:
    """The documented procedure: after a killed process, open and close the store once (any
    command, here ``terret doctor``), then copy ``terret.db`` alone: the copy has every
    session. (Before that the events were only in ``terret.db-wal``.)"""
    store = tmp_path / "terret.db"
    killed = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(store)],
                            capture_output=True, text=True, timeout=60, env=subprocess_env())
    assert killed.returncode == -9, killed.stderr
    assert (tmp_path / "terret.db-wal").stat().st_size > 0  # where the events are
    assert terret(tmp_path, "--store", str(store), "doctor").returncode == 0
    backup = tmp_path / "backup"
    backup.mkdir()
    shutil.copyfile(store, backup / "terret.db")
    listed = terret(backup, "--store", str(backup / "terret.db"), "--json", "sessions", "list")
    assert listed.returncode == 0, listed.stderr
    assert len(json.loads(listed.stdout)) == 3


@pytest.mark.parametrize("args", [["--model", "nosuch:x"], ["--agent", "nope"],
                                  ["--app", "nosuchmodule:app"]],
                         ids=["unknown provider", "unknown agent", "missing app"])
def test_chat_refused_on_its_command_line_creates_no_store(tmp_path: Path,
                                                           args: list[str]) -> None:
    """`chat` opened (created) the store and its views before it checked `--app`, `--model`
    and `--agent`: a refused command line left a 36 KB store and a views file behind, where
    `serve` leaves none."""
    store = tmp_path / "new.db"
    done = subprocess.run([sys.executable, "-m", "terret", "--store", str(store), "chat",
                           *args], cwd=tmp_path, env=subprocess_env(), capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 2, done.stderr
    assert one_line_error(done.stderr).startswith("Error: BadParameter: Invalid value for "
                                                  f"'{args[0]}'"), done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [], list(tmp_path.iterdir())


_HOLD_REBUILD_LOCK = """
import sys, time
from terret.projections._rebuild_lock import RebuildLock
with RebuildLock(sys.argv[1]).held():
    print("held", flush=True)
    time.sleep(60)
"""


def test_views_another_stores_process_is_rebuilding_are_not_shown_as_this_stores(
        tmp_path: Path) -> None:
    """While another store's process rebuilt a views file shared by mistake, a command on this
    store skipped the check of whose views they are (it shows a rebuild's views as they were
    before it): `sessions list` printed the other store's sessions as this one's, exit 0, no
    warning. Now it is refused, saying whose they are."""
    big, small, views = tmp_path / "big.db", tmp_path / "small.db", tmp_path / "shared.views.db"
    made = terret(tmp_path, "--store", str(big), "--views", str(views), "sessions", "new")
    assert made.returncode == 0, made.stderr
    assert terret(tmp_path, "--store", str(big), "--views", str(views), "sessions",
                  "list").returncode == 0  # the views are big's
    assert terret(tmp_path, "--store", str(small), "sessions", "new").returncode == 0
    fresh = tmp_path / "fresh.views.db"  # never built: a first build holds the lock
    holders = [subprocess.Popen([sys.executable, "-c", _HOLD_REBUILD_LOCK, str(path)],
                                stdout=subprocess.PIPE, text=True, cwd=tmp_path,
                                env=subprocess_env()) for path in (views, fresh)]
    try:
        for holder in holders:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        line = failed(terret(tmp_path, "--store", str(small), "--views", str(fresh),
                             "sessions", "list"), "ViewsBusy")  # not "no such table"
        assert "for the first time" in line, line
        line = failed(terret(tmp_path, "--store", str(small), "--views", str(views),
                             "sessions", "list"), "ViewsMismatch")
        assert "built from another store" in line and "is rebuilding them" in line, line
        as_json = terret(tmp_path, "--store", str(small), "--views", str(views), "--json",
                         "sessions", "list")
        assert as_json.returncode == 1
        assert json.loads(as_json.stdout)["error"]["type"] == "ViewsMismatch"
    finally:
        for holder in holders:
            holder.kill()
            holder.wait(10)
    shown = terret(tmp_path, "--store", str(small), "--views", str(views), "--json",
                   "sessions", "list")
    assert shown.returncode == 0, shown.stderr  # once the rebuild is over: rebuilt, said
    assert [s["id"] for s in json.loads(shown.stdout)] != [made.stdout.strip()]


def test_a_purged_session_s_text_is_in_no_file_once_the_processes_are_gone(
        sqlite_target: Target) -> None:
    """docs/operations.md: a purge's deleted rows are overwritten (``secure_delete``, whatever
    the SQLite build's default), so once every process on the store has closed it — the
    write-ahead logs checkpointed and reset — no file beside the store holds the purged
    session's text; each step a process of its own."""
    target = sqlite_target
    marker = f"PURGE-MARKER-{uuid.uuid4().hex}"
    sid = target.new_session()
    for i in range(20):  # pages of it, in the store and in the views' messages
        assert target.run("inject", str(sid), f"{marker} {i}").returncode == 0
    assert target.run("sessions", "show", str(sid)).returncode == 0
    assert target.run("sessions", "close", str(sid)).returncode == 0
    target.close()  # this test's own connections too
    assert target.run("sessions", "purge", str(sid), "--yes").returncode == 0
    assert target.run("sessions", "list").returncode == 0  # the views forget it
    left = {path.name: path.read_bytes().count(marker.encode())
            for path in target.cwd.iterdir() if path.is_file()}
    assert not any(left.values()), left
