"""What an outside tester found following docs/cli.md, each held to what the page says: a
negative budget refused for its amount, an unknown chat agent a usage error, views behind the
log said in the documented `warning:` line only, error messages naming their parameter, the
default app's environment checked when it is built, a views file that is the store's own
refused, and help text in step with the page."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path
from uuid import UUID, uuid4

import pytest

from terret.domain.events import ToolCallData
from terret.domain.store import NewRecord, session_stream
from terret.runtime.commands import SessionCommands
from tests.cli.conftest import (
    DEMO_APP,
    DEPLOY_ARGS,
    Target,
    badfloor_app,
    invoke_cli,
    one_line_error,
    subprocess_env,
)

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


def test_chat_on_a_session_refuses_agent_instead_of_ignoring_it(target: Target) -> None:
    """`--agent` names the agent of a new session; with SESSION it was silently ignored."""
    sid = target.new_session()
    before = target.snapshot()
    result = target.invoke("chat", str(sid), "--agent", "demo", "--app", DEMO_APP, input="")
    assert result.exit_code == 2, result.stderr
    line = one_line_error(result.stderr)
    assert "Invalid value for '--agent'" in line and "SESSION keeps its own" in line, line
    assert target.snapshot() == before


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
    assert "terret.projections projection status halted at" in verbose.stderr
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


# --- the default app's environment, checked when it is built; chat --model as model set ----

BAD_ENVIRONMENTS = [
    ("TERRET_MAIN_MODEL", "bad", "a model spec is 'provider:model'"),
    ("TERRET_MAIN_MODEL", "nosuch:x", "unknown provider 'nosuch'"),
    ("TERRET_COMPACTOR_MODEL", "nosuch:x", "unknown provider 'nosuch'"),
    ("TERRET_TITLER_MODEL", "x", "a model spec is 'provider:model'"),
    ("TERRET_SUMMARIZER", "nope", "the one summarizer it names is 'morph'"),
    ("TERRET_COMPACTION_BUDGET", "lots", "a whole number above 0"),
    ("TERRET_COMPACTION_BUDGET", "-5", "a whole number above 0"),
]


def _assert_bad_environment(stderr: str, variable: str, value: str, needle: str) -> None:
    line = one_line_error(stderr)
    assert "cannot build the default app from the environment" in line, line
    assert f"{variable}='{value}'" in line and needle in line, line
    assert "Usage: " in stderr and "Try '" in stderr, stderr  # a usage error's hint


SECRET_ENVIRONMENTS = [
    ("TERRET_MAIN_MODEL", "openai-compatible:m@http://bob:hunter2pwSECRET@127.0.0.1:8000/v1"),
    ("TERRET_TITLER_MODEL", "openai-compatible:m@http://bob:hunter2pwSECRET@127.0.0.1:8000/v1"),
    ("TERRET_MAIN_MODEL", "sk-or-v1-S3CRETK3Y0123456789abcdefZZQ"),
    ("TERRET_SUMMARIZER", "sk-or-v1-S3CRETK3Y0123456789abcdefZZQ"),
    ("TERRET_COMPACTION_BUDGET", "sk-or-v1-S3CRETK3Y0123456789abcdefZZQ"),
    # Well-formed specs of a provider the app lacks: the resolver's message quotes the spec.
    ("TERRET_MAIN_MODEL", "nosuch:admin:hunter2SECRET@host"),
    ("TERRET_MAIN_MODEL", "nosuch:SECRETK3Y0123456789abcdefZZQ"),
    # A provider the app has, with a key for a model: every session created would record it.
    ("TERRET_MAIN_MODEL", "openai:sk-SECRETK3Y0123456789abcdefZZQ"),
    ("TERRET_TITLER_MODEL", "openrouter:AKIASECRET7EXAMPLE12"),
]


@pytest.mark.parametrize("variable, value", SECRET_ENVIRONMENTS)
def test_a_value_of_the_environment_that_may_be_a_credential_is_not_quoted_back(
        target: Target, monkeypatch: pytest.MonkeyPatch, variable: str, value: str) -> None:
    """A base URL with user:password@, or a key pasted into the wrong variable: the refusal
    names the variable, never the value — on stderr and in the JSON error."""
    sid = str(target.finished())
    monkeypatch.setenv(variable, value)
    for json_flag in ((), ("--json",)):
        result = target.invoke(*json_flag, "compact", sid)
        assert result.exit_code == 2, result.stderr
        line = one_line_error(result.stderr)
        assert f"{variable} (its value not shown: it may hold a credential)" in line, line
        assert "SECRET" not in result.stderr + result.stdout, result.stderr + result.stdout


KEY_SPECS = ["openai:sk-SECRETK3Y0123456789abcdefZZQ",
             "openai:SECRETK3Y0123456789abcdefZZQxxYY", "nosuch:SECRETK3Y0123456789abcdefZZQxxYY",
             "openrouter:AKIASECRET7EXAMPLE12",
             "openrouter:AIzaSyD-SECRETrke72PouQMnMX-a7eZSW0jk",
             # Refused for its base URL's credentials, before the key check: not quoted either.
             "openai-compatible:sk-proj-SECRETK3Y0123456789abcd@http://u:p@h/v1",
             # A host's user and password without a scheme: refused as a URL's would be.
             "openai-compatible:admin:hunter2SECRET@gpu-box"]


def test_a_model_spec_that_may_be_a_credential_is_neither_quoted_nor_recorded(
        target: Target) -> None:
    """A key pasted as the model (``openai:sk-…``) would stay in the log for good: ``model
    set`` and ``--model`` refuse it without quoting it, and nothing is written; one of a
    provider the app lacks is refused without quoting it either. ``model set --not-a-key`` records
    what looks like a key all the same; real model names are not taken for keys."""
    sid = str(target.finished())
    before = target.snapshot()
    unknown = "nosuch:admin:hunter2SECRET@host"  # not a key; a provider the app lacks
    for spec, commands in [(spec, ("model", "sessions", "chat")) for spec in KEY_SPECS] + [
            (unknown, ("model", "chat"))]:
        for command in [c for c in (["model", "set", sid, "main", spec],
                                    ["sessions", "new", "--model", spec],
                                    ["chat", "--model", spec]) if c[0] in commands]:
            for json_flag in ((), ("--json",)):
                result = target.invoke(*json_flag, *command, input="")
                assert result.exit_code == 2, (command, result.stderr)
                # (A spec refused for its base URL is named by its provider alone.)
                assert "not shown: it may hold a credential" in result.stderr or re.search(
                    r"'(SPEC|--model)': [a-z-]+:…: a base URL", result.stderr), result.stderr
                assert "SECRET" not in result.stderr + result.stdout, result.stderr
    assert target.snapshot() == before
    for spec in ("openai-compatible:Qwen2.5-Coder-32B-Instruct-GPTQ-Int4",
                 "openrouter:meta-llama/llama-3.1-405b-instruct", "scripted:gpt-4o-2024-08-06",
                 # a version or deployment id is hex: not a key
                 "scripted:owner/model:5c7d5dc6dd8bf75c1acaa8565735e7986bc5b66206b55cca93cb72c9b",
                 "scripted:0123456789abcdef0123456789abcdef", "scripted:hf_internal_testing/tiny"):
        result = target.invoke("model", "set", sid, "main", spec)
        assert result.exit_code == 0, (spec, result.stderr)
    # --force is for a provider configured elsewhere only: a key is still refused.
    for spec in (KEY_SPECS[0], KEY_SPECS[-1]):
        forced = target.invoke("model", "set", "--force", "--not-a-key", sid, "main", spec) \
            if spec == KEY_SPECS[-1] else target.invoke("model", "set", "--force", sid, "main",
                                                        spec)
        assert forced.exit_code == 2 and "SECRET" not in forced.stderr, forced.stderr
    recorded = target.invoke("model", "set", "--not-a-key", sid, "main", KEY_SPECS[0])
    assert recorded.exit_code == 0, recorded.stderr
    assert target.types(sid)[-1] == "model/set"


def test_the_default_app_refuses_an_environment_it_cannot_use(
        target: Target, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every command that builds the default app refuses it up front (exit 2), naming the
    variable; nothing is written. `serve` too, which started normally before (a real
    process: serve sets up its own logging)."""
    sid = str(target.finished())
    before = target.snapshot()
    for variable, value, needle in BAD_ENVIRONMENTS:
        monkeypatch.setenv(variable, value)
        for command in (["compact", sid], ["chat"], ["chat", sid], ["resume", sid],
                        ["policy", "reset", sid], ["model", "set", sid, "main", "scripted:x"]):
            result = target.invoke(*command, input="")
            assert result.exit_code == 2, (variable, value, command, result.stderr)
            _assert_bad_environment(result.stderr, variable, value, needle)
        monkeypatch.delenv(variable)
    for variable, value, needle in BAD_ENVIRONMENTS[:2] + BAD_ENVIRONMENTS[4:5]:
        env = {**subprocess_env(), variable: value}
        served = subprocess.run([sys.executable, "-m", "terret", *target.args("serve")],
                                capture_output=True, text=True, timeout=60, cwd=target.cwd,
                                env=env)
        assert served.returncode == 2, (variable, served.stderr)
        _assert_bad_environment(served.stderr, variable, value, needle)
    assert target.snapshot() == before
    # Usable values are used: a provider the app has, without its key here, is the serving
    # process's to have (the first step says so, not the app).
    monkeypatch.setenv("TERRET_MAIN_MODEL", "openrouter:openai/gpt-4o")
    monkeypatch.delenv("OPENROUTER_API_KEY", raising=False)
    monkeypatch.setenv("TERRET_COMPACTION_BUDGET", "1000")
    monkeypatch.setenv("TERRET_SUMMARIZER", "morph")
    done = target.invoke("model", "set", sid, "main", "scripted:x")  # builds the default app
    assert done.exit_code == 0, done.stderr


