"""Bad input for every command: unknown and malformed session ids, unknown call ids, invalid
values, refused rules, an unreachable store, a missing SQLite file, credentials in the URI.

Each gets one ``Error:`` line on stderr (no traceback), exit code 1 (domain: not found,
conflict, refused by a rule, unreachable) or 2 (usage), and the store's events are unchanged.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cli.conftest import (
    DEMO_APP,
    MISSING,
    Target,
    invoke_cli,
    one_line_error,
    subprocess_env,
)

# Every command that takes a session id; "{sid}" is replaced.
SESSION_COMMANDS: list[tuple[str, ...]] = [
    ("sessions", "show", "{sid}"),
    ("sessions", "close", "{sid}"),
    ("sessions", "purge", "{sid}", "--yes"),
    ("log", "{sid}"),
    ("log", "{sid}", "--follow"),
    ("inject", "{sid}", "hello"),
    ("inject", "{sid}", "hello", "--wake"),
    ("cancel", "{sid}"),
    ("resume", "{sid}", "--app", DEMO_APP),
    ("approvals", "list", "{sid}"),
    ("approve", "{sid}", "call-deploy"),
    ("deny", "{sid}", "call-deploy", "--reason", "no"),
    ("policy", "show", "{sid}"),
    ("policy", "set", "{sid}", "deploy"),
    ("model", "set", "{sid}", "main", "demo:ops-model-2"),
    ("compact", "{sid}", "--app", DEMO_APP),
    ("title", "{sid}"),
    ("title", "{sid}", "a new title"),
    ("usage", "{sid}"),
    ("usage", "{sid}", "--by", "turn"),
    ("usage", "{sid}", "--by", "model"),
]
# Every command that reads or writes the store without a session id.
STORE_COMMANDS: list[tuple[str, ...]] = [
    ("sessions", "list"),
    ("approvals", "list"),
    ("usage",),
    ("usage", "--by", "model"),
    ("projections", "status"),
    ("projections", "rebuild"),
    ("projections", "verify"),
    ("projections", "skip", "usage"),
    ("doctor",),
    ("workers",),  # its registry read failing was "no live workers", exit 0
    ("workers", "--all"),
    ("budget", "list"),
]


def fill(command: tuple[str, ...], sid: str) -> list[str]:
    return [part.replace("{sid}", sid) for part in command]


def name(command: tuple[str, ...]) -> str:
    return " ".join(p for p in command if p != "{sid}" and p != DEMO_APP)


def assert_refused(target: Target, args: list[str], code: int, *needles: str,
                   input: str | None = None) -> str:
    before = target.snapshot()
    result = target.invoke(*args, input=input)
    assert result.exit_code == code, (args, result.exit_code, result.stdout, result.stderr)
    line = one_line_error(result.stderr)
    for needle in needles:
        assert needle in line, (needle, line)
    assert target.snapshot() == before, f"{args} changed the store"
    return line


# --- session ids ---------------------------------------------------------------------------


@pytest.mark.parametrize("command", SESSION_COMMANDS, ids=name)
def test_unknown_session(target: Target, command: tuple[str, ...]) -> None:
    target.finished()  # the store holds other sessions
    assert_refused(target, fill(command, MISSING), 1, "SessionNotFound", MISSING)


@pytest.mark.parametrize("command", SESSION_COMMANDS, ids=name)
def test_malformed_session_id(sqlite_target: Target, command: tuple[str, ...]) -> None:
    line = assert_refused(sqlite_target, fill(command, "not-a-uuid"), 2)
    assert "'not-a-uuid' is not a session id" in line


# --- call ids and rules --------------------------------------------------------------------


def test_approve_and_deny_refused_unless_pending_in_the_open_turn(target: Target) -> None:
    parked = target.parked()
    for verb in (["approve"], ["deny", "--reason", "no"]):
        cmd = [verb[0], str(parked), "call-nope", *verb[1:]]
        assert_refused(target, cmd, 1, "ApprovalNotPending", "call-nope")
        assert_refused(target, [verb[0], str(parked), "", *verb[1:]], 1, "ApprovalNotPending")
    # No open turn at all.
    idle = target.finished()
    assert_refused(target, ["approve", str(idle), "call-deploy"], 1, "ApprovalNotPending")
    # Already decided: a second verdict is refused.
    assert target.invoke("approve", str(parked), "call-deploy").exit_code == 0
    assert_refused(target, ["approve", str(parked), "call-deploy"], 1, "ApprovalNotPending")
    assert_refused(target, ["deny", str(parked), "call-deploy", "--reason", "late"], 1,
                   "ApprovalNotPending")


def test_rules_refuse(target: Target) -> None:
    idle, parked, closed = target.finished(), target.parked(), target.closed()
    assert_refused(target, ["cancel", str(idle)], 1, "NoOpenTurn")
    assert_refused(target, ["resume", str(idle), "--app", DEMO_APP], 1, "NoOpenTurn")
    assert_refused(target, ["sessions", "close", str(parked)], 1, "TurnAlreadyRunning")
    assert_refused(target, ["sessions", "purge", str(idle), "--yes"], 1, "not closed")
    assert_refused(target, ["compact", str(parked), "--app", DEMO_APP], 1,
                   "CompactionDeclined")
    for command in (["sessions", "close", str(closed)], ["inject", str(closed), "hi"],
                    ["policy", "set", str(closed), "x"],
                    ["model", "set", str(closed), "main", "a:b"],
                    ["compact", str(closed), "--app", DEMO_APP]):
        assert_refused(target, command, 1, "SessionClosed")


def test_invalid_values_are_usage_errors(target: Target) -> None:
    sid = str(target.finished())
    cases: list[tuple[list[str], str]] = [
        (["policy", "set", sid, "bad pattern"], "invalid pattern"),
        (["policy", "set", sid, "fs.*", "a[b"], "unbalanced brackets"),
        (["model", "set", sid, "main", "no-provider"], "provider:model"),
        (["model", "set", sid, "Main!", "a:b"], "'role'"),
        (["title", sid, "   "], "cannot be empty"),
        (["inject", sid, " "], "cannot be empty"),
        (["deny", sid, "call-deploy"], "Missing option '--reason'"),
        (["deny", sid, "call-deploy", "--reason", ""], "reason"),
        (["usage", "--by", "turn"], "--by turn needs a SESSION"),
        (["usage", sid, "--by", "day"], "'day' is not one of"),
        (["log", sid, "--from", "0"], "--from"),
        (["sessions", "list", "--status", "sleeping"], "'sleeping' is not one of"),
        (["sessions", "list", "--limit", "0"], "--limit"),
        (["sessions", "list", "--title", ""], "--title"),
        (["sessions", "list", "--title", "  "], "--title"),
        (["sessions", "new", "--model", "gpt-4o"], "--model"),
        (["sessions", "new", "--agent", ""], "--agent"),
        (["sessions", "purge", sid, "--max-age", "0"], "--max-age"),
        (["resume", sid, "--app", "no.such.module:app"], "--app"),
        (["compact", sid, "--app", "terret.cli.demo_app:nothing"], "--app"),
        (["compact", sid, "--app", "terret.cli.demo_app:COMPACTION_BUDGET"], "not callable"),
        (["compact", sid, "--app", "terret.cli.demo_app:demo_model"], "--app"),
        (["serve", "--grace", "-1"], "--grace"),
        (["serve", "--group", " "], "'--group'"),
        (["sessions", "frobnicate"], "No such command"),
        (["frobnicate"], "No such command"),
        (["approve", sid], "Missing argument"),
    ]
    for args, needle in cases:
        assert_refused(target, args, 2, needle)


def test_unknown_projection(target: Target) -> None:
    for command in (["projections", "rebuild", "nope"], ["projections", "verify", "nope"],
                    ["projections", "skip", "nope"]):
        assert_refused(target, command, 1, "no projection named 'nope'")
    assert_refused(target, ["projections", "skip", "usage"], 1,
                   "Error: ProjectionNotHalted: projection 'usage' is not halted")


def test_purge_confirmation_declined(target: Target) -> None:
    sid = target.closed()
    before = target.snapshot()
    result = target.invoke("sessions", "purge", str(sid), input="n\n")
    assert result.exit_code == 1 and "Error: Aborted: " in result.stderr
    assert target.snapshot() == before


# --- stores --------------------------------------------------------------------------------

UNREACHABLE = "esdb://127.0.0.1:1?Tls=false"
WITH_SECRET = "esdb://admin:secret@127.0.0.1:1?Tls=true"
# `projections skip` works on the views alone; it is refused for its own reason below.
EVERY_COMMAND = [*SESSION_COMMANDS, *(c for c in STORE_COMMANDS if "skip" not in c),
                 ("sessions", "new"), ("chat",), ("chat", "{sid}")]


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run in an empty directory: default views files land there, not in the checkout."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_unreachable_store_every_command_masks_credentials(
        in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One pass over every command against a dead EventStoreDB whose URI carries a password:
    exit 1, one line naming the store (masked), and the password never printed."""
    import esdbclient.client

    # esdbclient pauses 0.1 s between its own reconnect attempts (three per command here);
    # shortened so the sweep over every command stays quick. Terret's timeout is unchanged.
    monkeypatch.setattr(esdbclient.client, "sleep", lambda seconds: time.sleep(0.01))
    for command in EVERY_COMMAND:
        args = ["--store", WITH_SECRET, "--store-timeout", "0.1", *fill(command, MISSING)]
        result = invoke_cli(*args)
        assert result.exit_code == 1, (command, result.stderr)
        line = one_line_error(result.stderr)
        assert "StoreUnavailable" in line and "esdb://***@127.0.0.1:1" in line, line
        assert "secret" not in result.stdout + result.stderr, command
    # Even a skip reads the store first: views are only acted on once the log they were
    # built from is known to be this one (issue 11 item 4).
    skip = invoke_cli("--store", WITH_SECRET, "--store-timeout", "0.1",
                      "projections", "skip", "usage")
    line = one_line_error(skip.stderr)
    assert skip.exit_code == 1 and "StoreUnavailable" in line, line
    assert "secret" not in skip.stdout + skip.stderr


