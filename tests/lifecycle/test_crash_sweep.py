"""Crash injection at every append point.

The lane's turn (three steps, one approval) runs in a child process whose store kills the
process with SIGKILL around its N-th append, once before the write and once after it committed,
for every N. After each death a fresh process takes over (``serve_start``: resume, approving
when asked, or running the turn again if it was never logged) and the log must hold: one
``turn/start`` per turn and at most one ``turn/end``, each tool call answered by exactly one
``tool/result``, each approval asked once, no event written twice, one title, and every
projection equal to its rebuild.

Children are forked from a preloaded fork server, so a crash point costs its run, not an
interpreter start.
"""

from __future__ import annotations

import multiprocessing
import signal
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from terret.adapters.stores import SQLiteStore, open_store
from terret.domain.store import EventStore
from terret.projections import default_projections
from tests.lifecycle import child
from tests.lifecycle.kit import check_invariants, new_session, read_report
from tests.runtime.conftest import OpenedStore
from tests.runtime.kit import only, read_log
from tests.support.esdb_emulator import EsdbEmulator
from tests.support.esdb_fixtures import real_server_uri

# The appends of the lane's turn, each one durable write (one crash point before it, one after):
APPENDS = len([
    "agent/attached",
    "turn/start user/message",
    "step/start",  # step 1
    "assistant/message",  # deploy
    "approval/requested",
    "approval/resolved",  # by the child's own operator thread
    "tool/result step/end step/start",  # step 1's last result rides with step 2's start
    "assistant/message",  # status
    "tool/result step/end step/start",
    "assistant/message step/end turn/end",  # a final reply closes step and turn at once
    "session/titled",
    "agent/detached",  # the graceful stop releases the session (R29)
])
POINTS = 2 * APPENDS


@pytest.fixture(scope="module")
def forked() -> Iterator[Any]:
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["tests.lifecycle.child"])
    yield context


@contextmanager
def isolated(opened: OpenedStore, where: Path) -> Iterator[tuple[str, EventStore]]:
    """A fresh store of the same kind: a SQLite file, or an emulator of its own (a real
    server, named by TERRET_ESDB_URI, is shared: the points then run one at a time)."""
    if opened.kind == "sqlite":
        uri = str(where / "events.db")
        store: EventStore = SQLiteStore(uri)
        try:
            yield uri, store
        finally:
            store.close()
    elif real_server_uri():
        yield opened.uri, opened.store
    else:
        emulator = EsdbEmulator().start(host="127.0.0.1", port=0)
        store = open_store(emulator.uri)
        try:
            yield emulator.uri, store
        finally:
            store.close()
            emulator.stop()


FORKSERVER_UNKNOWN_STATUS = 255


def finished(code: int | None, report: Path) -> bool:
    """A job ran to its end: exit 0 and its report written — or, when the forkserver could not
    read the status back (``FORKSERVER_UNKNOWN_STATUS``, under load), the report alone, which
    the job writes as its very last act."""
    return report.exists() and code in (0, FORKSERVER_UNKNOWN_STATUS)


def run(context: Any, target: Any, *args: Any) -> int | None:
    process = context.Process(target=target, args=args, daemon=True)
    process.start()
    process.join(60)
    if process.is_alive():
        process.kill()
        raise AssertionError(f"{target.__name__}{args} did not finish")
    return process.exitcode


def test_crash_sweep_every_append_point_before_and_after_the_write(
        opened: OpenedStore, tmp_path: Path, forked: Any) -> None:
    store = opened.store
    report, ran = tmp_path / "report.json", tmp_path / "ran.txt"

    # a clean run counts the append points
    sid = new_session(store)
    assert finished(run(forked, child.crash_job, opened.uri, str(sid), 0, "never",
                        str(report), str(ran)), report)
    assert read_report(report) == {"status": "completed", "appends": APPENDS}
    check_invariants(read_log(store, sid))

    def point(crash_at: int, when: str) -> str:
        """One crash point, in a store of its own when it can have one (the taking-over
        process serves every open turn it finds); returns how the fresh process took over."""
        where = f"crash {when} append {crash_at}"
        files = tmp_path / f"{crash_at}-{when}"
        files.mkdir()
        report, ran = files / "report.json", files / "ran.txt"
        with isolated(opened, files) as (uri, store):
            sid = new_session(store)
            code = run(forked, child.crash_job, uri, str(sid), crash_at, when,
                       str(report), str(ran))
            # A forkserver child's status is read back over a pipe; when that read fails (seen
            # under heavy load) multiprocessing reports 255 instead of the signal. The child
            # never finishing — no report written — is what shows it died at the crash point.
            assert code in (-signal.SIGKILL, FORKSERVER_UNKNOWN_STATUS), \
                f"{where}: the child exited with {code}"
            assert not report.exists(), f"{where}: the child ran to the end"
            assert finished(run(forked, child.resume_job, uri, str(sid), str(report),
                                str(ran)), report), where
            log = read_log(store, sid)
        taken_over = read_report(report)
        try:
            check_invariants(log)
            assert len(only(log, "turn/start")) == 1
            (end,) = only(log, "turn/end")
            assert end.data["status"] == "completed"
            assert [e.data["call_id"] for e in only(log, "approval/requested")] == [
                "c-deploy"]
            assert len(only(log, "approval/resolved")) == 1
            assert len(only(log, "session/titled")) == 1
            assert taken_over["verify"] == {p.name: [] for p in default_projections()}
            executed = ran.read_text().splitlines()
            assert {"deploy c-deploy", "status c-status"} <= set(executed)
        except AssertionError as exc:
            raise AssertionError(f"{where}: {exc}") from exc
        return str(taken_over["action"])

    points = [(n, when) for n in range(1, APPENDS + 1) for when in ("before", "after")]
    workers = 1 if opened.kind == "esdb" and real_server_uri() else 3
    with ThreadPoolExecutor(max_workers=workers) as pool:  # independent stores: overlap them
        actions = Counter(pool.map(lambda p: point(*p), points))
    exercised = sum(actions.values())

    print(f"crash points exercised on {opened.kind}: {exercised} "
          f"({APPENDS} appends x before/after; takeovers: {dict(actions)})")
    assert exercised == POINTS == 24
    assert actions["resume"] > 0 and actions["run"] > 0 and actions["none"] > 0