def test_chat_checks_its_model_against_the_app_as_model_set_does(target: Target) -> None:
    """A spec the app cannot resolve is refused before anything is written: a provider it
    does not have, and (chat runs the steps itself) one it cannot build here."""
    sid = str(target.finished())
    before = target.snapshot()
    for args, needle in ((["--model", "nosuch:x"], "unknown provider 'nosuch'"),
                         ([sid, "--model", "nosuch:x"], "unknown provider 'nosuch'"),
                         (["--model", "nosuch:x", "--app", DEMO_APP], "known: demo")):
        result = target.invoke("chat", *args, input="")
        assert result.exit_code == 2, (args, result.stderr)
        line = one_line_error(result.stderr)
        assert "Invalid value for '--model': the app cannot resolve 'nosuch:x'" in line, line
        assert needle in line and "chat [OPTIONS] [SESSION_ID]" in result.stderr
    model_set = target.invoke("model", "set", sid, "main", "nosuch:x")
    assert model_set.exit_code == 2 and "unknown provider 'nosuch'" in model_set.stderr
    assert target.snapshot() == before
    # A session whose agent the app does not define is refused before --model is recorded.
    other = target.invoke("chat", sid, "--model", "scripted:other", input="/quit\n")
    assert other.exit_code == 1 and "no agent definition named 'demo'" in other.stderr
    assert target.snapshot() == before
    done = target.invoke("chat", sid, "--model", "demo:ops-model-2", "--app", DEMO_APP,
                         input="/quit\n")
    assert done.exit_code == 0, done.stderr
    assert "model demo:ops-model-2" in done.stdout  # the banner
    assert [e.payload.spec for e in target.events(UUID(sid))
            if e.wire_name == "model/set"] == ["demo:ops-model-2"]


