"""The command line's text (issue 11): bytes that are not UTF-8 in an argument, malformed
patterns, specs and agent names, a bad --timeout, a bad --store for `doctor`, a huge call id.

Each is one ``Error:`` line on stderr (no traceback), exit code 2 (usage; the call id's refusal
is a domain error, exit 1), empty stdout, and nothing appended. On SQLite and the EventStoreDB
emulator; the argv cases in real processes, since Python decodes argv itself there.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.conftest import (
    MISSING,
    Target,
    badfloor_app,
    invoke_cli,
    one_line_error,
    subprocess_env,
)

# b"caf\xe9" (Latin-1) on a UTF-8 command line: Python hands it over as "caf\udce9".
BAD = os.fsdecode(b"caf\xe9")
assert BAD == "caf\udce9"


def assert_usage_error(target: Target, args: list[str], *needles: str, code: int = 2) -> str:
    before = target.snapshot()
    result = target.invoke(*args)
    assert result.exit_code == code, (args, result.exit_code, result.stdout, result.stderr)
    line = one_line_error(result.stderr)
    for needle in needles:
        assert needle in line, (needle, line)
    assert result.stdout == ""
    assert target.snapshot() == before, f"{args} changed the store"
    return line


def test_non_utf8_bytes_in_any_text_argument_are_usage_errors(target: Target) -> None:
    """Real processes, run concurrently: the child decodes argv with surrogateescape, exactly
    as a user's shell reaches it."""
    parked, closed = str(target.parked()), str(target.closed())
    idle = str(target.finished())
    commands: list[list[str]] = [
        ["inject", idle, BAD],
        ["inject", idle, "hello " + BAD, "--wake"],
        ["cancel", parked, "--reason", BAD],
        ["cancel", idle, "--reason", BAD],  # usage error before NoOpenTurn
        ["approve", parked, "call-deploy", "--reason", BAD],
        ["approve", parked, BAD],  # usage error before ApprovalNotPending
        ["deny", parked, "call-deploy", "--reason", BAD],
        ["sessions", "close", idle, "--reason", BAD],
        ["sessions", "purge", closed, "--reason", BAD, "--yes"],
        ["title", idle, BAD],
        ["model", "set", idle, "main", "demo:" + BAD],
        ["model", "set", idle, BAD, "demo:x"],
        ["policy", "set", idle, "fs.*", BAD],
        ["sessions", "new", "--agent", BAD],
        ["sessions", "new", "--model", "demo:" + BAD],
        ["log", idle, "--type", BAD],
    ]
    before = target.snapshot()
    procs = [(args, subprocess.Popen([sys.executable, "-m", "terret", *target.args(*args)],
                                     cwd=target.cwd, env=subprocess_env(),
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, errors="backslashreplace"))
             for args in commands]
    for args, proc in procs:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 2, (args, proc.returncode, err)
        line = one_line_error(err)
        assert "not valid Unicode" in line or "invalid pattern" in line, (args, line)
        assert "Error serializing" not in err and "PydanticSerializationError" not in err
        assert out == "", (args, out)
    assert target.snapshot() == before


