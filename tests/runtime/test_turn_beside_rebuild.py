"""A turn whose views are held by another process's rebuild (docs/projections.md: a rebuild is
safe beside live runners; they wait for it). The turn reads its model context from the views,
so it waits too — but the time someone else's rebuild holds them is not the runner's slowness:
``wait_timeout`` is not counted against it. A slow or suspended (Ctrl-Z) rebuild once failed
every turn running beside it (``TimeoutError`` after 30 s, ``turn/end failed``, the work lost);
now the turn goes on when the rebuild ends, and a stop meanwhile leaves it open and
resumable. On SQLite and the EventStoreDB emulator (the views are always a SQLite file)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from terret import RuntimeConfig
from terret.domain.errors import TurnSuspended
from tests.cli.test_rebuild_while_serving import HOLDER
from tests.runtime.conftest import MakeRuntime
from tests.runtime.kit import REPO, names, read_log, turn_in_background

WAIT = RuntimeConfig(wait_timeout=1.0)


def _hold(views: Path) -> subprocess.Popen[str]:
    """Another process in the midst of a rebuild of ``views``: it holds them until killed."""
    script = views.parent / "holder.py"
    script.write_text(HOLDER)
    holder = subprocess.Popen([sys.executable, str(script), str(views)],
                              env={**os.environ, "PYTHONPATH": str(REPO)},
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline() == "holding\n"
    return holder


@pytest.mark.timeout(120)
def test_a_turn_waits_for_a_rebuild_elsewhere_longer_than_wait_timeout_and_completes(
        make_runtime: MakeRuntime, store, tmp_path: Path) -> None:
    views = tmp_path / "views.db"
    rt = make_runtime(config=WAIT, views=str(views))
    sid = rt.create_session()
    assert rt.run_turn(sid, "before").status == "completed"
    holder = _hold(views)
    try:
        job = turn_in_background(rt, sid, "during the rebuild")
        time.sleep(3 * WAIT.wait_timeout)
        assert not job.done  # waiting, not failed after wait_timeout
        assert names(read_log(store, sid)).count("turn/end") == 1
    finally:
        holder.kill()  # the rebuild ends (never committed): the runner goes on
        holder.wait(10)
    assert job.join(30).status == "completed"
    ends = [e.data["status"] for e in read_log(store, sid) if e.name == "turn/end"]
    assert ends == ["completed", "completed"]


@pytest.mark.timeout(120)
def test_a_stop_while_a_turn_waits_for_a_rebuild_elsewhere_leaves_the_turn_resumable(
        make_runtime: MakeRuntime, store, tmp_path: Path) -> None:
    views = tmp_path / "views.db"
    rt = make_runtime(config=WAIT, views=str(views))
    sid = rt.create_session()
    holder = _hold(views)
    try:
        job = turn_in_background(rt, sid, "during the rebuild")
        time.sleep(2 * WAIT.wait_timeout)
        started = time.monotonic()
        rt.close(grace=2.0)  # the turn stops at once; the close's wait for the views, held
        assert time.monotonic() - started < 4  # by someone else's rebuild, within the grace
        with pytest.raises(TurnSuspended):
            job.join(10)
    finally:
        holder.kill()
        holder.wait(10)
    log = names(read_log(store, sid))
    assert "turn/end" not in log and log[-1] == "agent/detached"
    again = make_runtime(views=str(tmp_path / "views2.db"))
    assert again.resumable(sid)
    assert again.resume_turn(sid).status == "completed"


LOCKER = """
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
sys.stdin.read()
"""


@pytest.mark.timeout(120)
def test_views_locked_by_another_process_past_the_busy_timeout_are_waited_out(
        make_runtime: MakeRuntime, store, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Not a rebuild: a command catching the views up, suspended (Ctrl-Z) inside its batch,
    holds the file's write lock. The runner stopped for good at the busy timeout ("database is
    locked", a traceback): serve exited, and every later turn of an embedding app failed until
    it restarted. It waits the lock out now, and the turn goes on once it is let go."""
    from terret.projections import _view_store

    monkeypatch.setattr(_view_store, "BUSY_TIMEOUT_MS", 500)  # the 30 s, shortened
    views = tmp_path / "views.db"
    rt = make_runtime(config=WAIT, views=str(views))
    sid = rt.create_session()
    assert rt.run_turn(sid, "before").status == "completed"
    locker = subprocess.Popen([sys.executable, "-c", LOCKER, str(views)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert locker.stdout is not None and locker.stdout.readline() == "locked\n"
    try:
        job = turn_in_background(rt, sid, "while locked")
        time.sleep(4 * WAIT.wait_timeout)  # past the busy timeout several times over
        assert not job.done and rt.runner.failure is None
    finally:
        locker.kill()
        locker.wait(10)
    assert job.join(30).status == "completed"
    assert rt.run_turn(sid, "after").status == "completed" and rt.runner.failure is None
