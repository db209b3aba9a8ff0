"""The store contract on the SQLite store, plus what only a file-backed store can show."""

from __future__ import annotations

import functools
import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import terret.adapters.stores.sqlite as sqlite_module
from terret.adapters.stores.sqlite import SQLiteStore
from terret.domain.errors import WrongExpectedVersion
from terret.domain.store import EventStore, StoredRecord, StreamState
from terret.testing.store_contract import (
    NOISE,
    SIGNAL,
    TIMEOUT,
    Collector,
    Opener,
    StoreContract,
    expect,
    new_stream,
    record,
    records,
)

REPO = Path(__file__).resolve().parents[2]

DAMAGE = [
    ("seq", "not a number"),
    ("recorded_at", "yesterday"),
    ("metadata", 42),
    ("data", "text, not a blob"),
    ("event_id", b"short"),
]
LOOSE_EVENTS_TABLE = """
CREATE TABLE events (
    position INTEGER PRIMARY KEY AUTOINCREMENT, stream TEXT NOT NULL, seq INTEGER NOT NULL,
    event_id BLOB NOT NULL, wire_name TEXT NOT NULL, data BLOB NOT NULL,
    metadata BLOB NOT NULL, recorded_at REAL NOT NULL, UNIQUE (stream, seq)
);
"""