def test_surrogates_reaching_the_domain_are_usage_errors(target: Target, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """What the CLI does not check itself, the domain refuses (``InvalidPayload``); the CLI
    reports that as a usage error too: here a reason over the most a reason may have. An app
    whose agent's allow-list floor is malformed is refused as it loads, before the store is
    opened: a usage error on ``--app`` (it was the domain's, when the session was created)."""
    sid = str(target.finished())
    assert_usage_error(target, ["sessions", "close", sid, "--reason", "r" * 2001],
                       "InvalidPayload", "'reason'", "at most 2000 characters")
    badfloor_app(tmp_path, monkeypatch)
    assert_usage_error(target, ["chat", "--app", "badfloor_app:app", "--agent", "ops"],
                       "--app", "ConfigurationError", "allow: invalid pattern 'deploy!'",
                       "'!' only negates a set")


def test_malformed_patterns_are_usage_errors(target: Target) -> None:
    sid = str(target.finished())
    for pattern, needle in [("a]b[", "unbalanced brackets"), ("deploy!", "'!' only negates"),
                            ("deploy\n", "use a glob"), ("[]", "empty set"),
                            ("fs.*\n", "use a glob")]:
        assert_usage_error(target, ["policy", "set", sid, "fs.*", pattern], "invalid pattern",
                           needle)
    assert target.invoke("policy", "set", sid, "fs.[rw]*", "[!x]*").exit_code == 0


def test_trailing_newlines_and_blank_names_are_usage_errors(target: Target) -> None:
    sid = str(target.finished())
    for args, needle in [
        (["model", "set", sid, "main", "demo:x\n"], "provider:model"),
        (["model", "set", sid, "main\n", "demo:x"], "role"),
        (["sessions", "new", "--model", "demo:x\n"], "--model"),
        (["sessions", "new", "--model", ""], "--model"),
        (["sessions", "new", "--agent", "   "], "--agent"),
        (["sessions", "new", "--agent", "ops\n"], "--agent"),
        (["sessions", "new", "--agent", ""], "--agent"),
        (["chat", "--model", ""], "--model"),
        (["chat", "--agent", "   "], "--agent"),
        (["chat", sid, "--model", ""], "--model"),
    ]:
        assert_usage_error(target, args, needle)


def test_a_huge_call_id_is_not_echoed_whole(target: Target) -> None:
    parked = str(target.parked())
    huge = "x" * 5_000_000
    line = assert_usage_error(target, ["approve", parked, huge], "ApprovalNotPending",
                              "5000000 characters", code=1)
    assert len(line) < 300
    line = assert_usage_error(target, ["deny", parked, huge, "--reason", "no"],
                              "ApprovalNotPending", code=1)
    assert len(line) < 300


def test_every_long_value_is_cut_in_its_error(target: Target) -> None:
    """docs/cli.md: a value quoted in an error message is cut to about 60 characters, with its
    length — click's own refusals, the domain's, and those a library quotes underneath."""
    sid = str(target.finished())
    long = "x" * 5000
    for args, code in [
        (["sessions", "show", long], 2), (["log", sid, "--type", long], 2),
        (["log", sid, "--tail", long], 2), (["model", "set", sid, "main", long], 2),
        (["model", "set", sid, "main", "demo:" + long], 2), (["budget", "set", sid, long], 2),
        (["sessions", "list", "--since", long], 2), (["sessions", "list", "--status", long], 2),
        (["sessions", "list", "--limit", long], 2), (["usage", sid, "--by", long], 2),
        (["--store-timeout", long, "sessions", "list"], 2),
        (["--store", "esdb://" + long, "sessions", "list"], 2),
        (["projections", "rebuild", long], 1), (["resume", sid, "--app", long], 2),
        (["approve", sid, long], 1),
        # Hex digits past a UUID's 32 are no prefix of one (it was a LIKE pattern too complex).
        (["sessions", "show", "a" * 50_000], 2),
    ]:
        line = assert_usage_error(target, args, "characters)", code=code)
        assert len(line) < 400 and "x" * 100 not in line, line
        assert "x" * 40 in line or "a" * 40 in line, line  # cut, not dropped: which value
    assert_usage_error(target, ["title", "ab" * 20, "new"], "is not a session id")


def test_doctor_on_an_unusable_store_uri_is_a_usage_error(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    monkeypatch.chdir(tmp_path)
    for uri in ("postgres://db/x", "esdb://127.0.0.1:1?Tls=maybe"):
        codes = {}
        for command in (["doctor"], ["sessions", "list"], ["projections", "status"]):
            result = invoke_cli("--store", uri, *command)
            codes[command[0]] = result.exit_code
            assert "--store" in one_line_error(result.stderr)
        assert codes == {"doctor": 2, "sessions": 2, "projections": 2}, (uri, codes)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("timeout", ["-1", "0", "nan", "inf", "-inf", "soon"])
def test_demo_refuses_a_bad_timeout_before_touching_anything(tmp_path: Path,
                                                             timeout: str) -> None:
    store = tmp_path / "kept.db"
    store.write_bytes(b"not touched")
    result = invoke_cli("demo", "--path", str(store), "--timeout", timeout)
    assert result.exit_code == 2, result.stderr
    assert "--timeout" in one_line_error(result.stderr)
    assert store.read_bytes() == b"not touched"
    assert sorted(os.listdir(tmp_path)) == ["kept.db"]


def test_good_text_on_a_missing_session_is_still_a_domain_error(target: Target) -> None:
    """Well-formed text on a missing session is still a domain error (exit 1)."""
    assert_usage_error(target, ["inject", MISSING, "caf\u00e9"], "SessionNotFound", code=1)


def test_a_message_over_the_limit_is_refused_alike_on_every_store(target: Target) -> None:
    """Text over ``MAX_MESSAGE_BYTES`` (512 KiB as stored) is refused with nothing written,
    on SQLite as on EventStoreDB — where such text, once queued, was too large for the step
    that injects it, and every turn after failed."""
    sid = str(target.finished())
    line = assert_usage_error(target, ["inject", sid, "x" * 600_000], code=1)
    assert line == ("Error: PayloadTooLarge: inbox/queued payload is 600070 bytes; the limit "
                    "is 524288 bytes"), line


def test_numbers_out_of_range_are_usage_errors_not_tracebacks(target: Target) -> None:
    """What an outside probe found: nan and inf let through, and numbers too large for SQLite
    or for Python's indexes raising from deep inside a command."""
    sid = str(target.finished())
    huge = "99999999999999999999999"
    for args, needle in [
        (["sessions", "list", "--limit", huge], "--limit"),
        (["sessions", "list", "--offset", huge], "--offset"),
        (["log", sid, "--tail", huge], "--tail"), (["log", sid, "--from", str(2**63)], "--from"),
        (["--store-timeout", "nan", "sessions", "list"], "not a finite number"),
        (["--store-timeout", "inf", "sessions", "list"], "--store-timeout"),
        (["serve", "--grace", "nan"], "not a finite number"),
        (["serve", "--grace", "1e23"], "--grace"),
        (["budget", "set", sid, "1e308"], "not an amount"),
        (["budget", "set", sid, "1_000"], "not an amount"),
        (["--store", "", "sessions", "list"], "an empty value"),
        (["--views", "", "sessions", "list"], "an empty value"),
    ]:
        assert_usage_error(target, args, needle)
    for app in ("", ":app", "..:x"):
        assert_usage_error(target, ["serve", "--app", app], "cannot load app")


def test_a_views_file_that_holds_anything_else_is_refused_and_left_untouched(
        target: Target, tmp_path: Path) -> None:
    import sqlite3

    from terret.adapters.stores.sqlite import SQLiteStore
    from terret.runtime.commands import SessionCommands

    other_store = tmp_path / "other-store.db"
    opened = SQLiteStore(other_store)
    SessionCommands.on(opened).create(agent="demo")
    opened.close()
    app_db = tmp_path / "app.db"
    with sqlite3.connect(app_db) as db:
        db.execute("CREATE TABLE users (name TEXT)")
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes, not a database\n")
    for path, needle in ((other_store, "it is a Terret store"),
                         (app_db, "another SQLite database (tables users)"),
                         (notes, "it is not a SQLite database")):
        before = path.read_bytes()
        line = assert_usage_error(target, ["--views", str(path), "sessions", "list"],
                                  "NotAViewsFile", needle, "left untouched", code=1)
        assert str(path) in line
        assert path.read_bytes() == before
    assert target.invoke("sessions", "list").exit_code == 0  # its own views still work


def test_log_ended_by_a_record_it_cannot_decode_stays_json_lines(target: Target) -> None:
    """docs/cli.md: ``log`` streams, so the events before a record it cannot decode are
    printed; with ``--json`` the ``CorruptRecord`` error is one more JSON line."""
    import json
    from uuid import uuid4

    from terret.domain.store import NewRecord, session_stream

    sid = target.finished()
    stream = session_stream(sid)
    store = target.store()
    store.append(stream, [NewRecord(uuid4(), "turn/start", b'{"turn": "abc"}')],
                 store.stream_version(stream))
    done = target.run("--json", "log", str(sid))  # a real process, as a script would run it
    assert done.returncode == 1, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert [e["type"] for e in lines[:-1]][:2] == ["session/started", "turn/start"]
    assert lines[-1]["error"]["type"] == "CorruptRecord"
    assert "CorruptRecord" in one_line_error(done.stderr)


def test_rebuild_and_verify_say_a_projection_halted(target: Target) -> None:
    """docs/cli.md: a rebuild that halts reports where each projection stopped and exits 1,
    and verify does not call a halted projection ok — as doctor does not."""
    import json
    from uuid import uuid4

    from terret.domain.store import NewRecord, session_stream

    sid = target.finished()
    stream = session_stream(sid)
    store = target.store()
    store.append(stream, [NewRecord(uuid4(), "turn/start", b'{"turn": "abc"}')],
                 store.stream_version(stream))
    bad = store.head_position()
    *_, before_bad = [r.position for r in store.read_all(after=target.since, limit=10_000)
                      if r.position < bad]  # status moves past the events it does not read
    rebuilt = target.run("--json", "projections", "rebuild", "status")
    assert rebuilt.returncode == 1, rebuilt.stderr
    report = json.loads(rebuilt.stdout)
    assert report["rebuilt"] == {"status": before_bad}
    assert report["halted"]["status"]["position"] == bad
    text = target.invoke("projections", "rebuild", "status")
    assert text.exit_code == 1 and f"HALTED at {bad}" in text.stdout
    verified = target.invoke("projections", "verify", "status")
    assert verified.exit_code == 1 and f"halted at {bad}" in verified.stdout
    assert target.invoke("doctor").exit_code == 1


def test_a_damaged_views_file_met_while_checking_a_projection_s_tables_is_views_corrupt(
        tmp_path: Path) -> None:
    """`sessions list` said ViewsCorrupt; doctor, projections status|rebuild and serve printed
    sqlite3's DatabaseError when the damaged page was one the projections' table check read
    (the runner is built: ``ViewStore.ensure``)."""
    import sqlite3

    from terret.domain.errors import ViewsCorrupt
    from terret.projections import ViewStore, default_projections

    views = ViewStore(str(tmp_path / "views.db"))
    damaged = sqlite3.DatabaseError("database disk image is malformed")
    damaged.sqlite_errorcode = sqlite3.SQLITE_CORRUPT  # type: ignore[attr-defined]

    class Damaged:
        def execute(self, *args: object) -> None:
            raise damaged

    views.db = Damaged()  # type: ignore[assignment]
    with pytest.raises(ViewsCorrupt, match="delete it"):
        views.ensure(default_projections()[0])

def test_a_full_disk_under_the_rebuild_lock_is_store_full(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno
    import os

    from terret.domain.errors import StoreFull
    from terret.projections._rebuild_lock import RebuildLock

    def full(*args: object, **kwargs: object) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    lock = RebuildLock(str(tmp_path / "views.db"))
    monkeypatch.setattr(os, "open", full)
    with pytest.raises(StoreFull, match="is full"), lock.held():
        pass
