"""Regressions: bugs the CLI tests found outside terret/cli (runtime, domain, projections),
first committed here as strict xfails and fixed in 3f1bc71. Each test states the behaviour a
user needs."""

from __future__ import annotations

from pathlib import Path

from terret.adapters.stores.sqlite import SQLiteStore
from terret.cli.demo_app import demo_app
from terret.runtime.runtime import Runtime
from tests.cli.conftest import DEMO_APP, Target, is_type


def test_purged_session_leaves_the_views(target: Target) -> None:
    """A purged session leaves the views: `sessions list` forgets it and the live views
    still equal a rebuild (no projection handled session/purged)."""
    sid = target.closed()
    assert str(sid) in [s["id"] for s in target.json("sessions", "list")]
    target.json("sessions", "purge", str(sid))
    assert str(sid) not in [s["id"] for s in target.json("sessions", "list")]
    assert target.invoke("projections", "verify").exit_code == 0


def test_serve_start_skips_sessions_of_unknown_agents(tmp_path: Path) -> None:
    """`serve` starts and serves its own sessions when an open turn belongs to an agent it
    does not define (serve_start raised ConfigurationError and served nothing)."""
    target = Target("sqlite", str(tmp_path / "t.db"), str(tmp_path / "v.db"), tmp_path)
    writer = target.writer()
    stranger = target.new_session(agent="someone-elses-agent")
    writer.execute(stranger, lambda s: s.start_turn(trigger="user", text="hi"))
    own = target.new_session()
    writer.execute(own, lambda s: s.start_turn(trigger="user", text="status please"))
    parked = target.parked()  # waits on its verdict: no worker before it
    app = demo_app()
    runtime = Runtime(SQLiteStore(target.uri), resolver=app.resolver, views=":memory:",
                      config=app.config, agents=app.agents)
    try:
        resumed = runtime.serve_start()
        # The resumed turn runs to its end here: left running past the close, its thread
        # (and what it holds) would outlive the test.
        target.wait_for(own, is_type("turn/end"), "the resumed turn to end")
    finally:
        runtime.close(grace=5)
        target.close()
    assert own in resumed and parked not in resumed


def test_title_of_a_closed_session_is_refused(target: Target) -> None:
    """A closed session refuses a title like every other new event (Session.title did not
    require an open session)."""
    sid = target.closed()
    before = target.snapshot()
    result = target.invoke("title", str(sid), "renamed after closing")
    assert result.exit_code == 1 and "SessionClosed" in result.stderr
    assert target.snapshot() == before


def test_resume_from_the_cli_titles_the_first_turn(sqlite_target: Target) -> None:
    """A process that ends turn 1 and exits still titles the session (R20): upkeep was
    driven by listeners a short-lived process never ran, and close cancelled it."""
    target = sqlite_target
    sid = target.parked()
    assert target.invoke("approve", str(sid), "call-deploy").exit_code == 0
    assert target.json("resume", str(sid), "--app", DEMO_APP)["status"] == "completed"
    assert "session/titled" in target.types(sid)


def test_serve_wakes_more_than_two_parked_sessions(sqlite_target: Target) -> None:
    """A serving process wakes a third session while two are parked on approvals (woken
    turns ran on the 2-worker upkeep pool and held it while parked)."""
    target = sqlite_target
    sessions = [target.new_session() for _ in range(3)]
    app = demo_app()
    runtime = Runtime(SQLiteStore(target.uri), resolver=app.resolver, views=":memory:",
                      config=app.config, agents=app.agents)
    try:
        runtime.serve_start()
        for sid in sessions:
            assert target.invoke("inject", str(sid), "deploy v2 please", "--wake").exit_code == 0
        for sid in sessions:
            target.wait_for(sid, lambda e: e.wire_name == "approval/requested",
                            "a parked deploy", timeout=5)
    finally:
        runtime.close(grace=0)


