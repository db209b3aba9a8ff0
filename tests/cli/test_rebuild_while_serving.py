"""``terret projections rebuild`` (and ``skip``) while ``terret serve`` keeps the same views file
current in another process, and sessions keep coming (docs/projections.md: a rebuild is safe
while a runner is live, in this process or another).

A rebuild replays in one write transaction of the views file: a runner elsewhere waits for it
rather than applying a batch between two of its pages (its tracked position then jumped past
the pages still to come, and those sessions were lost from the views), and nobody sees the
tables emptied or half rebuilt."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from uuid import UUID

import pytest

from tests.cli.conftest import DEMO_APP, Target, subprocess_env
from tests.cli.test_cross_process import Proc
from tests.cli.test_extensions_cli import MARK_WRITER, MARKS, _marked


def _serve_on_the_views(target: Target, *extensions: str) -> Proc:
    """``terret serve`` keeping ``target.views`` current: on EventStoreDB, out of the pool
    (``--no-group``; a pool member keeps views of its own, in memory)."""
    pool = ("--no-group",) if target.kind == "esdb" else ()
    serve = Proc.start(target, *extensions, "serve", "--app", DEMO_APP, "--grace", "2", *pool)
    serve.wait_line(lambda line: line.startswith("serving "), "serving line")
    return serve


def _finished_sessions(target: Target, count: int) -> list[UUID]:
    return [target.finished(title=f"Seeded {i}") for i in range(count)]


def _listed(target: Target) -> set[str]:
    done = target.run("--json", "sessions", "list", "--limit", "100000")
    assert done.returncode == 0, done.stderr
    return {row["id"] for row in json.loads(done.stdout)}


@pytest.mark.timeout(300)
def test_rebuild_while_serve_follows_the_same_views_loses_nothing(target: Target) -> None:
    made = _finished_sessions(target, 60)
    serve = _serve_on_the_views(target)
    stop = threading.Event()

    def keep_writing() -> None:  # sessions keep coming while the rebuilds run
        while not stop.is_set():
            sid = target.new_session()  # no turn: nothing for serve to run
            target.writer().execute(sid, lambda s: s.title("Written meanwhile", automatic=True))
            made.append(sid)

    writer = threading.Thread(target=keep_writing, daemon=True)
    writer.start()
    try:
        for _ in range(3):
            done = target.run("projections", "rebuild", timeout=120)
            assert done.returncode == 0, done.stderr
            assert "HALTED" not in done.stdout + done.stderr
    finally:
        stop.set()
        writer.join(30)
    assert len(made) > 60  # written during the rebuilds too
    listed = _listed(target)
    missing = {str(sid) for sid in made} - listed
    assert not missing, f"{len(missing)} of {len(made)} sessions missing from the views"
    verified = target.run("projections", "verify", timeout=120)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    status = json.loads(target.run("--json", "projections", "status").stdout)
    assert all(row["halted"] is None for row in status), status
    serve.popen.send_signal(signal.SIGTERM)
    code, _, err = serve.finish(30)
    assert code == 0, err
    assert "halted" not in err.lower() and "Traceback" not in err, err


MARK_LOOP = '''
import pathlib, sys, time
from uuid import UUID
from terret import open_store
from terret.domain import encode, session_stream
from acme_marks import Marked

store = open_store(sys.argv[1])
stream = session_stream(UUID(sys.argv[2]))
count = 0
while not pathlib.Path("stop").exists():
    store.append(stream, [encode(Marked(url=f"https://example.org/{count}"))],
                 store.stream_version(stream))
    count += 1
    time.sleep(0.005)
print(count)
store.close()
'''


@pytest.mark.timeout(300)
def test_skip_while_serve_follows_the_same_views_loses_nothing(target: Target) -> None:
    """The skip's replay of what followed the skipped event and serve's next batch: the
    batch went first, moved the resumed projection past the replay, and marks were lost."""
    (target.cwd / "acme_marks.py").write_text(MARKS)
    (target.cwd / "write_mark.py").write_text(MARK_WRITER)
    (target.cwd / "mark_loop.py").write_text(MARK_LOOP)
    ext = ("--extensions", "acme_marks")
    sid = target.new_session()
    serve = _serve_on_the_views(target, *ext)
    bad = _marked(target, sid, "https://example.org/bad")
    serve.wait_line(lambda line: f"acme.marks halted at {bad}" in line, "the halt")
    loop = subprocess.Popen([sys.executable, "mark_loop.py", target.uri, str(sid)],
                            cwd=target.cwd, env=subprocess_env(), stdout=subprocess.PIPE,
                            text=True)
    try:
        time.sleep(1.0)  # marks pile up behind the halt
        skipped = target.run(*ext, "projections", "skip", "acme.marks")
        assert skipped.returncode == 0, skipped.stderr
        time.sleep(1.0)  # and keep coming after the skip
    finally:
        (target.cwd / "stop").write_text("")
        out, _ = loop.communicate(timeout=30)
    written = int(out)
    assert written > 10
    assert target.run(*ext, "sessions", "list").returncode == 0  # catches the views up
    with sqlite3.connect(target.views) as db:
        urls = {row[0] for row in db.execute("SELECT url FROM acme_marks")}
    assert urls == {f"https://example.org/{n}" for n in range(written)}
    serve.popen.send_signal(signal.SIGTERM)
    code, _, err = serve.finish(30)
    assert code == 0, err


HOLDER = '''
import sys
from terret.projections.base import ViewStore
from terret.projections.registry import serving_projections

views = ViewStore(sys.argv[1])
with views.exclusive() as db:
    for projection in serving_projections():
        views.forget(db, projection)
    print("holding", flush=True)
    sys.stdin.readline()  # a long rebuild: until told to go on (or killed)
    raise SystemExit(3)  # never commits
'''


def hold_the_views(target: Target) -> subprocess.Popen[str]:
    """Another process in the midst of a rebuild of ``target.views`` (``HOLDER``): it holds
    the rebuild lock and the write transaction until killed, and never commits."""
    (target.cwd / "holder.py").write_text(HOLDER)
    holder = subprocess.Popen([sys.executable, "holder.py", target.views], cwd=target.cwd,
                              env=subprocess_env(), stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline() == "holding\n"
    return holder


def test_reads_during_a_rebuild_elsewhere_show_the_views_as_they_were(target: Target) -> None:
    """While another process rebuilds the views (here: one that emptied them in its
    transaction and waits), a read command neither waits for it nor shows the half-done
    views: it shows what they held before, saying a rebuild is running when they are behind;
    a second rebuild is refused (ViewsBusy); a rebuild killed midway changes nothing."""
    before = {str(target.finished(title=f"Before {i}")) for i in range(3)}
    assert {r["id"] for r in target.json("sessions", "list")} == before
    holder = hold_the_views(target)
    try:
        started = time.monotonic()
        listed = target.run("--json", "sessions", "list")
        assert listed.returncode == 0, listed.stderr
        assert {r["id"] for r in json.loads(listed.stdout)} == before
        assert listed.stderr == ""  # the views were at the head: nothing to warn of
        later = str(target.finished(title="Written during the rebuild"))
        behind = target.run("--json", "sessions", "list")
        assert behind.returncode == 0, behind.stderr
        assert {r["id"] for r in json.loads(behind.stdout)} == before  # not caught up
        assert f"while process {holder.pid} " in behind.stderr, behind.stderr
        assert all(r["stale"]["rebuilding"].startswith(f"process {holder.pid} ")
                   for r in json.loads(behind.stdout))
        assert time.monotonic() - started < 20  # SQLite's busy wait is 30 s a statement
        status = target.run("--json", "projections", "status")  # its lag is the rebuild's
        assert status.returncode == 0, status.stderr
        assert f"process {holder.pid} " in status.stderr and "rebuilding" in status.stderr
        assert all(row["rebuilding"].startswith(f"process {holder.pid} ")
                   for row in json.loads(status.stdout))

        second = target.run("projections", "rebuild")
        assert second.returncode == 1
        assert "Traceback" not in second.stderr
        assert second.stderr.splitlines() == [  # said at once: no progress bar first
            line for line in second.stderr.splitlines() if line.startswith("Error: ViewsBusy:")]
        assert second.stderr.startswith(
            f"Error: ViewsBusy: process {holder.pid} (since "), second.stderr
    finally:
        holder.kill()  # midway: its transaction never commits
        holder.wait(10)
    listed = target.run("--json", "sessions", "list")  # caught up again, nothing lost
    assert listed.returncode == 0 and listed.stderr == "", listed.stderr
    assert {r["id"] for r in json.loads(listed.stdout)} == before | {later}
    assert target.run("projections", "verify").returncode == 0


def test_serve_waits_for_a_rebuild_elsewhere_and_stops_without_waiting_for_its_end(
        sqlite_target: Target) -> None:
    """serve's runner meets the views locked by a rebuild in another process: it waits (no
    error after SQLite's 30 s busy timeout, no halt), catches up once the rebuild ends, and a
    SIGTERM meanwhile stops serve at once instead of waiting for someone else's rebuild."""
    target = sqlite_target
    target.finished(title="Before")
    serve = _serve_on_the_views(target)
    holder = hold_the_views(target)
    try:
        target.finished(title="During")  # serve's runner has this to apply: it waits
        serve.wait_line(lambda line: f"waiting for the rebuild by process {holder.pid}" in line,
                        "the runner waiting")
        time.sleep(1.0)
    finally:
        holder.kill()  # never commits: the views are as they were, serve goes on
        holder.wait(10)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with sqlite3.connect(target.views) as db:
            titles = {row[0] for row in db.execute("SELECT title FROM titles")}
        if "During" in titles:
            break
        time.sleep(0.1)
    assert titles == {"Before", "During"}, titles  # serve applied it once the lock was gone

    holder = hold_the_views(target)
    try:
        target.finished(title="While stopping")
        serve.wait_line(lambda line: line.count("waiting for the rebuild by") == 1 and
                        f"process {holder.pid}" in line, "the runner waiting again")
        started = time.monotonic()
        serve.popen.send_signal(signal.SIGTERM)
        code, _, err = serve.finish(30)
        assert time.monotonic() - started < 15, "serve waited for someone else's rebuild"
    finally:
        holder.kill()
        holder.wait(10)
    assert code == 0, err
    assert "Traceback" not in err and "halted" not in err, err
