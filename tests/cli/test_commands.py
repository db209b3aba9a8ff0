"""Every command, in-process through CliRunner, on SQLite and on the EventStoreDB emulator:
what it prints (text and the documented ``--json`` shape) and what it records."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from uuid import UUID, uuid4

import pytest

from terret.domain.events import Actor, ApprovalResolved, PolicyUpdated, TurnEnded
from tests.cli.conftest import DEMO_APP, DEPLOY_ARGS, Target, one_line_error

USAGE_KEYS = {"prompt_tokens", "completion_tokens", "cost", "steps"}
SUMMARY_KEYS = {"id", "agent", "status", "closed", "events", "created", "last_activity",
                "title", "usage", "last_turn", "owner", "spent"}


# --- sessions ----------------------------------------------------------------------------------


def test_the_cost_listed_is_what_the_session_spent_upkeep_included(target: Target) -> None:
    """`sessions list`'s COST and `spent` count the summarizer's and titler's calls too, as the
    session's budget does: an operator sorting by cost missed most of a busy session's spend."""
    from terret.domain.events import UsageData

    sid = target.finished(title=None)  # its steps cost $0.75
    target.writer().execute(sid, lambda s: s.record_usage(
        "compaction", "demo:summarizer", UsageData(prompt_tokens=900, completion_tokens=90,
                                                   cost=2.0)))
    listed = json.loads(target.run("--json", "sessions", "list").stdout)  # another process
    (mine,) = [s for s in listed if s["id"] == str(sid)]
    assert mine["usage"]["cost"] == 0.75 and mine["spent"] == 2.75
    assert target.json("sessions", "show", str(sid))["budget"]["spent"] == 2.75
    text = target.invoke("sessions", "list").stdout
    (row,) = [line for line in text.splitlines() if line.startswith(str(sid))]
    assert "$2.750000" in row, text


def test_sessions_new_list_show(target: Target) -> None:
    created = target.json("sessions", "new", "--agent", "demo", "--model", "demo:ops-model-9")
    assert set(created) == {"id"}
    sid = UUID(created["id"])
    assert target.types(sid) == ["session/started"]

    text = target.invoke("sessions", "new")
    assert text.exit_code == 0
    plain = UUID(text.stdout.strip())  # text mode prints just the id

    listed = target.json("sessions", "list")
    ids = [s["id"] for s in listed]
    assert str(sid) in ids and str(plain) in ids
    assert ids.index(str(plain)) < ids.index(str(sid))  # most recently active first
    mine = next(s for s in listed if s["id"] == str(sid))
    assert set(mine) == SUMMARY_KEYS
    assert mine["agent"] == "demo" and mine["status"] == "idle" and mine["events"] == 1
    assert set(mine["usage"]) == USAGE_KEYS

    shown = target.json("sessions", "show", str(sid))
    assert shown["models"] == {"main": "demo:ops-model-9"}
    assert shown["open_turn"] is None and shown["pending_approvals"] == []
    assert shown["resumable"] is False
    assert set(shown) == SUMMARY_KEYS | {
        "open_turn", "step", "step_open", "owed_calls", "cancel_requested", "cancel", "inbox",
        "resumable", "pending_approvals", "policy", "models", "usage_by_model", "upkeep_usage",
        "in_doubt_calls", "budget", "agent_revision"}
    assert shown["agent_revision"] == 1

    # `session-<uuid>` is accepted wherever a session id is.
    assert target.json("sessions", "show", f"session-{sid}")["id"] == str(sid)


def test_sessions_list_filters_and_table(target: Target) -> None:
    parked, finished = target.parked(), target.finished()
    waiting = target.json("sessions", "list", "--status", "waiting_approval")
    assert str(parked) in [s["id"] for s in waiting]
    assert all(s["status"] == "waiting_approval" for s in waiting)
    idle = [s["id"] for s in target.json("sessions", "list", "--status", "idle")]
    assert str(finished) in idle and str(parked) not in idle
    assert len(target.json("sessions", "list", "--limit", "1")) == 1

    text = target.invoke("sessions", "list")
    assert text.exit_code == 0
    header = text.stdout.splitlines()[0].split()
    assert header == ["ID", "STATUS", "LAST", "TURN", "OWNER", "EVENTS", "COST", "ACTIVE",
                      "TITLE"]
    row = next(line for line in text.stdout.splitlines() if line.startswith(str(finished)))
    assert "idle" in row and "$0.750000" in row and "Release checkout v2" in row
    assert "1 completed" in row and ("ago" in row or "just now" in row)


def test_sessions_show_text_of_a_parked_session(target: Target) -> None:
    sid = target.parked()
    data = target.json("sessions", "show", str(sid))
    assert data["status"] == "waiting_approval" and data["open_turn"] == 1
    assert data["pending_approvals"] == [
        {"call_id": "call-deploy", "tool": "deploy", "args": DEPLOY_ARGS}]
    assert data["owed_calls"] == [{"id": "call-deploy", "name": "deploy", "args": DEPLOY_ARGS}]
    assert data["resumable"] is True and data["step_open"] is True
    text = target.invoke("sessions", "show", str(sid)).stdout
    assert "status    waiting_approval (turn 1, step 1 open)" in text
    assert "approval  call-deploy: deploy" in text


def test_sessions_close_and_purge(target: Target) -> None:
    sid = target.new_session()
    closed = target.json("sessions", "close", str(sid), "--reason", "done")
    assert closed == {"id": str(sid), "closed": True}
    end = target.events(sid)[-1]
    assert end.wire_name == "session/closed" and end.payload.reason == "done"  # type: ignore[union-attr]
    assert target.json("sessions", "show", str(sid))["status"] == "closed"

    # Without --yes (and without --json) purge asks; answering no changes nothing.
    before = target.snapshot()
    refused = target.invoke("sessions", "purge", str(sid), input="n\n")
    assert refused.exit_code == 1 and "Aborted" in refused.stderr
    assert target.snapshot() == before

    purged = target.json("sessions", "purge", str(sid), "--reason", "retention")
    assert purged == {"id": str(sid), "purged": True, "max_age": None}
    assert target.types(sid) == []
    gone = target.invoke("log", str(sid))
    assert gone.exit_code == 1 and "SessionNotFound" in gone.stderr


def test_sessions_purge_max_age(target: Target) -> None:
    sid = target.closed()
    if target.kind == "sqlite":
        # No native expiry: refused, nothing recorded, the session still there for all to see.
        before = target.snapshot()
        refused = target.invoke("--json", "sessions", "purge", str(sid), "--max-age", "3600")
        assert refused.exit_code == 1
        assert one_line_error(refused.stderr).startswith("Error: ExpiryUnsupported: ")
        assert "without --max-age" in refused.stderr
        assert target.snapshot() == before
        assert target.json("sessions", "show", str(sid)[:8])["status"] == "closed"
        return
    result = target.invoke("--json", "sessions", "purge", str(sid), "--max-age", "3600")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout) == {"id": str(sid), "purged": False, "max_age": 3600}
    assert "expires after 3600s" in result.stderr
    assert target.types(sid)  # not deleted now
    # None of its events expired yet, but the views forgot it at the purge: `usage` printed 0
    # tokens and $0, `title` "(untitled)", `sessions show` ViewsBehind (a halt doctor denied).
    for args in (["usage", str(sid)], ["title", str(sid)], ["sessions", "show", str(sid)],
                 ["budget", "show", str(sid)], ["approvals", "list", str(sid)],
                 ["policy", "show", str(sid)], ["log", str(sid)]):
        shown = target.invoke(*args)
        assert shown.exit_code == 1, (args, shown.stdout)
        error = one_line_error(shown.stderr)
        assert error.startswith(f"Error: SessionExpiring: session {sid} was purged to expire "
                                "after 3600s: its events expire as they reach that age"), error
    assert target.invoke("doctor").exit_code == 0
    deleted = target.invoke("--json", "sessions", "purge", str(sid), "--yes")
    assert json.loads(deleted.stdout)["purged"] is True  # and deleted now, on second thought


def test_a_session_expiring_part_way_reads_as_expiring_and_can_still_be_deleted(
        target: Target) -> None:
    """After `purge --max-age` the server drops a session's oldest events first: until the
    last expires, every command called it a damaged log (CorruptRecord: a gap before seq 2)
    and it could not be deleted now."""
    if target.kind == "sqlite":
        return  # no native expiry (above)
    sid = target.new_session()
    time.sleep(2.5)  # its start will expire well before its close
    target.writer().execute(sid, lambda s: s.close(by=Actor(actor="operator"), reason="done"))
    result = target.invoke("--json", "sessions", "purge", str(sid), "--max-age", "2")
    assert result.exit_code == 0, result.stderr
    for args in (["sessions", "show", str(sid)], ["inject", str(sid), "hello"],
                 ["log", str(sid)], ["--json", "log", str(sid)], ["usage", str(sid)]):
        shown = target.invoke(*args)
        assert shown.exit_code == 1, shown.stdout
        error = one_line_error(shown.stderr)
        assert error.startswith("Error: SessionExpiring: ") and "expire after 2s" in error, error
    deleted = target.invoke("--json", "sessions", "purge", str(sid), "--yes")
    assert deleted.exit_code == 0, deleted.stderr
    assert json.loads(deleted.stdout)["purged"] is True
    gone = target.invoke("sessions", "show", str(sid))
    assert gone.exit_code == 1 and "SessionNotFound" in gone.stderr


# --- approvals -----------------------------------------------------------------------------


def test_approvals_list_approve_and_resume(target: Target) -> None:
    sid = target.parked()
    pending = target.json("approvals", "list", str(sid))
    assert pending == [{"session": str(sid), "call_id": "call-deploy", "tool": "deploy",
                        "args": DEPLOY_ARGS, "turn": 1, "waiting": "approval"}]
    everywhere = target.json("approvals", "list")
    assert pending[0] in everywhere
    table = target.invoke("approvals", "list", str(sid)).stdout
    assert table.split("\n")[0].split() == ["SESSION", "CALL", "TOOL", "ARGS", "WAITING"]

    approved = target.json("approve", str(sid), "call-deploy", "--reason", "window open")
    assert approved == {"session": str(sid), "call_id": "call-deploy", "verdict": "approved",
                        "tool": "deploy", "args": DEPLOY_ARGS}
    verdict = target.events(sid)[-1]
    assert isinstance(verdict.payload, ApprovalResolved)
    assert verdict.payload.verdict == "approved" and verdict.payload.reason == "window open"
    assert verdict.payload.by.actor == "operator"
    assert target.json("approvals", "list", str(sid)) == []
    assert "no pending approvals" in target.invoke("approvals", "list", str(sid)).stdout

    # Nothing serves the session: `resume` runs the open turn to its end in this process.
    resumed = target.json("resume", str(sid), "--app", DEMO_APP)
    assert resumed == {"session": str(sid), "turn": 1, "status": "completed"}
    results = [e for e in target.events(sid) if e.wire_name == "tool/result"]
    assert [r.payload.content for r in results] == [  # type: ignore[union-attr]
        "checkout v2 rolled out to 3/3 instances"]
    assert target.types(sid).count("turn/start") == 1  # R14: no second turn/start


def test_deny_is_what_the_model_sees(target: Target) -> None:
    sid = target.parked()
    denied = target.json("deny", str(sid), "call-deploy", "--reason", "freeze")
    assert denied["verdict"] == "denied"
    text = target.invoke("resume", str(sid), "--app", DEMO_APP)
    assert text.exit_code == 0, text.stderr
    assert text.stdout.strip() == "turn 1 completed"
    result = next(e for e in target.events(sid) if e.wire_name == "tool/result")
    assert result.payload.is_error  # type: ignore[union-attr]
    assert "denied by operator: freeze" in result.payload.content  # type: ignore[union-attr]


# --- log -------------------------------------------------------------------------------------


def test_log_text_json_from_and_type(target: Target) -> None:
    sid = target.finished()
    text = target.invoke("log", str(sid))
    assert text.exit_code == 0
    lines = text.stdout.splitlines()
    assert len(lines) == 12
    assert lines[0].split()[:2] == ["1", "session/started"]
    assert "tool/result" in lines[5] and "service_status#c1 'ok'" in lines[5]
    assert "turn 1 step 1 100+10 tokens $0.500000" in lines[6]

    records = [json.loads(line) for line in
               target.invoke("--json", "log", str(sid)).stdout.splitlines()]
    assert [r["seq"] for r in records] == list(range(1, 13))
    assert set(records[0]) == {"seq", "position", "type", "version", "recorded_at", "data"}
    assert records[0]["data"]["agent"] == "demo"
    positions = [r["position"] for r in records]
    assert positions == sorted(positions)

    tail = target.invoke("--json", "log", str(sid), "--from", "7", "--type", "step/end",
                         "--type", "turn/end")
    got = [json.loads(line) for line in tail.stdout.splitlines()]
    assert [(r["seq"], r["type"]) for r in got] == [(7, "step/end"), (10, "step/end"),
                                                   (11, "turn/end")]
    assert got[0]["data"]["usage"] == {"prompt_tokens": 100, "completion_tokens": 10,
                                       "cost": 0.5}


# --- inject, cancel --------------------------------------------------------------------------


def test_inject_queues_durably(target: Target) -> None:
    sid = target.new_session()
    queued = target.json("inject", str(sid), "look at the logs")
    assert set(queued) == {"session", "inbox_id", "wake"} and queued["wake"] is False
    woke = target.json("inject", str(sid), "and deploy", "--wake")
    assert woke["wake"] is True
    entries = [e.payload for e in target.events(sid) if e.wire_name == "inbox/queued"]
    assert [(p.text, p.wake, p.inbox_id) for p in entries] == [  # type: ignore[union-attr]
        ("look at the logs", False, queued["inbox_id"]),
        ("and deploy", True, woke["inbox_id"])]
    assert target.json("sessions", "show", str(sid))["inbox"] == 2
    assert target.invoke("inject", str(sid), "x").stdout.startswith("queued ")


def test_cancel_records_the_request_and_resume_closes_the_turn(target: Target) -> None:
    sid = target.parked()
    cancelled = target.json("cancel", str(sid), "--reason", "wrong service")
    assert cancelled == {"session": str(sid), "cancel_requested": True, "recorded": True}
    assert target.types(sid)[-1] == "turn/cancel_requested"
    assert target.json("sessions", "show", str(sid))["cancel_requested"] is True

    resumed = target.json("resume", str(sid), "--app", DEMO_APP)
    assert resumed["status"] == "cancelled"
    events = target.events(sid)
    denial = next(e for e in events if e.wire_name == "approval/resolved")
    assert denial.payload.verdict == "denied"  # type: ignore[union-attr]  # R13
    end = next(e for e in events if e.wire_name == "turn/end")
    assert isinstance(end.payload, TurnEnded) and end.payload.status == "cancelled"
    # The denied deploy never ran: the turn answers it with an error result before closing,
    # so the model's history never holds a call without its result.
    results = [e.payload for e in events if e.wire_name == "tool/result"]
    assert [(r.name, r.is_error) for r in results] == [("deploy", True)]  # type: ignore[union-attr]
    assert "not run" in results[-1].content  # type: ignore[union-attr]


# --- policy, model, title, compact, usage ----------------------------------------------------


def test_policy_show_and_set(target: Target) -> None:
    sid = target.new_session()
    assert target.json("policy", "show", str(sid)) == {"session": str(sid), "patterns": None,
                                                        "floor": None}
    assert "none recorded" in target.invoke("policy", "show", str(sid)).stdout
    data = target.json("policy", "set", str(sid), "service_*", "fs.read")
    assert data == {"session": str(sid), "patterns": ["service_*", "fs.read"]}
    last = target.events(sid)[-1].payload
    assert isinstance(last, PolicyUpdated) and last.patterns == ["service_*", "fs.read"]
    assert target.json("policy", "show", str(sid))["patterns"] == ["service_*", "fs.read"]
    shown = target.invoke("policy", "show", str(sid)).stdout.splitlines()
    assert shown[:2] == ["service_*", "fs.read"] and shown[2].startswith("floor: ")
    # Deny everything: said so explicitly; no patterns alone is a usage error.
    assert target.json("policy", "set", str(sid), "--deny-all")["patterns"] == []
    assert target.invoke("policy", "show", str(sid)).stdout.splitlines()[0] == "(deny all)"


def test_model_set(target: Target) -> None:
    sid = target.new_session()
    data = target.json("model", "set", str(sid), "compactor", "openrouter:openai/gpt-4o-mini")
    assert data == {"session": str(sid), "role": "compactor",
                    "spec": "openrouter:openai/gpt-4o-mini"}
    assert target.json("sessions", "show", str(sid))["models"] == {
        "main": "demo:ops-model-1", "compactor": "openrouter:openai/gpt-4o-mini"}


def test_title_show_and_set(target: Target) -> None:
    sid = target.finished()
    assert target.json("title", str(sid)) == {"session": str(sid),
                                              "title": "Release checkout v2"}
    assert target.invoke("title", str(sid)).stdout.strip() == "Release checkout v2"
    long = "x" * 200
    data = target.json("title", str(sid), long)
    assert data["title"] == "x" * 80  # capped (R20)
    assert target.json("title", str(sid))["title"] == "x" * 80
    untitled = target.new_session()
    assert target.invoke("title", str(untitled)).stdout.strip() == "(untitled)"
    assert target.json("title", str(untitled))["title"] is None


def test_compact(target: Target) -> None:
    sid = target.finished()
    data = target.json("compact", str(sid), "--app", DEMO_APP)
    assert data == {"session": str(sid), "upto_seq": 12}
    last = target.events(sid)[-1]
    assert last.wire_name == "session/compacted" and last.payload.upto_seq == 12  # type: ignore[union-attr]


def test_usage(target: Target) -> None:
    sid = target.finished()
    one = target.json("usage", str(sid))
    assert one == {str(sid): {"prompt_tokens": 300, "completion_tokens": 30, "cost": 0.75,
                              "steps": 2}}
    assert target.json("usage", str(sid), "--by", "turn") == {
        "1": {"prompt_tokens": 300, "completion_tokens": 30, "cost": 0.75, "steps": 2}}
    by_model = target.json("usage", str(sid), "--by", "model")
    assert by_model == {
        "demo:ops-model-1": {"prompt_tokens": 100, "completion_tokens": 10, "cost": 0.5,
                             "steps": 1},
        "demo:ops-model-2": {"prompt_tokens": 200, "completion_tokens": 20, "cost": 0.25,
                             "steps": 1}}
    everyone = target.json("usage")
    assert everyone[str(sid)]["cost"] == 0.75
    assert set(target.json("usage", "--by", "model")) >= set(by_model)
    text = target.invoke("usage", str(sid), "--by", "model").stdout.splitlines()
    assert text[0].split() == ["MODEL", "PROMPT", "COMPLETION", "COST", "STEPS"]
    assert text[1].split() == ["demo:ops-model-1", "100", "10", "$0.500000", "1"]


# --- projections, doctor, events -------------------------------------------------------------


def test_projections_status_rebuild_verify(target: Target) -> None:
    target.finished()
    status = target.json("projections", "status")
    names = [s["name"] for s in status]
    assert {"messages", "usage", "title", "policy", "approvals", "status",
            "sessions"} <= set(names)
    assert all(set(s) == {"name", "position", "lag", "halted", "loaded", "other_version",
                          "rebuilding"}
               for s in status)
    assert all(s["other_version"] is None and s["rebuilding"] is None for s in status)
    assert all(s["loaded"] for s in status)
    head = target.store().head_position()
    target.json("sessions", "list")  # catch the views up
    after = target.json("projections", "status")
    assert all(s["lag"] == 0 and s["halted"] is None and s["position"] >= head for s in after)

    rebuilt = target.invoke("projections", "rebuild")
    assert rebuilt.exit_code == 0, rebuilt.stderr
    # one progress bar for the pass over the log (issue 15), on stderr
    assert f"rebuilding {len(names)} projections" in rebuilt.stderr
    assert f"usage: rebuilt up to {head}" in rebuilt.stdout
    one = target.json("projections", "rebuild", "title")
    assert one == {"rebuilt": {"title": head}, "halted": {}}

    verified = target.json("projections", "verify")
    assert set(verified) == set(names) and all(v == [] for v in verified.values())
    text = target.invoke("projections", "verify", "usage")
    assert text.exit_code == 0 and text.stdout.strip() == "usage: ok"


def test_projections_verify_exits_1_on_a_difference(sqlite_target: Target) -> None:
    target = sqlite_target
    sid = target.finished()
    target.json("sessions", "list")
    import sqlite3

    with sqlite3.connect(target.views) as db:  # tamper with the live view
        tables = [r[0] for r in db.execute("select name from sqlite_master where type='table'")]
        usage_table = next(t for t in tables if t.startswith("usage"))
        db.execute(f"delete from {usage_table}")
    result = target.invoke("projections", "verify", "usage")
    assert result.exit_code == 1
    assert "usage:" in result.stdout and "difference" in result.stdout
    log_before = target.types(sid)
    doctor = target.invoke("doctor")
    assert doctor.exit_code == 1
    assert "FIX   projection usage differs from a rebuild" in doctor.stdout
    assert "1 problem found" in doctor.stderr
    assert target.types(sid) == log_before  # the log is untouched: only the view was wrong
    assert log_before[0] == "session/started" and "turn/end" in log_before
    assert target.invoke("projections", "rebuild", "usage").exit_code == 0
    assert target.invoke("projections", "verify", "usage").exit_code == 0


def test_doctor_says_whether_a_copy_of_the_sqlite_file_alone_is_a_whole_backup(
        sqlite_target: Target, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/operations.md: run doctor, then copy the file. After a full-disk episode the WAL
    could not be folded in and doctor said ok: the copy lacked the last events."""
    import sqlite3

    from terret.adapters.stores.sqlite import SQLiteStore

    target = sqlite_target
    target.finished()
    target.store().close()
    data = target.json("doctor")
    assert any(c.startswith("store WAL folded into the file") for c in data["checks"]), data
    wal = Path(target.uri + "-wal")
    assert not wal.exists() or wal.stat().st_size == 0
    reader = sqlite3.connect(target.uri)  # another process reading (a serve): in use
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM events").fetchone()
    try:
        target.new_session()  # something in the WAL the reader's snapshot keeps there
        data = target.json("doctor")
        assert data["ok"] is True
        assert any(c.startswith("store WAL in use by another process") for c in data["checks"])
    finally:
        reader.close()
    monkeypatch.setattr(SQLiteStore, "checkpoint",
                        lambda self: (False, "database or disk is full"))
    done = target.invoke("--json", "doctor")
    assert done.exit_code == 1
    (problem,) = json.loads(done.stdout)["problems"]
    assert "could not be folded into" in problem and "database or disk is full" in problem