def test_a_group_without_its_command_is_a_usage_error_said_as_every_error(
        sqlite_target: Target) -> None:
    """`terret --json budget` printed the group's help and exited 2, nothing on stdout and no
    `Error:` line: a script could not tell it apart. Now as `terret --json` alone."""
    import json

    for args in (["--json", "budget"], ["sessions", "--json"], ["in-doubt"]):
        done = sqlite_target.run(*args)
        assert done.returncode == 2, args
        assert done.stderr.rstrip().splitlines()[-1] == "Error: UsageError: Missing command."
        assert "Commands:" in done.stderr  # the group's help, above the line
        if "--json" in args:
            assert json.loads(done.stdout) == {"error": {
                "exit_code": 2, "message": "Missing command.", "type": "UsageError"}}
        else:
            assert done.stdout == ""


def test_log_errors_are_one_json_line_before_the_first_event_too(
        sqlite_target: Target) -> None:
    """`log --json` is JSON Lines: an error after some lines was one more line, but one before
    the first (a missing session, a malformed id) an indented document of seven."""
    import json

    sqlite_target.finished()
    for args, kind in ((["log", "00000000-0000-4000-8000-000000000000"], "SessionNotFound"),
                       (["log", "x"], "BadParameter")):
        done = sqlite_target.run("--json", *args)
        assert done.returncode in (1, 2), done.stderr
        (line,) = done.stdout.splitlines()
        assert json.loads(line)["error"]["type"] == kind


NOTES = '''
from uuid import UUID

from terret.projections import Projection, register_projection


@register_projection
class NotesProjection(Projection):
    """Keys sessions by their id in three forms, none of them the stream name."""

    name = "acme.notes"
    handles = frozenset({"turn/start"})
    tables = ("acme_by_text", "acme_by_hex", "acme_by_bytes")
    schema = """
    CREATE TABLE IF NOT EXISTS acme_by_text (session TEXT, seq INTEGER);
    CREATE TABLE IF NOT EXISTS acme_by_hex (session TEXT, seq INTEGER);
    CREATE TABLE IF NOT EXISTS acme_by_bytes (session BLOB, seq INTEGER);
    """

    def process(self, db, event):
        sid = UUID(event.stream.removeprefix("session-"))
        db.execute("INSERT INTO acme_by_text VALUES (?, ?)", (str(sid), event.seq))
        db.execute("INSERT INTO acme_by_hex VALUES (?, ?)", (sid.hex, event.seq))
        db.execute("INSERT INTO acme_by_bytes VALUES (?, ?)", (sid.bytes, event.seq))
'''


def test_a_purge_forgets_a_session_in_a_custom_view_whatever_form_of_its_id_it_keeps(
        target: Target) -> None:
    """docs/projections.md: a purged session is forgotten by every projection, from its tables
    with a `session` column. A custom view keying sessions by the UUID's text (not the stream
    name) kept its rows after the purge — a customer's data said to be erased — and `verify`
    failed ever after."""
    import sqlite3

    (target.cwd / "acme_notes.py").write_text(NOTES)
    ext = ("--extensions", "acme_notes")
    gone, kept = target.finished(), target.finished()
    assert target.run(*ext, "sessions", "list").returncode == 0  # the view holds both
    assert target.run(*ext, "sessions", "close", str(gone)).returncode == 0
    purged = target.run(*ext, "sessions", "purge", str(gone), "--yes")  # another process
    assert purged.returncode == 0, purged.stderr
    assert target.run(*ext, "sessions", "list").returncode == 0
    db = sqlite3.connect(target.views)
    try:
        for table, form in (("acme_by_text", str), ("acme_by_hex", lambda u: u.hex),
                            ("acme_by_bytes", lambda u: u.bytes)):
            held = {row[0] for row in db.execute(f"SELECT session FROM {table}")}
            assert held == {form(kept)}, table
    finally:
        db.close()
    verify = target.run(*ext, "projections", "verify", "acme.notes")
    assert verify.returncode == 0, verify.stdout + verify.stderr
