"""``terret demo`` (the whole lifecycle, with a SIGKILL) and ``terret chat`` (interactive)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from uuid import UUID

from terret.adapters.stores.sqlite import SQLiteStore
from terret.domain.events import (
    ApprovalResolved,
    ToolResult,
    TurnEnded,
    UsageData,
    UserMessage,
)
from terret.runtime.commands import SessionCommands
from tests.cli.conftest import (
    DEMO_APP,
    MISSING,
    Target,
    invoke_cli,
    one_line_error,
    subprocess_env,
)


def test_demo_leaves_a_file_that_is_not_a_terret_store_untouched(tmp_path: Path) -> None:
    import sqlite3

    text, other = tmp_path / "notes.db", tmp_path / "app.db"
    text.write_text("not a database")
    with sqlite3.connect(other) as db:
        db.execute("CREATE TABLE users (name TEXT)")
    for path in (text, other):
        before = path.read_bytes()
        result = invoke_cli("demo", "--path", str(path), "--timeout", "30")
        assert result.exit_code == 1
        assert "Error: NotATerretStore:" in result.output and "left untouched" in result.output
        assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["app.db", "notes.db"]
    assert invoke_cli("demo", "--path", "", "--timeout", "30").exit_code == 2


def test_demo(tmp_path: Path) -> None:
    path = tmp_path / "demo.db"
    older = SQLiteStore(path)  # an older Terret store is replaced
    SessionCommands.on(older).create(agent="demo", roles={"main": "demo:ops-model-1"})
    older.close()
    result = invoke_cli("demo", "--path", str(path), "--timeout", "30")
    assert result.exit_code == 0, result.output
    out = result.stdout
    for stage in ("parked on approval call-deploy", "is gone; the parked approval is still",
                  "the parked call ran, the turn resumed and completed", "compacted:",
                  "Done in"):
        assert stage in out, stage
    assert_narrated_in_order(out)

    target = Target("sqlite", str(path), str(tmp_path / "check-views.db"), tmp_path)
    try:
        (session,) = target.json("sessions", "list")
        sid = session["id"]
        assert session["title"] == "Check the checkout service and deploy v2"
        types = target.types(session["id"])
        assert types.count("turn/start") == 2 and types.count("approval/requested") == 1
        assert types.count("agent/attached") == 2  # the SIGKILLed process and its successor
        assert "session/compacted" in types
        ends = [e.payload for e in target.events(session["id"]) if e.wire_name == "turn/end"]
        assert [e.status for e in ends if isinstance(e, TurnEnded)] == [
            "completed", "completed"]
        assert target.invoke("projections", "verify").exit_code == 0
        resolved = target.invoke("--json", "log", sid, "--type", "approval/resolved")
        (verdict,) = [json.loads(line) for line in resolved.stdout.splitlines()]
        assert verdict["data"]["verdict"] == "approved"
        assert verdict["data"]["reason"] == "change window open"
    finally:
        target.close()


def assert_narrated_in_order(out: str) -> None:
    """Each stage's lines sit under its heading, a command's output before the serving
    process's reaction to it, and each serving process's lines only while it runs."""
    stages: dict[str, list[str]] = {}
    heading = ""
    for line in out.splitlines():
        if line.startswith("▶ "):
            heading = line[2:]
            stages[heading] = []
        elif heading:
            stages[heading].append(line.strip())

    def stage(prefix: str) -> list[str]:
        (found,) = [lines for name, lines in stages.items() if name.startswith(prefix)]
        return found

    def index(lines: list[str], needle: str) -> int:
        found = [i for i, line in enumerate(lines) if needle in line]
        assert found, (needle, lines)
        return found[0]

    started = stage("A session starts")
    assert started[0].startswith("$ terret --store ") and " sessions new " in started[0], started
    serving = [int(line.split("]")[0].split()[1]) for lines in stages.values()
               for line in lines if line.startswith("[serve ")]
    first, second = serving[0], serving[-1]
    assert first != second
    wake = stage("An operator asks for a deploy")
    assert index(wake, "queued ") < index(wake, "turn 1 started") < index(wake, "parked on an")
    assert index(wake, "parked on an") < index(wake, "deploy is mutating")
    assert not [line for line in stage("The serving process is killed") if "[serve" in line]
    restart = stage("A new serving process starts")
    assert all(f"[serve {second}]" in line for line in restart if "[serve" in line)
    assert not [line for line in restart  # nothing claimed: the turn waits on its verdict
                if "[serve" in line and ("turn 1" in line or "parked on" in line)]
    approve = stage("The approval is given")
    assert index(approve, "approved call-deploy") < index(approve, "turn 1 resumed")
    assert index(approve, "turn 1 resumed") < index(approve, "turn 1 ended completed")
    assert index(approve, "turn 1 ended completed") < index(approve, "the parked call ran")
    second_turn = stage("A second turn passes")
    assert (index(second_turn, "queued ") < index(second_turn, "turn 2 started")
            < index(second_turn, "compacted up to") < index(second_turn, "compacted: the model"))
    stop = stage("The serving process stops gracefully")
    assert index(stop, "received SIGTERM") < index(stop, f"[serve {second}] stopped")
    for name, lines in stages.items():
        if not (name.startswith("A serving process") or name.startswith("An operator")):
            assert not [line for line in lines if f"[serve {first}]" in line], (name, lines)


def test_demo_narration_is_in_order_every_time(tmp_path: Path) -> None:
    for run in range(2):
        result = invoke_cli("demo", "--path", str(tmp_path / f"demo{run}.db"))
        assert result.exit_code == 0, result.output
        assert_narrated_in_order(result.stdout)


def test_demo_bad_path(tmp_path: Path) -> None:
    result = invoke_cli("demo", "--path", str(tmp_path / "no" / "such" / "dir.db"))
    assert result.exit_code == 1
    line = one_line_error(result.stderr)
    assert line.startswith("Error: StoreUnavailable: the SQLite store") and "dir.db" in line
    assert list(tmp_path.iterdir()) == []


def test_chat_new_session_echo(target: Target) -> None:
    result = target.invoke("chat", input="hello there\n/quit\n")
    assert result.exit_code == 0, result.stderr
    first = result.stdout.splitlines()[0]
    assert first.startswith("session ")
    sid = first.split()[1]
    assert "(echo) hello there" in result.stdout
    assert f"resume with: terret chat {sid}" in result.stdout
    types = target.types(UUID(sid))
    assert types.count("turn/start") == 1 and "turn/end" in types


def test_chat_log_takes_a_count_from_one(target: Target) -> None:
    """`/log abc`, `/log -3` and `/log 0` said nothing of why they showed 10 events or none."""
    result = target.invoke("chat", input="hi\n/log abc\n/log 0\n/log -3\n/log \u00b2\n"
                           "/log 99999999999999999999999\n/log 2\n/quit\n")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.count("usage: /log [N]") == 5, result.stdout
    shown = result.stdout.split("/log 2", 1)[1].split("/quit", 1)[0]
    assert len([line for line in shown.splitlines() if line.strip()[:1].isdigit()]) == 2, shown


def test_chat_approves_and_denies(target: Target) -> None:
    result = target.invoke("chat", "--app", DEMO_APP,
                           input="Check the checkout service and deploy v2\ny\n"
                                 "deploy again\nn\nnot twice\n/quit\n")
    assert result.exit_code == 0, result.stderr
    assert "approve deploy(" in result.stdout
    assert "Done: checkout v2 rolled out to 3/3 instances." in result.stdout
    sid = UUID(result.stdout.splitlines()[0].split()[1])
    deploys = [e.payload for e in target.events(sid)
               if isinstance(e.payload, ToolResult) and e.payload.name == "deploy"]
    assert [d.is_error for d in deploys] == [False, True]
    assert "denied by operator: not twice" in deploys[1].content


def test_an_approval_question_takes_only_a_verdict(target: Target) -> None:
    """docs/cli.md: lines starting with ``/`` never reach the model. At the y/N question any
    line but y/n denied — ``/approve`` included — and the next line, ``/usage`` too, became the
    reason the model read. Now anything else is asked again, ``/approve``/``/deny`` answer it,
    and a reason is never a /command."""
    result = target.invoke("chat", "--app", DEMO_APP,
                           input="Check the checkout service and deploy v2\n"
                                 "deploy again\n/usage\n/approve\n"
                                 "deploy again\n/deny\n/log\nnot twice\n/quit\n")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.count("answer y or n") == 2
    assert "a /command is not a reason" in result.stdout
    sid = UUID(result.stdout.splitlines()[0].split()[1])
    events = target.events(sid)
    resolved = [e.payload for e in events if isinstance(e.payload, ApprovalResolved)]
    assert [(r.verdict, r.reason) for r in resolved] == [("approved", None),
                                                         ("denied", "not twice")]
    said = [e.payload.text for e in events if isinstance(e.payload, UserMessage)]
    assert said == ["Check the checkout service and deploy v2", "deploy again"]


def test_the_approval_question_takes_approve_and_deny_naming_the_call(target: Target) -> None:
    """docs/cli.md: ``/approve [CALL]`` and ``/deny CALL REASON`` (a prefix will do). At the
    question they were refused ("answer y or n") unless bare; now a CALL naming the call asked
    about answers it, with the denial's reason, and another call's id is asked again."""
    result = target.invoke("chat", "--app", DEMO_APP,
                           input="Check the checkout service and deploy v2\n"
                                 "/approve call-nope\n/approve call-d\n"
                                 "deploy again\n/deny call-deploy too risky today\n/quit\n")
    assert result.exit_code == 0, result.stderr
    assert "not call-nope" in result.stdout
    assert "answer y or n" not in result.stdout
    sid = UUID(result.stdout.splitlines()[0].split()[1])
    resolved = [e.payload for e in target.events(sid) if isinstance(e.payload, ApprovalResolved)]
    assert [(r.verdict, r.reason) for r in resolved] == [("approved", None),
                                                         ("denied", "too risky today")]


def test_chat_resumes_an_open_turn(target: Target) -> None:
    sid = target.parked()
    result = target.invoke("chat", str(sid), "--app", DEMO_APP, input="y\n/quit\n")
    assert result.exit_code == 0, result.stderr
    assert "resuming the open turn" in result.stdout
    assert "rolled out to 3/3 instances" in result.stdout
    assert target.types(sid).count("turn/start") == 1


def test_chat_bad_input(target: Target) -> None:
    before = target.snapshot()
    cases: list[tuple[list[str], int, str]] = [
        (["chat", MISSING], 1, "SessionNotFound"),
        (["chat", "not-a-uuid"], 2, "is not a session id"),
        (["chat", "--app", "no.such:app"], 2, "--app"),
        (["chat", "--agent", "nobody", "--app", DEMO_APP], 2, "Invalid value for '--agent'"),
    ]
    for args, code, needle in cases:
        result = target.invoke(*args, input="hi\n/quit\n")
        assert result.exit_code == code, (args, result.stderr)
        assert needle in one_line_error(result.stderr)
    assert target.snapshot() == before


def test_chat_bad_model_is_a_usage_error(sqlite_target: Target) -> None:
    result = sqlite_target.invoke("chat", "--model", "gpt-4o", input="/quit\n")
    assert result.exit_code == 2


def test_chat_unknown_session_in_a_missing_store_creates_nothing(tmp_path: Path) -> None:
    result = invoke_cli("--store", str(tmp_path / "none.db"), "chat", MISSING)
    assert result.exit_code == 1
    assert list(tmp_path.iterdir()) == []


def test_a_turn_that_fails_on_an_error_not_terret_s_is_one_line_in_chat(target: Target) -> None:
    """A model (or anything under the turn) raising an error that is not Terret's printed a
    thread's traceback on stderr and nothing on the chat's screen; a failed turn said nothing.
    docs/cli.md: errors are one line, ``Error: <Type>: <message>``."""
    done = subprocess.run(
        [sys.executable, "-m", "terret", "--store", target.uri, "--views", target.views,
         "chat", "--app", "tests.cli.chat_app:app"],
        input="explode now\nstill here?\n/quit\n", capture_output=True, text=True,
        env=subprocess_env(), cwd=target.cwd, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr + done.stdout, done.stderr
    assert "Error: RuntimeError: the model blew up while answering" in done.stdout + done.stderr
    assert "still here?" in done.stdout  # the chat went on


def test_chat_usage_shows_the_upkeeps_model_calls_beside_the_steps(target: Target) -> None:
    """docs/cli.md: ``/usage`` gives the total and per model, then the upkeep's own model calls
    by purpose (recorded here as another process's titler would)."""
    sid = target.finished()
    target.writer().execute(sid, lambda s: s.record_usage(
        "title", "demo:ops-model-1", UsageData(prompt_tokens=40, completion_tokens=6,
                                               cost=0.0004)))
    result = target.invoke("chat", str(sid), "--app", DEMO_APP, input="/usage\n/quit\n")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("usage: "))
    assert "  upkeep, title: 40 + 6 tokens, $0.000400" in lines[at:], lines[at:]
