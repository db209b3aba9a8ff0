"""What a QA probe found against docs/cli.md, each held to what the page says: an app's code
that raises is one `Error:` line (and the JSON error with `--json`), never a traceback; every
error is one line; text is checked before a session-id prefix opens the store; `purge
--max-age` on a store that cannot expire is refused before it asks; control characters in a
title are shown escaped; `terret resume` does the upkeep of the turn it resumes; and `sessions
list --since`'s help names the durations the page names."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from uuid import UUID, uuid4

import pytest

from terret.cli._context import parse_when
from terret.runtime.commands import SessionCommands
from tests.cli.conftest import (
    DEMO_APP,
    ROOT,
    Target,
    invoke_cli,
    one_line_error,
    subprocess_env,
)

BAD = os.fsdecode(b"caf\xe9")
"""Bytes that are not UTF-8 on a command line, as Python hands them over."""

APPS = '''
from terret.cli import App
from terret.cli.demo_app import demo_app
from terret.runtime.scripted import ScriptedProvider


class Boom:
    def summarize(self, messages):
        raise RuntimeError("summarizer down\\nretry later")


def fail(request):
    raise RuntimeError("provider down\\nretry later")


def exits(messages):
    raise SystemExit(3)


class Exits:
    summarize = staticmethod(exits)


def sumapp() -> App:
    base = demo_app()
    base.summarizer = Boom()
    return base


def exitapp() -> App:
    base = demo_app()
    base.summarizer = Exits()
    return base


def boomapp() -> App:
    """The role summarizer (no summarizer of its own), and a provider `boom` that raises."""
    base = demo_app()
    base.summarizer = None
    base.resolver.add(ScriptedProvider(name="boom", default=fail), "boom")
    return base


class QuotesTheStore:
    def summarize(self, messages):
        import os
        raise RuntimeError(f"cannot reach {os.environ['TERRET_STORE']}")


def storeapp() -> App:
    base = demo_app()
    base.summarizer = QuotesTheStore()
    return base


def badapp() -> App:
    raise RuntimeError("line1\\nline2")


def countapp() -> App:
    with open("built.txt", "a") as f:
        f.write("x")
    return demo_app()


class PipeBroke:
    def summarize(self, messages):
        raise BrokenPipeError(32, "the summarizer's socket closed")


def pipeapp() -> App:
    base = demo_app()
    base.summarizer = PipeBroke()
    return base
'''


@pytest.fixture
def apps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The module ``probe_apps`` (importable from ``tmp_path``, the working directory)."""
    (tmp_path / "probe_apps.py").write_text(APPS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "probe_apps"


# --- 1. an app's code that raises ----------------------------------------------------------


def test_a_summarizer_that_raises_is_one_error_line_and_writes_nothing(target: Target,
                                                                       apps: str) -> None:
    sid = str(target.finished())
    before = target.snapshot()
    result = target.invoke("compact", sid, "--app", f"{apps}:sumapp")
    assert result.exit_code == 1, result.stderr
    assert one_line_error(result.stderr) == "Error: RuntimeError: summarizer down retry later"
    assert result.stdout == ""
    as_json = target.invoke("--json", "compact", sid, "--app", f"{apps}:sumapp")
    assert as_json.exit_code == 1
    one_line_error(as_json.stderr)
    assert json.loads(as_json.stdout) == {"error": {
        "exit_code": 1, "message": "summarizer down retry later", "type": "RuntimeError"}}
    assert target.snapshot() == before


def test_a_provider_that_raises_under_the_role_summarizer_is_one_error_line(
        target: Target, apps: str) -> None:
    sid = str(target.finished())
    set_role = target.invoke("model", "set", sid, "compactor", "boom:x", "--app",
                             f"{apps}:boomapp")
    assert set_role.exit_code == 0, set_role.stderr
    before = target.snapshot()
    result = target.invoke("compact", sid, "--app", f"{apps}:boomapp")
    assert result.exit_code == 1, result.stderr
    line = one_line_error(result.stderr)
    assert line.startswith("Error: RuntimeError: ") and "provider down retry later" in line
    assert result.stdout == ""
    assert target.snapshot() == before


def test_with_verbose_the_traceback_of_an_app_s_error_is_logged_above_its_line(
        sqlite_target: Target, apps: str) -> None:
    """In a real process: ``-v`` logs the traceback (where the app raised), then the line."""
    sid = str(sqlite_target.finished())
    done = subprocess.run(
        [sys.executable, "-m", "terret", "-v",
         *sqlite_target.args("compact", sid, "--app", f"{apps}:sumapp")],
        capture_output=True, text=True, timeout=60, cwd=sqlite_target.cwd,
        env={**subprocess_env(), "PYTHONPATH": f"{sqlite_target.cwd}{os.pathsep}{ROOT}"})
    assert done.returncode == 1, done.stderr
    assert "Traceback" in done.stderr and "probe_apps.py" in done.stderr, done.stderr
    assert done.stderr.splitlines()[-1] == "Error: RuntimeError: summarizer down retry later"
    quiet = sqlite_target.run("compact", sid, "--app", f"{apps}:sumapp")
    assert quiet.returncode == 1
    assert one_line_error(quiet.stderr) == "Error: RuntimeError: summarizer down retry later"


def test_system_exit_from_an_app_is_not_turned_into_an_error(sqlite_target: Target,
                                                              apps: str) -> None:
    sid = str(sqlite_target.finished())
    result = sqlite_target.invoke("compact", sid, "--app", f"{apps}:exitapp")
    assert result.exit_code == 3
    assert "Error:" not in result.stderr


# --- 4. every error is one line --------------------------------------------------------------


def test_an_error_message_over_several_lines_is_one_line(target: Target, apps: str) -> None:
    sid = str(target.finished())
    result = target.invoke("compact", sid, "--app", f"{apps}:badapp")
    assert result.exit_code == 2
    line = one_line_error(result.stderr)
    assert line == ("Error: BadParameter: Invalid value for '--app': cannot load app "
                    f"'{apps}:badapp': RuntimeError: line1 line2")
    as_json = target.invoke("--json", "compact", sid, "--app", f"{apps}:badapp")
    assert json.loads(as_json.stdout)["error"]["message"].endswith("RuntimeError: line1 line2")


# --- 3. text checked before a prefix opens the store ---------------------------------------


def text_commands(prefix: str) -> list[list[str]]:
    return [
        ["inject", prefix, BAD],
        ["cancel", prefix, "--reason", BAD],
        ["approve", prefix, BAD],
        ["approve", prefix, "call-deploy", "--reason", BAD],
        ["deny", prefix, "call-deploy", "--reason", BAD],
        ["in-doubt", "skip", prefix, "c1", "--reason", BAD],
        ["budget", "set", prefix, "5", "--reason", BAD],
        ["sessions", "close", prefix, "--reason", BAD],
        ["sessions", "purge", prefix, "--reason", BAD, "--yes"],
        ["title", prefix, BAD],
        ["model", "set", prefix, BAD, "demo:x"],
        ["log", prefix, "--type", BAD],
    ]


def test_text_is_checked_before_a_prefix_is_looked_up(target: Target) -> None:
    """A prefix no session has (SessionNotFound once looked up) and one that matches: the text
    is refused first either way, and nothing is read or written."""
    sid = str(target.finished())
    before = target.snapshot()
    for prefix in ("0000", sid[:8]):
        for args in text_commands(prefix):
            result = target.invoke(*args)
            assert result.exit_code == 2, (args, result.stderr)
            line = one_line_error(result.stderr)
            assert "not valid Unicode text" in line, (args, line)
            assert result.stdout == ""
    assert target.snapshot() == before


def test_text_is_checked_before_a_missing_store_is_opened(tmp_path: Path) -> None:
    """In a real process (argv decoded as a shell hands it over): no `StoreUnavailable`, and
    no store file made."""
    store = tmp_path / "missing.db"
    done = subprocess.run(
        [sys.executable, "-m", "terret", "--store", str(store), "inject", "1234", BAD],
        capture_output=True, text=True, timeout=60, cwd=tmp_path, env=subprocess_env(),
        errors="backslashreplace")
    assert done.returncode == 2, done.stderr
    assert "Invalid value for 'TEXT': not valid Unicode text" in one_line_error(done.stderr)
    assert not store.exists()
    for args in text_commands("1234"):
        result = invoke_cli("--store", str(store), *args)
        assert result.exit_code == 2, (args, result.stderr)
        assert "not valid Unicode text" in one_line_error(result.stderr), args
    assert not store.exists()


def test_other_bad_values_are_refused_before_a_prefix_too(target: Target) -> None:
    """Any usage error on the command line comes before the lookup, not only text's."""
    sid = str(target.finished())
    long_reason = "r" * 2001
    for args, needle in ((["model", "set", "0000", "main", "nocolon"], "'SPEC'"),
                         (["policy", "set", "0000", "deploy!"], "invalid pattern"),
                         (["budget", "set", "0000", "-1"], "'LIMIT'"),
                         (["usage", "0000", "--by", "nothing"], "'--by'"),
                         # Checked in the command once, after the lookup (exit 1 for a prefix
                         # naming no session, 2 for one naming a session):
                         (["title", "0000", " "], "a title cannot be empty"),
                         (["inject", "0000", ""], "the text cannot be empty"),
                         (["deny", "0000", "call-x", "--reason", " "],
                          "give the model a reason"),
                         (["in-doubt", "skip", "0000", "call-x", "--reason", ""],
                          "give the model a reason"),
                         (["approve", "0000", "call-x", "--args", "{}"], "--args needs --tool"),
                         (["model", "set", "0000", "BAD", "scripted:x"], "'ROLE'"),
                         (["cancel", "0000", "--reason", long_reason], "at most 2000"),
                         (["sessions", "close", "0000", "--reason", long_reason],
                          "at most 2000"),
                         (["deny", "0000", "call-x", "--reason", long_reason], "at most 2000"),
                         (["compact", "0000", "--app", "no_such_module_here:app"], "'--app'")):
        result = target.invoke(*args)
        assert result.exit_code == 2, (args, result.stderr)
        assert needle in one_line_error(result.stderr), (args, result.stderr)
    # A prefix is still looked up: found, unknown, ambiguous.
    assert target.json("title", sid[:8]) == {"session": sid,
                                             "title": "Release checkout v2"}
    missing = target.invoke("title", "0000")
    assert missing.exit_code == 1
    assert one_line_error(missing.stderr).startswith("Error: SessionNotFound: no session id "
                                                     "starts with 0000")


def test_an_ambiguous_prefix_is_still_a_usage_error_naming_its_argument(
        target: Target) -> None:
    """Looked up when the command runs, an ambiguous prefix is refused as it was while the
    command line was parsed: `Invalid value for 'SESSION_ID'`, with the usage hint."""
    tail = uuid4().hex[:12]
    for head in ("abcd0000", "abcd1111"):
        SessionCommands.on(target.store()).create(
            agent="demo", roles={"main": "demo:ops-model-1"},
            session_id=UUID(f"{head}-0000-4000-8000-{tail}"))
    before = target.snapshot()
    result = target.invoke("inject", "abcd", "hello")
    assert result.exit_code == 2, result.stderr
    line = one_line_error(result.stderr)
    assert line.startswith("Error: BadParameter: Invalid value for 'SESSION_ID': 'abcd' is "
                           "ambiguous"), line
    assert "Usage: cli inject [OPTIONS] SESSION_ID TEXT" in result.stderr
    assert target.snapshot() == before


# --- 5. purge --max-age where the store cannot expire --------------------------------------


def test_purge_with_an_expiry_is_refused_before_asking_where_the_store_cannot_expire(
        target: Target) -> None:
    sid = str(target.closed())
    before = target.snapshot()
    result = target.invoke("sessions", "purge", sid, "--max-age", "60", input="n\n")
    assert result.exit_code == 1, result.stderr
    if target.kind == "sqlite":
        assert one_line_error(result.stderr).startswith("Error: ExpiryUnsupported: ")
        assert "?" not in result.stderr, result.stderr  # no question asked
    else:  # EventStoreDB expires streams: it asks, about an expiry
        assert f"Let the events of session {sid} expire after 60s" in result.stderr
        assert "Delete every event" not in result.stderr
        assert result.stderr.splitlines()[-1] == ("Error: Aborted: not confirmed, or "
                                                  "interrupted")
    assert target.snapshot() == before
    deletion = target.invoke("sessions", "purge", sid, input="n\n")
    assert f"Delete every event of session {sid}?" in deletion.stderr
    assert target.snapshot() == before


# --- 6. control characters in a title ------------------------------------------------------


def test_control_characters_of_a_title_are_shown_escaped_and_kept_in_the_log(
        target: Target) -> None:
    sid = target.finished()
    raw = "ring\x07 \x1b[31mred\x1b[0m done\x7f"
    shown = "ring\\x07 \\x1b[31mred\\x1b[0m done\\x7f"
    set_title = target.invoke("title", str(sid), raw)
    assert set_title.exit_code == 0, set_title.stderr
    assert set_title.stdout == shown + "\n"
    assert target.invoke("title", str(sid)).stdout == shown + "\n"
    show = target.invoke("sessions", "show", str(sid)).stdout
    assert f"title     {shown}\n" in show
    listed = target.invoke("sessions", "list").stdout
    assert shown[:20] in listed
    log = target.invoke("log", str(sid)).stdout  # the summaries, and the payloads in full
    full = target.invoke("log", str(sid), "--full").stdout
    assert shown in log
    assert "\\x7f" in full  # JSON escapes the C0 controls, not DEL: escaped as shown
    for out in (set_title.stdout, show, listed, log, full):
        assert not any(c in out for c in "\x07\x1b\x7f"), out
    # The log keeps what was written; --json prints it as it is (JSON-escaped).
    assert target.events(sid)[-1].payload.title == raw
    assert target.json("title", str(sid))["title"] == raw
    headers, row = listed.splitlines()[:2]  # the table's columns stay aligned
    assert row.index(shown[:20]) == headers.index("TITLE")


def test_log_shows_a_reason_s_escape_sequences_escaped(target: Target) -> None:
    """A reason (and a call id, a tool name: the model's) holds what its author wrote: an OSC
    sequence in it set the terminal's title or wrote its clipboard from `terret log`."""
    sid = target.parked()
    raw = "freeze \x1b]0;OWNED-TITLE\x07\x1b[2J"
    assert target.invoke("cancel", str(sid), "--reason", raw).exit_code == 0
    closed = target.invoke("resume", str(sid), "--app", DEMO_APP)  # denies, closes: the reason
    assert closed.exit_code == 0, closed.stderr
    log = target.invoke("log", str(sid)).stdout
    assert "freeze \\x1b]0;OWNED-TITLE\\x07\\x1b[2J" in log, log
    assert not any(c in log for c in "\x07\x1b"), log


def test_a_reason_s_newline_cannot_forge_lines_of_the_log(target: Target) -> None:
    """One line per event: a deny reason holding a newline and a made-up event printed what
    read as the log's next entry."""
    sid = target.parked()
    forged = "ok\n    10  tool/result   deploy#call-deploy 'FORGED: rolled back'"
    assert target.invoke("deny", str(sid), "call-deploy", "--reason", forged).exit_code == 0
    log = target.invoke("log", str(sid)).stdout
    (line,) = [line for line in log.splitlines() if "FORGED" in line]
    assert "approval/resolved" in line and "ok\\n    10  tool/result" in line, log


def test_a_summary_of_control_characters_is_cut_after_it_is_escaped() -> None:
    from terret.cli.logcmd import _short

    shown = _short("\x01" * 300)
    assert len(shown) == 70 and shown.startswith("\\x01\\x01") and shown.endswith("…")


# --- 2. resume does the upkeep of the turn it resumes --------------------------------------


def test_resume_titles_the_session_of_the_turn_it_resumes(target: Target) -> None:
    """docs/cli.md (`terret workers`): `terret resume` is a started runtime, and titles."""
    sid = target.parked()
    assert target.invoke("approve", str(sid), "call-deploy").exit_code == 0
    done = target.invoke("resume", str(sid), "--app", DEMO_APP)
    assert done.exit_code == 0, done.stderr
    titled = [e for e in target.events(sid) if e.wire_name == "session/titled"]
    assert titled and titled[0].payload.title == "deploy v2"


# --- 7. --since's durations ----------------------------------------------------------------


def test_since_help_and_docs_name_the_durations_accepted() -> None:
    help_text = " ".join(invoke_cli("sessions", "list", "--help").stdout.split())
    doc = " ".join((ROOT / "docs" / "cli.md").read_text().split())
    assert "(30s, 15m, 2h, 3d, 1w)" in help_text, help_text
    assert "(`30s`, `15m`, `2h`, `3d`, `1w`)" in doc
    for duration in ("30s", "15m", "2h", "3d", "1w"):
        assert parse_when(duration, now=1e9) < 1e9


def test_with_verbose_the_traceback_of_an_app_s_error_masks_the_store_credentials(
        target: Target, apps: str) -> None:
    """The one line masked the store URI's credentials, the ``-v`` traceback above it did not
    (an app's error quoting the URI it was given). On EventStoreDB with user-info."""
    if target.kind != "esdb" or "@" in target.uri:
        pytest.skip("a store URI with credentials: the emulator's, given some")
    sid = str(target.finished())
    uri = target.uri.replace("esdb://", "esdb://admin:changeit@", 1)
    done = subprocess.run(
        [sys.executable, "-m", "terret", "-v", "--views", target.views,
         "compact", sid, "--app", f"{apps}:storeapp"],
        capture_output=True, text=True, timeout=60, cwd=target.cwd,
        env={**subprocess_env(), "TERRET_STORE": uri,
             "PYTHONPATH": f"{target.cwd}{os.pathsep}{ROOT}"})
    assert done.returncode == 1, done.stderr
    assert "Traceback" in done.stderr and "QuotesTheStore" not in done.stdout
    assert "changeit" not in done.stderr, done.stderr
    assert done.stderr.count("esdb://***@") >= 2  # in the traceback and in the line


def test_chat_echoes_a_piped_line_with_its_escape_sequences_escaped(target: Target) -> None:
    done = target.invoke("chat", "--app", DEMO_APP, input="x \x1b]0;TITLE\x07 \x1b[2J\n")
    assert done.exit_code == 0, done.stderr
    assert "you> x \\x1b]0;TITLE\\x07 \\x1b[2J" in done.stdout, done.stdout
    assert not any(c in done.stdout for c in "\x07\x1b"), done.stdout


def test_log_lines_of_serve_and_verbose_escape_control_characters() -> None:
    """serve's lines (and -v's) may quote a provider's error body: shown, never acted on."""
    import logging

    from terret.cli._format import PrintableFormatter

    record = logging.LogRecord("terret", logging.ERROR, __file__, 1,
                               "the woken turn failed: %s", ("401 \x1b]0;pwned\x07",), None)
    line = PrintableFormatter("%(levelname)s %(message)s").format(record)
    assert line == "ERROR the woken turn failed: 401 \\x1b]0;pwned\\x07"


@pytest.mark.parametrize("source, kind", [("def app(:\n", "SyntaxError"),
                                          ("raise RuntimeError('boom at import')\n",
                                           "RuntimeError")])
def test_an_app_module_failing_at_import_is_a_usage_error(
        target: Target, apps: str, tmp_path: Path, source: str, kind: str) -> None:
    """docs/cli.md: an unusable --app is a usage error (exit 2), as --extensions is."""
    (tmp_path / "broken_app.py").write_text(source)
    sid = str(target.finished())
    before = target.snapshot()
    done = target.invoke("compact", sid, "--app", "broken_app:app")
    assert done.exit_code == 2, done.stderr
    line = one_line_error(done.stderr)
    assert line.startswith("Error: BadParameter: Invalid value for '--app': cannot load app "
                           f"'broken_app:app': {kind}: "), line
    assert target.snapshot() == before


def test_a_reader_that_leaves_early_ends_the_command_quietly(target: Target) -> None:
    """``terret log SID | head -1``: the reader closes the pipe while the command still
    writes. It ended with exit 1 and not a word (click's own handling) — or with 0, when the
    output happened to fit the pipe's buffer before the reader left: a script under ``set -o
    pipefail`` failed by chance. Exit 0 and nothing on stderr, every time, on both stores."""
    sid = target.new_session()
    commands = SessionCommands.on(target.store())
    for i in range(60):  # far more than a pipe's buffer holds, once printed with --full
        commands.inject(sid, f"note {i} " + "x" * 4000)
    for follow in ((), ("--follow",)):
        proc = subprocess.Popen([sys.executable, "-m", "terret",
                                 *target.args("log", str(sid), "--full", *follow)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=subprocess_env(), cwd=target.cwd)
        assert proc.stdout is not None and proc.stderr is not None
        first = proc.stdout.readline()
        assert first, proc.stderr.read()
        proc.stdout.close()  # the reader leaves, as `head -1` does
        assert proc.wait(30) == 0, (follow, proc.stderr.read())
        assert proc.stderr.read() == b"", follow


def test_a_broken_pipe_that_is_not_stdout_s_is_the_command_s_error(target: Target,
                                                                  apps: str) -> None:
    """A closed stdout ends a command quietly (exit 0); an EPIPE from anything else — here an
    app's summarizer whose socket closed — is an error like any other, said and exit 1."""
    sid = str(target.finished())
    result = target.invoke("compact", sid, "--app", f"{apps}:pipeapp")
    assert result.exit_code == 1, result.stderr
    assert one_line_error(result.stderr).startswith("Error: BrokenPipeError: "), result.stderr
    done = subprocess.run([sys.executable, "-m", "terret", *target.args(
        "--json", "compact", sid, "--app", f"{apps}:pipeapp")], capture_output=True,
        env=subprocess_env(), cwd=Path.cwd(), timeout=60)
    assert done.returncode == 1, done.stderr
    assert json.loads(done.stdout)["error"]["type"] == "BrokenPipeError"


def test_an_error_whose_reader_left_is_said_on_stderr_without_a_traceback(
        target: Target) -> None:
    """With ``--json`` the error is written to stdout too: a reader gone by then made that
    write raise, and the command ended on a traceback. The error line and exit code stay."""
    proc = subprocess.Popen([sys.executable, "-m", "terret", *target.args(
        "--json", "sessions", "show", str(uuid4()))], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, env=subprocess_env(), cwd=target.cwd)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # gone before the command writes anything
    assert proc.wait(60) == 1
    err = proc.stderr.read().decode()
    assert "Traceback" not in err and "Error: SessionNotFound: " in err, err


def test_the_edges_of_the_session_list_s_ranges_are_answered(target: Target) -> None:
    """Dates and pages at the ends of what ``--help`` accepts: year 1 was "neither a date",
    and a limit and an offset each in range but summing past it was a ``ValueError``."""
    sid = str(target.finished())
    assert [s["id"] for s in target.json("sessions", "list", "--since", "0001-01-01")] == [sid]
    assert target.json("sessions", "list", "--until", "0001-01-02") == []
    assert [s["id"] for s in target.json("sessions", "list", "--until", "9999-12-31")] == [sid]
    most = str(2**63 - 2)
    assert target.json("sessions", "list", "--limit", most, "--offset", "1") == []
    assert target.json("sessions", "list", "--limit", "1", "--offset", most) == []


def test_a_purge_declined_from_a_pipe_says_its_error_on_a_line_of_its_own(
        target: Target) -> None:
    sid = str(target.closed())
    done = subprocess.run([sys.executable, "-m", "terret", *target.args(
        "sessions", "purge", sid)], input="n\n", capture_output=True, text=True,
        env=subprocess_env(), cwd=target.cwd, timeout=60)
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    assert lines[0].startswith("Delete every event of session") and lines[-1] == (
        "Error: Aborted: not confirmed, or interrupted"), done.stderr


def test_an_app_checked_before_the_lookup_is_built_once(target: Target, apps: str) -> None:
    """``compact --app`` checks its app before the session's prefix is looked up: the app's
    factory (its clients, its threads) was run twice, once for the check."""
    from pathlib import Path

    sid = str(target.finished())
    result = target.invoke("compact", sid[:8], "--app", f"{apps}:countapp")
    assert result.exit_code == 0, result.stderr
    assert Path("built.txt").read_text() == "x"