def test_unreachable_store_without_credentials(in_tmp: Path) -> None:
    for command in (("sessions", "list"), ("approve", "{sid}", "call-deploy"),
                    ("sessions", "new")):
        result = invoke_cli("--store", UNREACHABLE, "--store-timeout", "0.1",
                            *fill(command, MISSING))
        assert result.exit_code == 1
        assert UNREACHABLE in one_line_error(result.stderr)
    result = invoke_cli("--store", UNREACHABLE, "--store-timeout", "0.1", "doctor")
    assert result.exit_code == 1
    assert "is the server up? If it is, check --store / TERRET_STORE" in one_line_error(
        result.stderr)


def test_a_short_store_timeout_is_not_outlasted_by_esdbclient_retries(
        in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--store-timeout 0.1 on a server that is down: the command's one attempt is esdbclient's
    reconnect and retry (three pauses of 0.1 s), not the sixteen its nested decorators made of
    reading the store id (1.5 s, whatever the timeout said). Counted, not timed."""
    import esdbclient.client

    pauses: list[float] = []
    monkeypatch.setattr(esdbclient.client, "sleep", pauses.append)
    result = invoke_cli("--store", UNREACHABLE, "--store-timeout", "0.1", "sessions", "list")
    assert result.exit_code == 1 and "StoreUnavailable" in result.stderr, result.stderr
    attempts = int(result.stderr.split(" attempt(s)")[0].rsplit(" ", 1)[1])
    assert "read the store id" in result.stderr
    assert len(pauses) <= 3 * attempts, (attempts, pauses)


def test_store_timeout_from_the_environment(in_tmp: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TERRET_STORE", WITH_SECRET)
    monkeypatch.setenv("TERRET_STORE_TIMEOUT", "0.1")
    result = invoke_cli("sessions", "list")
    assert result.exit_code == 1 and "StoreUnavailable" in result.stderr
    assert "secret" not in result.stderr


def test_credentials_masked_in_usage_errors_too(in_tmp: Path) -> None:
    for uri in ("esdb://admin:secret@127.0.0.1:1?Bogus=1", "postgres://admin:secret@db/x",
                "esdb://admin:secret@127.0.0.1:1?Tls=maybe"):
        result = invoke_cli("--store", uri, "sessions", "list")
        assert result.exit_code == 2, result.stderr
        line = one_line_error(result.stderr)
        assert "--store" in line and "***@" in line
        assert "secret" not in result.stdout + result.stderr


@pytest.mark.parametrize("command", [*SESSION_COMMANDS, *STORE_COMMANDS], ids=name)
def test_missing_sqlite_file(tmp_path: Path, command: tuple[str, ...]) -> None:
    store = tmp_path / "nowhere.db"
    result = invoke_cli("--store", str(store), *fill(command, MISSING))
    assert result.exit_code == 1, result.stderr
    line = one_line_error(result.stderr)
    assert f"no store at {store}" in line
    assert os.listdir(tmp_path) == []  # neither the store nor the views were created


def test_events_reads_no_store(tmp_path: Path) -> None:
    """docs/cli.md: `events` is the exception that reads no store — the catalogue is this
    process's; on a missing file it lists it and creates nothing."""
    result = invoke_cli("--store", str(tmp_path / "nowhere.db"), "events")
    assert result.exit_code == 0, result.stderr
    assert "turn/start" in result.stdout
    assert os.listdir(tmp_path) == []


def test_missing_views_directory(sqlite_target: Target) -> None:
    sid = sqlite_target.finished()
    result = invoke_cli("--store", sqlite_target.uri, "--views", "/nonexistent/dir/v.db",
                        "sessions", "show", str(sid))
    assert result.exit_code == 2
    assert "cannot open the views" in one_line_error(result.stderr)


# --- the same, as a user's shell sees it (real processes) ----------------------------------


def test_bad_input_in_real_processes(sqlite_target: Target, tmp_path: Path) -> None:
    """Exit codes, stderr and stdout of the installed entry point, run concurrently."""
    target = sqlite_target
    parked = str(target.parked())
    cases: list[tuple[list[str], int, str]] = [
        (target.args("approve", parked, "call-nope"), 1, "ApprovalNotPending"),
        (target.args("cancel", "nope"), 2, "is not a session id"),
        (["--store", str(tmp_path / "missing.db"), "sessions", "list"], 1, "no store at"),
        (["--store", WITH_SECRET, "--store-timeout", "0.3", "serve", "--app", DEMO_APP], 1,
         "StoreUnavailable"),
        (target.args("serve", "--app", "nope:app"), 2, "--app"),
    ]
    before = target.snapshot()
    procs = [(subprocess.Popen([sys.executable, "-m", "terret", *args], cwd=tmp_path,
                               env=subprocess_env(), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True), code, needle)
             for args, code, needle in cases]
    for proc, code, needle in procs:
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == code, (proc.args, proc.returncode, err)
        assert needle in one_line_error(err), err
        assert out == "", out
        assert "secret" not in err
    assert target.snapshot() == before
    assert not (tmp_path / "missing.db").exists()


def test_credentials_never_printed_by_a_working_store(own_esdb_uri: str, tmp_path: Path
                                                      ) -> None:
    """A reachable EventStoreDB whose URI carries a password: verbose output, `doctor`'s store
    description and errors show it masked (real processes, so logging reaches stderr)."""
    if "@" in own_esdb_uri:
        pytest.skip("the server's URI already carries credentials")
    uri = own_esdb_uri.replace("esdb://", "esdb://admin:secret@", 1)
    runs = [["-v", "doctor"], ["-v", "--json", "sessions", "list"],
            ["-v", "sessions", "show", MISSING]]
    procs = [subprocess.Popen([sys.executable, "-m", "terret", "--store", uri, "--views",
                               str(tmp_path / f"v{i}.db"), *args], cwd=tmp_path,
                              env=subprocess_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
             for i, args in enumerate(runs)]
    outputs: list[tuple[int, str, str]] = []
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        outputs.append((proc.returncode, out, err))
    assert [code for code, _, _ in outputs] == [0, 0, 1], outputs
    assert "esdb://***@" in outputs[0][1]  # doctor names the store, masked
    assert "esdb://***@" in one_line_error(outputs[2][2])
    for _, out, err in outputs:
        assert "secret" not in out + err


def test_default_app_from_a_bad_environment(sqlite_target: Target,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    sid = str(sqlite_target.finished())
    monkeypatch.setenv("TERRET_COMPACTION_BUDGET", "lots")
    line = assert_refused(sqlite_target, ["compact", sid], 2)
    assert "cannot build the default app from the environment" in line
