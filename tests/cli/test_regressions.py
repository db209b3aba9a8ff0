"""Bugs found while testing the CLI, outside terret/cli (runtime, domain, projections).

Each test states the behaviour a user needs and is marked ``xfail(strict=True)``: when the bug
is fixed the test passes, strict xfail turns that into a failure, and the marker must go.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from terret.adapters.stores.sqlite import SQLiteStore
from terret.cli.demo_app import demo_app
from terret.runtime.runtime import Runtime
from tests.cli.conftest import DEMO_APP, Target


@pytest.mark.xfail(strict=True, reason=(
    "BUG projections: no projection handles session/purged (R27), so a purged session stays in "
    "the views — `sessions list` keeps showing it, and `projections verify`/`doctor` report "
    "the live views differ from a rebuild (exit 1) after every purge"))
def test_purged_session_leaves_the_views(target: Target) -> None:
    sid = target.closed()
    assert str(sid) in [s["id"] for s in target.json("sessions", "list")]
    target.json("sessions", "purge", str(sid))
    assert str(sid) not in [s["id"] for s in target.json("sessions", "list")]
    assert target.invoke("projections", "verify").exit_code == 0


@pytest.mark.xfail(strict=True, reason=(
    "BUG runtime: Runtime.serve_start raises ConfigurationError when ANY open turn belongs to "
    "an agent the app does not define, so `terret serve` exits 1 at start and serves nothing "
    "(two apps sharing a store cannot both serve); it should skip (and log) that session"))
def test_serve_start_skips_sessions_of_unknown_agents(tmp_path: Path) -> None:
    target = Target("sqlite", str(tmp_path / "t.db"), str(tmp_path / "v.db"), tmp_path)
    writer = target.writer()
    stranger = target.new_session(agent="someone-elses-agent")
    writer.execute(stranger, lambda s: s.start_turn(trigger="user", text="hi"))
    parked = target.parked()
    app = demo_app()
    runtime = Runtime(SQLiteStore(target.uri), resolver=app.resolver, views=":memory:",
                      config=app.config, agents=app.agents)
    try:
        resumed = runtime.serve_start()
    finally:
        runtime.close(grace=0)
        target.close()
    assert parked in resumed


@pytest.mark.xfail(strict=True, reason=(
    "BUG domain: Session.title() does not call _require_open(), so `terret title SID TEXT` "
    "appends session/titled to a CLOSED session (SessionClosed: a closed session accepts no "
    "new events; every other command refuses)"))
def test_title_of_a_closed_session_is_refused(target: Target) -> None:
    sid = target.closed()
    before = target.snapshot()
    result = target.invoke("title", str(sid), "renamed after closing")
    assert result.exit_code == 1 and "SessionClosed" in result.stderr
    assert target.snapshot() == before


@pytest.mark.xfail(strict=True, reason=(
    "BUG runtime: the automatic title (R20) and compaction are driven by listeners that only "
    "see turn/end events delivered live after Runtime.start(), and Runtime.close cancels "
    "queued upkeep; a process that ends turn 1 and exits (`terret resume`, or a serve killed "
    "right after turn/end) never titles the session, and no later process does either"))
def test_resume_from_the_cli_titles_the_first_turn(sqlite_target: Target) -> None:
    target = sqlite_target
    sid = target.parked()
    assert target.invoke("approve", str(sid), "call-deploy").exit_code == 0
    assert target.json("resume", str(sid), "--app", DEMO_APP)["status"] == "completed"
    assert "session/titled" in target.types(sid)