def test_a_value_the_domain_refuses_has_the_commands_usage_hint(
        target: Target, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`InvalidPayload` is a usage error with click's hint (`Usage: …`, `Try …`), as the page
    says: here a reason longer than a reason may be; and an app whose agent's allow-list floor
    is malformed cannot start a chat (refused as it loads, a usage error on `--app`)."""
    sid = str(target.finished())
    before = target.snapshot()
    result = target.invoke("sessions", "close", sid, "--reason", "r" * 2001)
    assert result.exit_code == 2, result.stderr
    assert "InvalidPayload" in one_line_error(result.stderr)
    assert "sessions close [OPTIONS] SESSION_ID" in result.stderr and (
        "close --help' for help" in result.stderr)
    badfloor_app(tmp_path, monkeypatch)
    result = target.invoke("chat", "--app", "badfloor_app:app", "--agent", "ops", input="")
    assert result.exit_code == 2, result.stderr
    assert "ConfigurationError" in one_line_error(result.stderr)
    assert "chat [OPTIONS] [SESSION_ID]" in result.stderr and "chat --help' for help" in (
        result.stderr)
    assert target.snapshot() == before


# --- `--views` that is the store's own file ---------------------------------------------------


def _tables(path: str) -> list[str]:
    with sqlite3.connect(path) as db:
        return sorted(r[0] for r in db.execute("SELECT name FROM sqlite_master"))


def test_views_in_the_store_file_itself_are_refused(sqlite_target: Target,
                                                    tmp_path: Path) -> None:
    """Views are a cache kept apart from the log (SQLite only: an EventStoreDB has no file).
    The same file under any name is a usage error on --views, and nothing is written."""
    target = sqlite_target
    sid = str(target.parked())
    tables, before = _tables(target.uri), target.snapshot()
    link = tmp_path / "link.db"
    os.link(target.uri, link)
    names = [target.uri, os.path.relpath(target.uri, Path.cwd()), str(link)]
    for store in (target.uri, f"sqlite://{target.uri}"):
        for views in names:
            for command in (["sessions", "list"], ["sessions", "show", sid], ["doctor"],
                            ["approve", sid, "call-deploy"], ["sessions", "new"],
                            ["projections", "rebuild"]):
                result = invoke_cli("--store", store, "--views", views, *command)
                assert result.exit_code == 2, (store, views, command, result.stderr)
                line = one_line_error(result.stderr)
                assert "Invalid value for '--views'" in line and "the store's own file" in line
    assert _tables(target.uri) == tables and target.snapshot() == before
    missing = tmp_path / "new.db"  # a store `sessions new` would create: not created
    result = invoke_cli("--store", str(missing), "--views", str(missing), "sessions", "new")
    assert result.exit_code == 2 and not missing.exists(), result.stderr
    # Another file is fine; so are in-memory views of an in-memory store.
    assert target.invoke("sessions", "show", sid).exit_code == 0
    assert invoke_cli("--store", "memory:", "--views", ":memory:", "sessions",
                      "list").exit_code == 0


# --- help text and docs/cli.md say the same -------------------------------------------------

DOC = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text(encoding="utf-8")


def _doc_row(option: str) -> str:
    return next(line for line in DOC.splitlines() if line.startswith(f"| `{option} "))


def test_global_help_and_the_page_agree(tmp_path: Path) -> None:
    helped = invoke_cli("--help")
    assert helped.exit_code == 0
    text = " ".join(helped.stdout.split())
    store_row = _doc_row("--store")
    for form in ("sqlite:///", "memory:", "esdb://", "esdb+discover://"):
        assert form in store_row and form in text, form  # every form the page lists
    shown = re.search(r"\[([\d.]+)<=x<=([\d.]+)\]", text)
    assert shown is not None  # click shows --store-timeout's range
    assert f"`[{shown.group(1)}<=x<={shown.group(2)}]`" in _doc_row("--store-timeout")
    assert f"at least {shown.group(1)}" in text
    missing = invoke_cli("--store", str(tmp_path / "none.db"), "sessions", "list")
    kind = one_line_error(missing.stderr).removeprefix("Error: ").partition(": ")[0]
    assert missing.exit_code == 1 and kind == "StoreUnavailable"
    assert f"`{kind}: no store at PATH`" in DOC


# --- compact mid-step: declined whatever the roles ---------------------------------------------


def test_compact_while_a_step_owes_results_is_declined_before_any_role_is_asked(
        target: Target) -> None:
    """docs/cli.md: `compact` is refused with `CompactionDeclined` while a step owes tool
    results — also when the session has no compactor role to ask (it said ConfigurationError)."""
    sid = target.parked()
    assert "compactor" not in target.json("sessions", "show", str(sid))["models"]
    before = target.snapshot()
    result = target.invoke("compact", str(sid))
    assert result.exit_code == 1, result.stderr
    line = one_line_error(result.stderr)
    assert line.startswith("Error: CompactionDeclined: a step owes tool results"), line
    assert target.snapshot() == before


def test_serve_with_an_app_it_cannot_load_leaves_no_store_file(tmp_path: Path) -> None:
    store = tmp_path / "new.db"
    done = subprocess.run([sys.executable, "-m", "terret", "--store", str(store), "serve",
                           "--app", "no_such_module_here:app"], capture_output=True, text=True,
                          timeout=60, env=subprocess_env(), cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "Invalid value for '--app'" in one_line_error(done.stderr)
    assert not store.exists() and not list(tmp_path.glob("new.*"))


def test_model_set_records_a_known_provider_it_cannot_build_here_with_a_warning(
        target: Target, monkeypatch: pytest.MonkeyPatch) -> None:
    """A provider the app has (a configured endpoint) but cannot build in this shell (no API
    key) is recorded with a warning — the serving process may have the key; an unknown one is
    refused."""
    monkeypatch.delenv("OPENROUTER_API_KEY", raising=False)
    sid = target.new_session()
    done = target.invoke("model", "set", str(sid), "main", "openrouter:openai/gpt-4o")
    assert done.exit_code == 0, done.stderr
    assert "warning: 'openrouter:openai/gpt-4o' cannot be used from here" in done.stderr
    assert [e.payload.spec for e in target.events(sid)  # type: ignore[union-attr]
            if e.wire_name == "model/set"] == ["openrouter:openai/gpt-4o"]
    before = target.snapshot()
    refused = target.invoke("model", "set", str(sid), "main", "nosuchprovider:x")
    assert refused.exit_code == 2
    assert "Invalid value for 'SPEC'" in one_line_error(refused.stderr)
    assert target.snapshot() == before


def test_compact_says_why_the_summarizer_declined(target: Target,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """TERRET_SUMMARIZER=morph without MORPH_API_KEY: nothing is compacted, and the note names
    the missing key rather than a bare "declined"."""
    sid = str(target.finished())
    monkeypatch.setenv("TERRET_SUMMARIZER", "morph")
    monkeypatch.delenv("MORPH_API_KEY", raising=False)
    before = target.snapshot()
    done = target.invoke("compact", sid)
    assert done.exit_code == 0, done.stderr
    assert ("the summarizer declined (Morph compaction declined: no API key (set "
            "MORPH_API_KEY)); nothing was compacted") in done.stderr
    assert "not compacted" in done.stdout
    assert target.snapshot() == before


def test_a_call_whose_turn_is_being_cancelled_is_not_offered_for_a_verdict(
        target: Target) -> None:
    """A parked turn nobody serves, cancelled from another shell: its call waits on the cancel,
    not on a verdict (`approvals list`, `sessions show` say so), an approval is refused with
    nothing written — it was accepted, reported done, and never ran — and the next resume
    closes the turn with the denial."""
    sid = target.parked()
    cancelled = target.run("cancel", str(sid), "--reason", "change freeze")  # another process
    assert cancelled.returncode == 0, cancelled.stderr
    (listed,) = target.json("approvals", "list", str(sid))
    assert (listed["call_id"], listed["waiting"]) == ("call-deploy", "cancel")
    shown = target.invoke("sessions", "show", str(sid))
    assert "call-deploy" in shown.stdout
    assert "(cancel requested: closing the turn denies it)" in shown.stdout, shown.stdout
    before = target.types(sid)
    for verdict in (["approve", str(sid), "call-deploy"],
                    ["deny", str(sid), "call-deploy", "--reason", "no"]):
        refused = target.invoke(*verdict)
        assert refused.exit_code == 1
        assert "Error: ApprovalNotPending:" in refused.stderr
        assert "cancel is recorded" in refused.stderr, refused.stderr
    assert target.types(sid) == before
    resumed = target.run("--json", "resume", str(sid), "--app", DEMO_APP)
    assert json.loads(resumed.stdout)["status"] == "cancelled", resumed.stderr
    verdicts = [e.payload for e in target.events(sid) if e.payload.wire_name ==
                "approval/resolved"]
    assert [v.verdict for v in verdicts] == ["denied"]  # type: ignore[attr-defined]


def test_a_second_cancel_writes_nothing_and_the_first_reason_stands(target: Target) -> None:
    """Two operators cancel the same turn from two shells: the second wrote another
    ``turn/cancel_requested`` whose reason replaced the first in ``turn/end`` and ``sessions
    show``; now it writes nothing and says whose cancel stands."""
    sid = target.parked()
    first = target.run("cancel", str(sid), "--reason", "change freeze")  # another process
    assert first.returncode == 0, first.stderr
    before = target.types(sid)
    again = target.json("cancel", str(sid), "--reason", "second thoughts")
    assert again["recorded"] is False and again["cancel"]["reason"] == "change freeze", again
    text = target.invoke("cancel", str(sid), "--reason", "third")
    assert text.exit_code == 0
    assert "cancel already recorded" in text.stdout and "change freeze" in text.stdout
    assert target.types(sid) == before
    resumed = target.run("--json", "resume", str(sid), "--app", DEMO_APP)
    assert json.loads(resumed.stdout)["status"] == "cancelled", resumed.stderr
    ends = [e.payload for e in target.events(sid) if e.payload.wire_name == "turn/end"]
    assert ends[-1].reason == "change freeze"  # type: ignore[attr-defined]


def test_a_closed_sessions_inbox_is_not_shown_as_queued(target: Target) -> None:
    sid = target.finished()
    assert target.run("inject", str(sid), "later, maybe").returncode == 0
    assert target.run("sessions", "close", str(sid)).returncode == 0
    shown = target.invoke("sessions", "show", str(sid)).stdout
    assert "inbox     1 never taken (the session is closed)" in shown, shown
    assert "queued" not in shown


def test_a_running_turn_no_live_worker_runs_says_so(target: Target) -> None:
    """The log says `running` after the process running the turn died mid-step; `sessions
    show` says that no live worker runs it (the `resumable` line says who may)."""
    writer = target.writer()
    sid = target.new_session()
    writer.execute(sid, lambda s: s.start_turn(trigger="user", text="status please"))
    writer.execute(sid, lambda s: s.start_step("demo:ops-model-1"))
    shown = target.invoke("sessions", "show", str(sid)).stdout
    assert "status    running (turn 1, step 1 open) — no live worker runs it" in shown, shown
    parked = target.invoke("sessions", "show", str(target.parked())).stdout
    assert "no live worker runs it" not in parked  # waiting on a verdict, not running


def test_show_of_a_session_past_a_halt_shows_it_and_says_the_views_are_behind(
        target: Target) -> None:
    """One bad event halts `status` and `title`; a session created after it was 'not found'
    by `sessions show` (exit 1, no warning) though the log and every other command had it.
    Now it is shown — its status folded from its log — with the stale warning and field."""
    broken = target.new_session()
    stream = session_stream(broken)
    target.store().append(stream, [NewRecord(uuid4(), "session/titled", b'{"title": 5}')],
                          target.store().stream_version(stream))
    made = target.run("--json", "sessions", "new", "--agent", "demo")  # another process
    assert made.returncode == 0, made.stderr
    sid = json.loads(made.stdout)["id"]
    assert target.run("inject", sid, "hello").returncode == 0
    shown = target.run("sessions", "show", sid)
    assert shown.returncode == 0, shown.stderr
    assert f"session   {sid}" in shown.stdout and "status    idle" in shown.stdout
    assert "inbox     1 queued" in shown.stdout  # from the log: the view never saw it
    (line,) = _stderr_lines(shown.stderr)
    assert line.startswith("warning: what follows is behind the log") and "halted" in line
    data = target.run("--json", "sessions", "show", sid)
    assert data.returncode == 0, data.stderr
    loaded = json.loads(data.stdout)
    assert loaded["status"] == "idle" and loaded["stale"]["projections"]["status"]["halted"]


def test_show_says_the_views_are_behind_when_the_sessions_view_never_saw_it(
        target: Target) -> None:
    """When the sessions view itself halted before the session: a typed error naming the
    halt, never 'no session'."""
    stream = session_stream(uuid4())
    target.store().append(stream, [NewRecord(uuid4(), "session/started", b"{not json")],
                          target.store().stream_version(stream))
    made = target.run("--json", "sessions", "new", "--agent", "demo")
    sid = json.loads(made.stdout)["id"]
    shown = target.run("sessions", "show", sid)
    assert shown.returncode == 1, shown.stdout
    error = one_line_error(shown.stderr)
    assert error.startswith(f"Error: ViewsBehind: session {sid} is in the log"), error
    assert "halted" in error and "SessionNotFound" not in shown.stderr
    # By a prefix too: the view it is looked up in never saw it.
    by_prefix = target.run("sessions", "show", sid[:8])
    assert by_prefix.returncode == 1, by_prefix.stdout
    error = one_line_error(by_prefix.stderr)
    assert error.startswith(f"Error: ViewsBehind: no session id starts with {sid[:8]}"), error
    assert "give the whole id" in error


def test_a_prefix_one_session_has_in_a_halted_sessions_view_is_not_taken_as_unique(
        target: Target) -> None:
    """One match in a halted sessions view was taken as the session meant: `sessions close`
    and `purge` acted on it while a session created past the halt starts the same way."""
    first = UUID("abcd1234-0000-4000-8000-" + uuid4().hex[:12])
    SessionCommands.on(target.store()).create(agent="demo", session_id=first)
    target.json("sessions", "list")  # the view holds it
    broken = session_stream(uuid4())
    target.store().append(broken, [NewRecord(uuid4(), "session/started", b"{not json")],
                          target.store().stream_version(broken))
    second = UUID("abcd1234-1111-4000-8000-" + uuid4().hex[:12])
    SessionCommands.on(target.store()).create(agent="demo", session_id=second)
    assert target.run("sessions", "list").returncode == 0  # the views meet the halt (said)
    before = target.snapshot()
    for args in (["sessions", "close", "abcd1234"], ["log", "abcd1234"],
                 ["budget", "show", "abcd1234"]):
        done = target.run(*args)
        assert done.returncode == 1, (args, done.stdout)
        error = one_line_error(done.stderr)
        assert error.startswith(f"Error: ViewsBehind: abcd1234 starts one session id in the "
                                f"sessions view ({first}), which is halted"), error
        assert error.endswith("give the whole id"), error
    assert target.snapshot() == before
    assert target.run("log", str(first)).returncode == 0  # the whole id still works


def test_a_model_spec_with_credentials_in_its_url_is_refused_unquoted(target: Target) -> None:
    """`model set` took `openai-compatible:m@http://bob:KEY@host/v1` and wrote the key into the
    log (model/set, then step/start) and `sessions show`. Refused now, the key not echoed, and
    through the Python API too (another process's runtime), nothing written."""
    sid = target.finished()
    before = target.types(sid)
    spec = "openai-compatible:text@http://bob:sk-live-TOPSECRET99@127.0.0.1:18431/v1"
    refused = target.run("model", "set", str(sid), "main", spec)
    assert refused.returncode == 2, refused.stderr
    assert "credentials" in refused.stderr and "TOPSECRET99" not in refused.stderr
    code = ("import sys; from terret import Actor, Runtime, StaticResolver, open_store\n"
            "from terret.domain.errors import InvalidPayload\n"
            "rt = Runtime(open_store(sys.argv[1]), resolver=StaticResolver())\n"
            "try:\n"
            "    rt.set_model(sys.argv[2], 'main', sys.argv[3], by=Actor(actor='operator'))\n"
            "except InvalidPayload as exc:\n"
            "    print('refused', 'TOPSECRET99' in str(exc))\n"
            "rt.close()\n")
    done = subprocess.run([sys.executable, "-c", code, target.uri, str(sid), spec],
                          capture_output=True, text=True, timeout=60, cwd=target.cwd,
                          env=subprocess_env())
    assert done.stdout.strip() == "refused False", done.stderr
    assert target.types(sid) == before


def test_chat_says_when_what_it_shows_comes_from_a_halted_view(target: Target) -> None:
    """A continued chat's `/usage` reads the views: from a halted one it was shown as
    current, no word said (`terret usage` warns). Its last exchanges come from the log, which
    a halted view does not make old: they are shown as they are."""
    sid = target.finished()
    other = session_stream(uuid4())
    target.store().append(other, [NewRecord(uuid4(), "assistant/message", b'{"text": 5}',
                                            b'{"schema_version":2}')],
                          target.store().stream_version(other))
    done = subprocess.run([sys.executable, "-m", "terret",
                           *target.args("chat", str(sid), "--app", DEMO_APP)],
                          input="/usage\n/quit\n", capture_output=True, text=True,
                          timeout=60, cwd=target.cwd, env=subprocess_env())
    assert done.returncode == 0, done.stderr
    assert "— the last exchanges —" in done.stdout and "you> status please" in done.stdout, \
        done.stdout
    assert "the messages view halted" not in done.stdout
    usage = done.stdout.split("/usage", 1)[1]
    assert usage.lstrip().startswith("(what follows may be old: the usage view halted"), usage


def test_show_of_a_running_session_past_a_halt_folds_its_status_and_owner_from_the_log(
        target: Target) -> None:
    """Past a halt of the status view, `sessions show` folded the status from the log but
    printed the sessions view's join of it — `idle (turn 1, step 1 open)`, owner none — for a
    session whose log has a turn running and an owner."""
    from terret.domain.events import AgentAttached

    broken = target.new_session()
    stream = session_stream(broken)
    target.store().append(stream, [NewRecord(uuid4(), "session/titled", b'{"title": 5}')],
                          target.store().stream_version(stream))
    sid = target.new_session()
    writer = target.writer()
    writer.execute(sid, lambda s: s.attach("agent-gone", "elsewhere", 999999, worker="w-gone"))
    writer.execute(sid, lambda s: s.start_turn(trigger="user", text="status please"))
    writer.execute(sid, lambda s: s.start_step("demo:ops-model-1"))
    shown = target.run("sessions", "show", str(sid))
    assert shown.returncode == 0, shown.stderr
    assert "status    running (turn 1, step 1 open) — no live worker runs it" in shown.stdout, \
        shown.stdout
    assert "owner     none" not in shown.stdout, shown.stdout
    data = json.loads(target.run("--json", "sessions", "show", str(sid)).stdout)
    assert data["status"] == "running" and data["owner"]["agent_id"] == "agent-gone", data
    assert AgentAttached.wire_name in target.types(sid)
