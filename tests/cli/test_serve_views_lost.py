"""A `serve` whose views stop following its log (another store's process rebuilt the shared
views file for its own log: `ViewsMismatch`) stopped its projection runner but stayed up, beating
as a live worker that served nothing: the sessions it should take over waited forever. It now
stops — releasing what it holds — and exits 1 with the error, so a supervisor restarts it and
the other live workers serve its sessions meanwhile. On SQLite and on the EventStoreDB emulator
(`--no-group`: a pool member's views are its own, in memory)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from tests.cli.conftest import DEMO_APP, Target, subprocess_env


def test_serve_stops_when_its_views_follow_another_log(target: Target, tmp_path: Path) -> None:
    views = str(tmp_path / "shared-views.db")
    err = tmp_path / "serve.err"
    extra = ["--no-group"] if target.kind == "esdb" else []
    with open(err, "w") as sink:
        server = subprocess.Popen(
            [sys.executable, "-m", "terret", "--store", target.uri, "--views", views, "serve",
             "--app", DEMO_APP, "--grace", "5", *extra],
            cwd=target.cwd, env=subprocess_env(), stdout=subprocess.DEVNULL, stderr=sink)
    try:
        deadline = time.monotonic() + 30
        while "serving " not in err.read_text():
            assert server.poll() is None and time.monotonic() < deadline, err.read_text()
            time.sleep(0.05)
        # Another store's process takes the views file for its own log.
        for args in (["sessions", "new"], ["--views", views, "sessions", "list"]):
            other = subprocess.run(
                [sys.executable, "-m", "terret", "--store", str(tmp_path / "other.db"), *args],
                capture_output=True, text=True, timeout=60, cwd=target.cwd,
                env=subprocess_env())
            assert other.returncode == 0, other.stderr
        # Nothing lands in serve's own log: a quiet store brings no batch to find out at.
        code = server.wait(60)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(10)
    text = err.read_text()
    assert code == 1, text
    (error,) = [line for line in text.splitlines() if line.startswith("Error:")]
    assert error.startswith("Error: ViewsMismatch:"), text
    assert "stopping so that another live worker serves these sessions" in text
    assert "Traceback" not in text
    workers = target.json("workers")
    assert not [w for w in workers if w.get("pid") == server.pid and w.get("live")], workers


def test_serve_stops_when_its_views_file_is_deleted_under_it(target: Target,
                                                             tmp_path: Path) -> None:
    """The views file deleted under a running `serve` and made anew by the next command: serve
    went on writing the deleted file, halted there where no `skip` could reach it, while doctor
    said all was well. It now stops and exits 1, saying why."""
    views = tmp_path / "views.db"
    err = tmp_path / "serve.err"
    extra = ["--no-group"] if target.kind == "esdb" else []
    with open(err, "w") as sink:
        server = subprocess.Popen(
            [sys.executable, "-m", "terret", "--store", target.uri, "--views", str(views),
             "serve", "--app", DEMO_APP, "--grace", "5", *extra],
            cwd=target.cwd, env=subprocess_env(), stdout=subprocess.DEVNULL, stderr=sink)
    try:
        deadline = time.monotonic() + 30
        while "serving " not in err.read_text():
            assert server.poll() is None and time.monotonic() < deadline, err.read_text()
            time.sleep(0.05)
        for suffix in ("", "-wal", "-shm"):
            Path(f"{views}{suffix}").unlink(missing_ok=True)
        listed = subprocess.run(
            [sys.executable, "-m", "terret", "--store", target.uri, "--views", str(views),
             "sessions", "list"], capture_output=True, text=True, timeout=60, cwd=target.cwd,
            env=subprocess_env())
        assert listed.returncode == 0, listed.stderr
        code = server.wait(60)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(10)
    text = err.read_text()
    assert code == 1, text
    (error,) = [line for line in text.splitlines() if line.startswith("Error:")]
    assert error.startswith("Error: ViewsMismatch:") and "deleted or replaced" in error, text
    assert "Traceback" not in text