def test_doctor_ok(target: Target) -> None:
    target.finished()
    data = target.json("doctor")
    assert data["ok"] is True and data["problems"] == []
    assert any("reachable, head position" in c for c in data["checks"])
    assert "every projection equals a rebuild from the log" in data["checks"]
    text = target.invoke("doctor")
    assert text.exit_code == 0 and text.stdout.startswith("ok    store ")


def test_events_catalogue() -> None:
    from tests.cli.conftest import invoke_cli

    result = invoke_cli("--json", "events")
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    by_name = {d["wire_name"]: d for d in data}
    assert {"session/started", "turn/start", "approval/resolved", "session/purged"} <= set(
        by_name)
    assert by_name["user/message"]["model_visible"] is True
    assert by_name["approval/resolved"]["commutative"] is True
    assert by_name["turn/start"] == {"wire_name": "turn/start", "version": 1,
                                     "model_visible": False, "commutative": False,
                                     "builtin": True, "fields": ["trigger", "turn"]}
    text = invoke_cli("events").stdout.splitlines()
    assert text[0].split()[:2] == ["WIRE", "NAME"]


def test_help_explains_every_command() -> None:
    import click

    from terret.cli import cli
    from tests.cli.conftest import invoke_cli

    top = invoke_cli("--help")
    assert top.exit_code == 0
    for option in ("--store", "--views", "--json", "TERRET_STORE"):
        assert option in top.stdout

    def walk(group: click.Group, path: list[str]) -> None:
        commands = cli.load_all() if group is cli else group.commands
        for name, command in commands.items():
            assert name in invoke_cli(*path, "--help").stdout
            assert command.help, f"terret {' '.join([*path, name])} has no help text"
            sub = invoke_cli(*path, name, "--help")
            assert sub.exit_code == 0 and "Usage: " in sub.stdout
            if isinstance(command, click.Group):
                walk(command, [*path, name])

    walk(cli, [])


