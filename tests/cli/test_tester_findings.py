"""What an outside tester found following docs/cli.md, each held to what the page says: a
negative budget refused for its amount, an unknown chat agent a usage error, views behind the
log said in the documented `warning:` line only, error messages naming their parameter, the
default app's environment checked when it is built, a views file that is the store's own
refused, and help text in step with the page."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from uuid import UUID, uuid4

from terret.domain.events import ToolCallData
from terret.domain.store import NewRecord, session_stream
from tests.cli.conftest import DEMO_APP, DEPLOY_ARGS, Target, one_line_error, subprocess_env

# --- `budget set SID -1` ------------------------------------------------------------------


def test_a_negative_budget_is_refused_for_its_amount(target: Target) -> None:
    """`-1` reaches the LIMIT type (not `No such option '-1'`); misspelt options are still
    click's `NoSuchOption`, and `-1` as an option's value is that value."""
    sid = str(target.finished())
    before = target.snapshot()
    for args in (["-1"], ["--", "-1"], ["-0.5"], ["-$5"], ["-inf"]):
        result = target.invoke("budget", "set", sid, *args)
        assert result.exit_code == 2, (args, result.stderr)
        line = one_line_error(result.stderr)
        assert "Invalid value for 'LIMIT'" in line, line
        assert "a budget is a finite amount of 0 or more" in line, line
        assert "budget set [OPTIONS] SESSION_ID LIMIT" in result.stderr  # the usage hint
    for args, option in ((["-1", "--reasn", "x"], "--reasn"), (["5", "--bogus"], "--bogus"),
                         (["--bogus"], "--bogus"), (["5", "-x"], "-x")):
        result = target.invoke("budget", "set", sid, *args)
        assert result.exit_code == 2, (args, result.stderr)
        assert f"NoSuchOption: No such option '{option}'" in one_line_error(result.stderr)
    assert target.snapshot() == before
    assert target.json("budget", "set", sid, "$5", "--reason", "-1") == {
        "budget": 5.0, "session": sid}
    set_event = target.events(UUID(sid))[-1]
    assert set_event.wire_name == "budget/set" and set_event.payload.reason == "-1"


# --- `chat --agent nosuch` ------------------------------------------------------------------


def test_chat_with_an_agent_the_app_does_not_define_is_a_usage_error(target: Target) -> None:
    before = target.snapshot()
    for app in ([], ["--app", DEMO_APP]):
        result = target.invoke("chat", "--agent", "nosuch", *app, input="")
        assert result.exit_code == 2, (app, result.stderr)
        line = one_line_error(result.stderr)
        assert "Invalid value for '--agent'" in line and "'nosuch'" in line, line
        assert ("demo" if app else "default") in line.partition("the app's agents: ")[2]
        assert "chat [OPTIONS] [SESSION_ID]" in result.stderr  # click's usage hint
    assert target.snapshot() == before
    # The agent it defines starts a session.
    done = target.invoke("chat", "--agent", "demo", "--app", DEMO_APP, input="/quit\n")
    assert done.exit_code == 0, done.stderr


# --- stderr: the documented `warning:` lines, the raw log only with -v ----------------------


def _break_the_log(target: Target) -> UUID:
    """A session whose log holds an event no projection that reads it can decode: they halt
    there (a new session, so what the command lists is otherwise fine)."""
    sid = target.new_session()
    stream = session_stream(sid)
    target.store().append(stream, [NewRecord(uuid4(), "turn/start", b"{not json")],
                          target.store().stream_version(stream))
    return sid


def _stderr_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip()]


def test_a_halt_is_said_in_one_warning_line_and_logged_only_with_v(target: Target) -> None:
    """The command that meets the halt first (real processes: logging reaches stderr) prints
    the documented line alone — not the projections' log records, once per projection."""
    target.finished()
    _break_the_log(target)
    first = target.run("sessions", "list")
    assert first.returncode == 0, first.stderr
    lines = _stderr_lines(first.stderr)
    assert len(lines) == 1, first.stderr
    assert lines[0].startswith("warning: what follows is behind the log"), lines
    again = target.run("sessions", "list")
    assert _stderr_lines(again.stderr) == lines  # the same line, every time
    # With -v, the records as they are, from views rebuilt (the halt happens again).
    Path(target.views).unlink()
    verbose = target.run("-v", "sessions", "list")
    assert verbose.returncode == 0, verbose.stderr
    assert "terret.projections projection sessions halted at" in verbose.stderr
    assert sum(line.startswith("warning: what follows") for line in
               _stderr_lines(verbose.stderr)) == 1


