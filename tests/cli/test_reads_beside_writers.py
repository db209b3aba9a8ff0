"""Read commands and ``doctor`` while other processes write to the same store (docs/cli.md:
events appended while a command runs are not "behind the log"; doctor beside a busy serve exits
0; doctor while another process rebuilds the views checks the store only and says so)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from terret.projections._rebuild_lock import RebuildLock
from tests.cli.conftest import Target
from tests.cli.test_rebuild_while_serving import hold_the_views


@contextmanager
def _writing(target: Target) -> Iterator[list[int]]:
    """Sessions keep coming, from this process, while the body runs the CLI in others."""
    stop = threading.Event()
    written = [0]

    def keep_writing() -> None:
        while not stop.is_set():
            sid = target.new_session()
            target.writer().execute(sid, lambda s: s.title("Written meanwhile", automatic=True))
            written[0] += 1

    writer = threading.Thread(target=keep_writing, daemon=True)
    writer.start()
    try:
        yield written
    finally:
        stop.set()
        writer.join(30)


def test_reads_and_doctor_beside_a_writer_are_not_behind(target: Target) -> None:
    target.finished(title="Before")
    with _writing(target) as written:
        for _ in range(3):
            listed = target.run("--json", "sessions", "list", "--limit", "100000")
            assert listed.returncode == 0, listed.stderr
            assert "behind the log" not in listed.stderr, listed.stderr
            assert all("stale" not in row for row in json.loads(listed.stdout))
            doctor = target.run("doctor", timeout=120)
            assert doctor.returncode == 0, doctor.stdout + doctor.stderr
            assert "lags" not in doctor.stdout, doctor.stdout
    assert written[0] > 3, "the writer did not write while the commands ran"
    assert target.run("projections", "verify", timeout=120).returncode == 0


def test_doctor_while_another_process_rebuilds_the_views(target: Target) -> None:
    target.finished(title="Before")
    assert target.run("doctor").returncode == 0  # the views made and current
    holder = hold_the_views(target)
    try:
        target.finished(title="During")
        doctor = target.run("--json", "doctor", timeout=60)
        assert doctor.returncode == 0, doctor.stdout + doctor.stderr
        report = json.loads(doctor.stdout)
        assert report["problems"] == []
        assert any(f"being rebuilt by process {holder.pid} " in c and "not checked" in c
                   for c in report["checks"]), report["checks"]
    finally:
        holder.kill()
        holder.wait(10)
    after = target.run("doctor", timeout=60)  # the rebuild never committed: views as before
    assert after.returncode == 0, after.stdout + after.stderr
    assert "every projection equals a rebuild" in after.stdout


def test_a_rebuild_that_begins_while_a_read_catches_up_is_not_waited_for(
        target: Target, monkeypatch: pytest.MonkeyPatch) -> None:
    """The race the lock's check cannot close: a read (or doctor) found no rebuild, began to
    catch the views up, and a rebuild took the views meanwhile. The read waited for the whole
    rebuild ("waiting for the rebuild by …"); it now shows the views as they were and says a
    rebuild runs, as when the rebuild came first — doctor says it did not check them."""
    before = {str(target.finished(title="Before"))}
    assert {r["id"] for r in target.json("sessions", "list")} == before
    target.finished(title="Behind")  # the views are behind the log now
    holder = hold_the_views(target)
    real = RebuildLock.holder
    checks: list[str | None] = []

    def late(self: RebuildLock) -> str | None:  # the first check ran before the rebuild began
        found = None if not checks else real(self)
        checks.append(found)
        return found

    monkeypatch.setattr(RebuildLock, "holder", late)
    try:
        started = time.monotonic()
        listed = target.invoke("--json", "sessions", "list")
        assert listed.exit_code == 0, listed.stderr
        assert time.monotonic() - started < 10, "the read waited for the rebuild"
        rows = json.loads(listed.stdout)
        assert {r["id"] for r in rows} == before  # as they were before the rebuild began
        assert all(r["stale"]["rebuilding"].startswith(f"process {holder.pid} ") for r in rows)
        assert f"while process {holder.pid} " in listed.stderr, listed.stderr
        assert "waiting for the rebuild" not in listed.stderr

        checks.clear()
        doctor = target.invoke("--json", "doctor")
        assert doctor.exit_code == 0, doctor.stdout + doctor.stderr
        report = json.loads(doctor.stdout)
        assert report["problems"] == [], report
        assert any(f"being rebuilt by process {holder.pid} " in c and "not checked" in c
                   for c in report["checks"]), report["checks"]
    finally:
        holder.kill()
        holder.wait(10)