def test_app_module_in_the_working_directory(sqlite_target: Target, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """`--app mymodule` finds mymodule.py where the command runs (the `terret` script's own
    sys.path[0] is its bin directory); without `:function` it calls `app`."""
    sid = sqlite_target.finished()
    appdir = tmp_path / "appdir"
    appdir.mkdir()
    module = f"ops_app_{uuid4().hex[:8]}"
    (appdir / f"{module}.py").write_text(
        "from terret.cli.demo_app import demo_app as app\n"
        "not_an_app = 42\n"
        "def broken():\n    raise RuntimeError('no credentials')\n")
    monkeypatch.chdir(appdir)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(appdir))])
    assert sqlite_target.json("compact", str(sid), "--app", module)["upto_seq"] == 12
    for spec, needle in ((f"{module}:not_an_app", "not callable"),
                         (f"{module}:broken", "RuntimeError: no credentials")):
        result = sqlite_target.invoke("compact", str(sid), "--app", spec)
        assert result.exit_code == 2 and needle in result.stderr, result.stderr


def test_doctor_compares_with_a_rebuild_by_the_events_not_the_positions(target: Target) -> None:
    """On EventStoreDB a position is a commit position, growing with the bytes written: a few
    large events put the head past 200,000 while the log is small, and doctor still compares."""
    sid = str(target.finished())
    for _ in range(3):
        assert target.invoke("inject", sid, "x" * 100_000).exit_code == 0
    head = target.store().head_position()
    if target.kind == "esdb":
        assert head > 200_000, head  # what makes the case: a small log, a large position
    data = target.json("doctor")
    assert "every projection equals a rebuild from the log" in data["checks"], data