def test_views_of_another_log_are_said_in_one_warning_line(target: Target,
                                                            tmp_path: Path) -> None:
    """Views built from another store: rebuilt, with one `warning:` line (no time, no logger)."""
    def other(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "terret", "--store",
                               str(tmp_path / "other.db"), *args], capture_output=True,
                              text=True, timeout=60, cwd=target.cwd, env=subprocess_env())

    target.finished()
    made = target.run("sessions", "list")  # the views know this store
    assert made.returncode == 0 and other("sessions", "new").returncode == 0, made.stderr
    elsewhere = other("--views", target.views, "sessions", "list")
    assert elsewhere.returncode == 0, elsewhere.stderr
    lines = _stderr_lines(elsewhere.stderr)
    assert len(lines) == 1, elsewhere.stderr
    assert lines[0].startswith("warning: the views in "), lines
    assert "were not built from the log of" in lines[0] and "rebuilding them" in lines[0]
    back = target.run("sessions", "list")  # and back: rebuilt from this store's log
    assert [line for line in _stderr_lines(back.stderr)
            if not line.startswith("warning: the views in ")] == [], back.stderr


# --- views behind the log, and an empty list --------------------------------------------------


def test_an_empty_list_behind_the_log_keeps_its_shape_and_says_so_on_stderr(
        target: Target) -> None:
    """`approvals list` with the approvals and status views halted and nothing to list: `[]`
    (the documented shape) and the warning naming both views it read; with something to list,
    each item's `stale` names both too. `projections status` tells a script the same."""
    _break_the_log(target)
    empty = target.invoke("--json", "approvals", "list")
    assert empty.exit_code == 0, empty.stderr
    assert json.loads(empty.stdout) == []
    lines = _stderr_lines(empty.stderr)
    assert len(lines) == 1 and lines[0].startswith("warning: what follows is behind"), lines
    assert "approvals halted at position" in lines[0] and "status halted at" in lines[0]
    halted = {s["name"] for s in target.json("projections", "status") if s["halted"]}
    assert {"approvals", "status"} <= halted
    target.parked()  # after the break: the halted views do not show it
    listed = target.json("approvals", "list")
    assert listed == []
    for command in (["budget", "list"], ["approvals", "list", str(target.parked())]):
        result = target.invoke("--json", *command)
        assert result.exit_code == 0 and json.loads(result.stdout) == [], result.stderr
        assert "status halted at" in _stderr_lines(result.stderr)[0]


def test_stale_items_name_every_view_the_command_read(target: Target) -> None:
    target.parked()
    assert target.json("approvals", "list")  # listed before the break
    _break_the_log(target)
    items = target.json("approvals", "list")
    assert items and all({"approvals", "status"} <= set(i["stale"]["projections"])
                         for i in items), items


# --- error messages name their parameter as click does: `Invalid value for '<param>'` ------


def test_an_ambiguous_call_id_prefix_names_its_parameter_quoted(target: Target) -> None:
    writer = target.writer()
    sid = target.new_session()
    calls = [ToolCallData(id=f"call-deploy-{n}", name="deploy", args=DEPLOY_ARGS) for n in (1, 2)]
    writer.execute(sid, lambda s: s.start_turn(trigger="user", text="deploy twice"))
    writer.execute(sid, lambda s: s.start_step("demo:ops-model-1"))
    writer.execute(sid, lambda s: s.record_assistant("", calls))
    for call in calls:
        writer.execute(sid, lambda s, c=call: s.request_approval(c.id, c.name, c.args))
    before = target.snapshot()
    for command in (["approve", str(sid), "call-d"], ["deny", str(sid), "call-d", "--reason", "x"]):
        result = target.invoke(*command)
        assert result.exit_code == 2, result.stderr
        line = one_line_error(result.stderr)
        assert "Invalid value for 'CALL_ID': 'call-d' is ambiguous" in line, line
    assert target.snapshot() == before