class TestSQLiteStore(StoreContract):
    @property
    def db_path(self) -> Path:
        return Path(self.tmp_path) / "terret.db"

    def create_store(self) -> EventStore:
        return SQLiteStore(self.db_path)

    def create_store_with_slow_poll(self) -> EventStore:
        return SQLiteStore(self.db_path, poll_interval=5.0)

    def other_process_opener(self) -> Opener:
        return functools.partial(SQLiteStore, str(self.db_path))

    def other_store_opener(self, request: pytest.FixtureRequest) -> Opener:
        return functools.partial(SQLiteStore, str(Path(self.tmp_path) / "other.db"))

    def corrupt_record(self, store: EventStore, stored: StoredRecord) -> None:
        # SQLite refuses a wrong type in the STRICT table; a writer can still bypass the
        # CHECK on the id's length.
        with sqlite3.connect(self.db_path) as conn:
            conn.execute("PRAGMA ignore_check_constraints = ON")
            conn.execute("UPDATE events SET event_id = ? WHERE position = ?",
                         (b"\x00garbage", stored.position))

    # --- SQLite only ------------------------------------------------------------------------

    def test_durable_by_default(self, store: EventStore) -> None:
        assert isinstance(store, SQLiteStore)
        conn = sqlite3.connect(self.db_path)
        try:
            assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        finally:
            conn.close()
        assert store.synchronous == "FULL"
        assert store._conn().execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        assert "synchronous=FULL" in store.describe()

    @pytest.mark.parametrize("plan", ["sift", "scan", "index"])
    def test_a_read_of_some_streams_is_the_same_whatever_the_plan(
        self, store: EventStore, plan: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """``_read_streams`` reads in one of three ways; each gives the same records."""
        assert isinstance(store, SQLiteStore)
        monkeypatch.setattr(sqlite_module, "SIFT_RATIO", 0 if plan == "sift" else 10**9)
        monkeypatch.setattr(SQLiteStore, "_by_stream_is_cheaper",
                            staticmethod(lambda *_: plan == "index"))
        streams = [new_stream() for _ in range(6)]
        for i in range(30):
            store.append(streams[i % 6], [record(SIGNAL if i % 3 else NOISE, i)],
                         StreamState.ANY)
        everything = store.read_all(after=0, limit=10_000)
        head = store.head_position()
        wanted = [streams[0], streams[3], new_stream()]  # the last one has no events
        for after, upto, limit, wire_names in [
            (0, head, 1000, None), (0, head, 4, None), (5, head - 5, 1000, [SIGNAL]),
            (0, head, 3, [NOISE]), (0, head, 1000, ["contract/none"]), (head, head, 10, None),
        ]:
            expected = [r for r in everything if after < r.position <= upto
                        and r.stream in wanted
                        and (wire_names is None or r.wire_name in wire_names)][:limit]
            for collection in (frozenset(wanted), wanted):
                got = store._read_range(after, upto, limit, wire_names, collection)
                assert got == expected, (after, upto, limit, wire_names)
        assert store._read_range(0, head, 1000, None, []) == []

    def test_a_read_of_a_few_short_streams_in_a_long_log_takes_their_index(
        self, store: EventStore
    ) -> None:
        assert isinstance(store, SQLiteStore)
        short, long = [new_stream(), new_stream()], new_stream()
        for stream in short:
            store.append(stream, records(5), StreamState.NO_STREAM)
        for i in range(0, 12_000, 1000):
            store.append(long, records(1000), expect(i))
        head = store.head_position()
        conn = store._conn()
        cheaper = SQLiteStore._by_stream_is_cheaper
        assert cheaper(conn, json.dumps(short), head, 1000)
        assert not cheaper(conn, json.dumps([long]), head, 1000)  # the scan ends sooner
        assert not cheaper(conn, json.dumps(short), sqlite_module.SCAN_SPAN, 1000)
        plan = conn.execute(
            "EXPLAIN QUERY PLAN SELECT position FROM events WHERE position > ?"
            f" AND position <= ?{sqlite_module._IN_STREAMS} ORDER BY position LIMIT 10",
            (0, head, json.dumps(short))).fetchall()
        assert any("INDEX" in row[-1] for row in plan), plan  # SQLite's choice, unforced
        got = store._read_range(0, head, 1000, None, frozenset(short))
        assert got == sorted(store.read_stream(short[0]) + store.read_stream(short[1]),
                             key=lambda r: r.position)

    def test_two_instances_on_one_file_wake_each_other_at_once(self) -> None:
        reader = SQLiteStore(self.db_path, poll_interval=5.0)
        writer = SQLiteStore(self.db_path, poll_interval=5.0)
        try:
            stream = new_stream()
            collector = Collector(reader.subscribe(after=reader.head_position(),
                                                   wire_names=[SIGNAL]))
            try:
                collector.wait_caught_up()
                began = time.monotonic()
                writer.append(stream, records(1), StreamState.NO_STREAM)
                collector.wait_records([stream], 1)
                assert time.monotonic() - began < 0.5
            finally:
                collector.stop()
        finally:
            reader.close()
            writer.close()

    def test_closing_while_other_threads_read_does_not_crash_the_process(self) -> None:
        """A store closed while other threads still read it (a subscription still following,
        a runtime closed after its store) let go of their connections: closing one under a
        running query crashed the interpreter (SIGSEGV). In a child process: a crash must
        fail this test, not end the suite."""
        script = f"""
import threading
from terret.adapters.stores.sqlite import SQLiteStore
for _ in range(150):
    store, done = SQLiteStore({str(self.db_path)!r}), threading.Event()
    def read():
        while not done.is_set():
            try:
                store.head_position()
            except Exception:
                pass
    readers = [threading.Thread(target=read) for _ in range(3)]
    for t in readers:
        t.start()
    store.close()
    done.set()
    for t in readers:
        t.join()
print("closed")
"""
        ran = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                             timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
        assert (ran.returncode, ran.stdout.strip()) == (0, "closed"), ran.stderr[-2000:]

    def test_other_connections_are_noticed_by_the_poll(self) -> None:
        store = SQLiteStore(self.db_path, poll_interval=0.05)
        try:
            stream = new_stream()
            collector = Collector(store.subscribe(after=store.head_position()))
            try:
                collector.wait_caught_up()
                # a writer this process's change signal knows nothing about
                conn = sqlite3.connect(self.db_path, isolation_level=None)
                try:
                    template = records(1)[0]
                    conn.execute(
                        "INSERT INTO events (stream, seq, event_id, wire_name, data, metadata,"
                        " recorded_at) VALUES (?, 1, ?, ?, ?, ?, 0)",
                        (stream, template.event_id.bytes, SIGNAL, template.data,
                         template.metadata),
                    )
                finally:
                    conn.close()
                got = collector.wait_records([stream], 1, timeout=TIMEOUT)
                assert got[0].event_id == template.event_id
            finally:
                collector.stop()
        finally:
            store.close()

    def test_racing_store_instances_on_one_file(self) -> None:
        stores = [SQLiteStore(self.db_path), SQLiteStore(self.db_path)]
        try:
            stream = new_stream()
            rounds = 15
            barrier = threading.Barrier(2)
            outcomes: list[tuple[int, str, int]] = []
            lock = threading.Lock()

            def race(store: SQLiteStore) -> None:
                for r in range(rounds):
                    barrier.wait(TIMEOUT)
                    try:
                        outcome = (r, "won", store.append(stream, [record()], expect(r)).version)
                    except WrongExpectedVersion as exc:
                        outcome = (r, "lost", exc.actual)
                    with lock:
                        outcomes.append(outcome)
                    barrier.wait(TIMEOUT)

            threads = [threading.Thread(target=race, args=(s,)) for s in stores]
            for t in threads:
                t.start()
            for t in threads:
                t.join(TIMEOUT * 2)
            for r in range(rounds):
                assert sorted(o[1:] for o in outcomes if o[0] == r) == [
                    ("lost", r + 1), ("won", r + 1)
                ]
        finally:
            for s in stores:
                s.close()

    def test_a_reopened_store_keeps_everything(self) -> None:
        stream = new_stream()
        first = SQLiteStore(self.db_path)
        first.append(stream, records(3), StreamState.NO_STREAM)
        first.write_snapshot(stream, 3, b"s")
        before = first.read_stream(stream)
        first.close()
        second = SQLiteStore(self.db_path)
        try:
            assert second.read_stream(stream) == before
            assert second.read_snapshot(stream) == (3, b"s")
            assert second.append(stream, records(1), 3).position > before[-1].position
        finally:
            second.close()

    @pytest.mark.parametrize("column, value", DAMAGE)
    def test_a_damaging_write_is_refused_and_changes_nothing(
        self, store: EventStore, column: str, value: object
    ) -> None:
        stream = new_stream()
        store.append(stream, records(2), StreamState.NO_STREAM)
        before = store.read_stream(stream)
        with sqlite3.connect(self.db_path) as conn, pytest.raises(sqlite3.IntegrityError):
            conn.execute(f"UPDATE events SET {column} = ? WHERE position = ?",
                         (value, before[0].position))
        assert store.read_stream(stream) == before

    @pytest.mark.parametrize("column, value", DAMAGE)
    def test_each_damaged_column_of_a_file_without_strict_types_is_a_corrupt_record(
        self, column: str, value: object
    ) -> None:
        from terret.domain.errors import CorruptRecord

        with sqlite3.connect(self.db_path) as conn:  # the layout before the table was STRICT
            conn.executescript(LOOSE_EVENTS_TABLE)
        store = SQLiteStore(self.db_path)
        try:
            stream = new_stream()
            store.append(stream, records(2), StreamState.NO_STREAM)
            damaged = store.read_stream(stream)[0]
            with sqlite3.connect(self.db_path) as conn:
                conn.execute(f"UPDATE events SET {column} = ? WHERE position = ?",
                             (value, damaged.position))
            with pytest.raises(CorruptRecord) as info:
                store.read_all(after=damaged.position - 1, limit=10)
            assert info.value.position == damaged.position
        finally:
            store.close()

    def test_short_lived_threads_leave_no_open_connections(self, store: EventStore) -> None:
        fd_dir = Path("/proc/self/fd")
        if not fd_dir.is_dir():
            pytest.skip("needs /proc to count open files")
        stream = new_stream()
        store.append(stream, records(1), StreamState.NO_STREAM)

        def work(i: int) -> None:  # e.g. one worker thread per turn in a long-lived server
            store.append(stream, [record(SIGNAL, i)], i + 1)
            store.read_stream(stream, backwards=True, limit=1)

        def run_threads(start: int, count: int) -> None:
            for i in range(start, start + count):
                thread = threading.Thread(target=work, args=(i,))
                thread.start()
                thread.join(TIMEOUT)

        run_threads(0, 5)
        before = len(list(fd_dir.iterdir()))
        run_threads(5, 100)
        after = len(list(fd_dir.iterdir()))
        assert after - before < 10, f"{after - before} more open files after 100 threads"
        assert store.stream_version(stream) == 106


def test_processes_opening_a_new_file_at_once_all_succeed(tmp_path: Path) -> None:
    """Openers racing on a new file (a web app's workers starting together) all get the store:
    SQLite answers 'locked' at once to the loser of the switch to WAL, which is retried."""
    for round_ in range(30):
        path = tmp_path / f"race-{round_}.db"
        gate = threading.Barrier(6)
        ids: list[str | None] = []
        failures: list[BaseException] = []

        def open_it(path: Path = path, gate: threading.Barrier = gate,
                    ids: list[str | None] = ids, failures: list[BaseException] = failures
                    ) -> None:
            gate.wait(10)
            try:
                store = SQLiteStore(path)
                ids.append(store.store_id())
                store.close()
            except BaseException as exc:  # noqa: BLE001 - reported below
                failures.append(exc)

        threads = [threading.Thread(target=open_it) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not failures, (round_, failures)
        assert len(ids) == 6 and len(set(ids)) == 1


def test_a_beat_on_a_full_disk_says_the_disk_is_full(tmp_path: Path) -> None:
    """SQLite rolls a transaction back by itself on SQLITE_FULL; the registry's own ROLLBACK
    then failed with "no transaction is active", and that was the warning operators read."""
    from terret.adapters.stores.workers import SQLiteWorkers
    from terret.domain.errors import StoreError
    from terret.domain.workers import WorkerBeat

    SQLiteStore(tmp_path / "terret.db").close()  # the registry lives in a store's file
    workers = SQLiteWorkers(str(tmp_path / "terret.db"))
    beat = WorkerBeat(worker="w1", host="h", pid=1, started=0.0, at=time.time(), ttl=15.0)
    workers.beat(beat)
    conn = workers._conn()
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    conn.execute(f"PRAGMA max_page_count = {pages}")
    big = WorkerBeat(worker="w2", host="h", pid=2, started=0.0, at=time.time(), ttl=15.0,
                     sessions=tuple(f"session-{i:06d}" for i in range(5000)))
    with pytest.raises(StoreError, match="full") as caught:
        workers.beat(big)
    assert "no transaction" not in str(caught.value)
    assert not conn.in_transaction
    assert [b.worker for b in workers.beats()] == ["w1"]  # nothing half-written
    workers.close()


@pytest.mark.parametrize("how", ["moved", "deleted", "replaced"])
def test_a_file_moved_deleted_or_replaced_under_the_store_is_refused(tmp_path: Path,
                                                                       how: str) -> None:
    """A serve whose file was moved (or deleted, or a backup restored over it with ``mv``) went
    on writing into the file it had open — which no other process opens — and a thread opening
    its first connection created an empty file at the path. Every operation now says so
    (``StoreUnavailable``), nothing is written anywhere, and the store works again once the
    file is put back."""
    from terret.domain.errors import StoreUnavailable
    from terret.domain.workers import WorkerBeat

    path = tmp_path / "terret.db"
    store = SQLiteStore(path)
    stream = new_stream()
    store.append(stream, records(2), StreamState.NO_STREAM)
    store.checkpoint()  # the file alone holds the log (a restore copies the file)
    away = tmp_path / "away.db"
    os.replace(path, away)
    if how == "deleted":
        away.unlink()
    elif how == "replaced":
        SQLiteStore(path).close()  # a new, empty store at the path
    before = {p.name for p in tmp_path.iterdir()}

    beat = WorkerBeat(worker="w1", host="h", pid=1, started=0.0, at=time.time(), ttl=15.0)
    attempts: list[tuple[str, Callable[[], object]]] = [
        ("append", lambda: store.append(stream, [record(SIGNAL, 9)], 2)),
        ("read", lambda: store.read_stream(stream)),
        ("head", store.head_position),
        ("beat", lambda: store.workers().beat(beat)),
    ]
    for name, attempt in attempts:
        for thread_of_its_own in (False, True):  # a thread with no connection yet, too
            failures: list[BaseException] = []

            def run(attempt: Callable[[], object] = attempt,
                    failures: list[BaseException] = failures) -> None:
                try:
                    attempt()
                except BaseException as exc:  # noqa: BLE001 - checked below
                    failures.append(exc)

            if thread_of_its_own:
                t = threading.Thread(target=run)
                t.start()
                t.join(TIMEOUT)
            else:
                run()
            assert len(failures) == 1 and isinstance(failures[0], StoreUnavailable), \
                (name, failures)
            assert "moved, deleted or replaced" in str(failures[0])
    assert {p.name for p in tmp_path.iterdir()} == before  # no empty file made at the path
    if how == "moved":
        os.replace(away, path)
        store.append(stream, [record(SIGNAL, 9)], 2)
        assert store.stream_version(stream) == 3
    store.close()
    if how != "deleted":
        assert SQLiteStore(away if how == "replaced" else path).stream_version(stream) == \
            (2 if how == "replaced" else 3)
