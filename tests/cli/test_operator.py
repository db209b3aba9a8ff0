"""What an operator meets at the command line (issue 15; the owner and workers of issue 13), on
SQLite and on the EventStoreDB emulator: ids by prefix, filters and paging, the log's options,
``--json`` anywhere and errors as JSON, views behind the log said as such, the small truths
(deny-all said explicitly, the floor, a model spec the app cannot resolve, a second compaction
of nothing new), and — with ``terret serve`` in another process — who owns a session and
whether its lease is live."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from uuid import UUID, uuid4

import pytest

from terret.domain.events import Actor, ModelSet, PolicyReset
from terret.domain.store import NewRecord, session_stream
from terret.runtime.commands import SessionCommands
from tests.cli.conftest import (
    DEMO_APP,
    DEPLOY_ARGS,
    MISSING,
    Target,
    one_line_error,
    subprocess_env,
)
from tests.cli.test_cross_process import STARTED, Proc

# --- finding things --------------------------------------------------------------------------


def _with_id(target: Target, sid: str, agent: str = "demo") -> UUID:
    return SessionCommands.on(target.store()).create(
        agent=agent, roles={"main": "demo:ops-model-1"}, session_id=UUID(sid))


def test_session_ids_by_unique_prefix(target: Target) -> None:
    tail = uuid4().hex[:12]
    one = _with_id(target, f"abcd0000-0000-4000-8000-{tail}")
    _with_id(target, f"abcd1111-0000-4000-8000-{tail}")
    assert target.json("sessions", "show", "abcd0")["id"] == str(one)
    assert target.json("sessions", "show", "ABCD00")["id"] == str(one)  # any case
    # Digits count, dashes do not: past the first group, with or without its dash.
    assert target.json("sessions", "show", "abcd000000004")["id"] == str(one)
    assert target.json("sessions", "show", "abcd0000-0000-4")["id"] == str(one)

    before = target.snapshot()
    ambiguous = target.invoke("sessions", "show", "abcd")
    assert ambiguous.exit_code == 2
    line = one_line_error(ambiguous.stderr)
    assert "BadParameter" in line and "ambiguous" in line and str(one) in line, line
    assert "abcd1111-0000-4000-8000" in line
    nothing = target.invoke("inject", "fedcba98", "hi")
    assert nothing.exit_code == 1
    assert "SessionNotFound" in one_line_error(nothing.stderr)
    for bad in ("abc", "xyzw", "abcd!"):  # too short, not hex
        result = target.invoke("sessions", "show", bad)
        assert result.exit_code == 2 and "is not a session id" in one_line_error(result.stderr)
    assert target.snapshot() == before

    # A call id by a unique prefix of a pending call's.
    parked = target.parked()
    approved = target.json("approve", str(parked)[:8], "call-d")
    assert approved == {"call_id": "call-deploy", "session": str(parked),
                        "verdict": "approved", "tool": "deploy", "args": DEPLOY_ARGS}


def test_sessions_list_filters_and_paging(target: Target) -> None:
    ops = [_with_id(target, str(uuid4()), agent="ops-filter") for _ in range(3)]
    titled = target.finished(title="Rotate the payments keys")
    SessionCommands.on(target.store()).set_title(ops[0], "Payments outage review",
                                                 by=_operator())
    mine = target.json("sessions", "list", "--agent", "ops-filter")
    assert {s["id"] for s in mine} == {str(s) for s in ops}
    payments = target.json("sessions", "list", "--title", "PAYMENTS")
    assert {s["id"] for s in payments} >= {str(titled), str(ops[0])}
    assert all("payments" in s["title"].lower() for s in payments)
    accented = target.finished(title="ÉCOLE naïve Straße")  # any script's letters, any case
    for part in ("école", "NAÏVE", "STRASSE", "straße"):
        assert [s["id"] for s in target.json("sessions", "list", "--title", part)] == [
            str(accented)], part
    assert target.json("sessions", "list", "--agent", "ops-filter", "--since", "1h")
    assert target.json("sessions", "list", "--agent", "ops-filter", "--until", "1h") == []
    assert target.json("sessions", "list", "--agent", "ops-filter",
                       "--since", "2000-01-01", "--until", "2999-01-01")

    first = target.invoke("--json", "sessions", "list", "--agent", "ops-filter", "--limit", "2")
    assert first.exit_code == 0
    assert "showing 1–2; more with --offset 2" in first.stderr
    rest = target.json("sessions", "list", "--agent", "ops-filter", "--limit", "2",
                       "--offset", "2")
    pages = [s["id"] for s in json.loads(first.stdout)] + [s["id"] for s in rest]
    assert sorted(pages) == sorted(str(s) for s in ops) and len(rest) == 1
    bad = target.invoke("sessions", "list", "--since", "yesterday-ish")
    assert bad.exit_code == 2 and "neither a date" in one_line_error(bad.stderr)


def test_log_tail_timestamps_full_and_types(target: Target) -> None:
    sid = target.finished()
    every = target.invoke("log", str(sid)).stdout.splitlines()
    tail = target.invoke("log", str(sid), "--tail", "3").stdout.splitlines()
    assert tail == every[-3:]
    results = target.invoke("log", str(sid), "--type", "step/end", "--tail", "1").stdout
    assert len(results.splitlines()) == 1 and "step/end" in results and " 2 " in results
    stamped = target.invoke("log", str(sid), "-t").stdout.splitlines()
    assert stamped[0].split()[1].count("-") == 2  # 2026-12-01 21:26:08.123
    full = target.invoke("log", str(sid), "--full", "--type", "assistant/message").stdout
    first = full.splitlines()[0]
    data = json.loads(first.split("assistant/message", 1)[1])
    assert data["tool_calls"][0]["args"] == {"service": "checkout"}

    before = target.snapshot()
    unknown = target.invoke("log", str(sid), "--type", "turn/ned")
    assert unknown.exit_code == 2
    line = one_line_error(unknown.stderr)
    assert "no event type 'turn/ned'" in line and "turn/end" in line
    assert unknown.stdout == ""
    # An extension event this process does not know, found in the log, is a fine --type.
    stream = session_stream(sid)
    target.store().append(stream, [NewRecord(uuid4(), "acme.review/verdict", b'{"score":5}',
                                             b'{"schema_version":1}')],
                          target.store().stream_version(stream))
    found = target.invoke("log", str(sid), "--type", "acme.review/verdict")
    assert found.exit_code == 0 and "acme.review/verdict" in found.stdout
    assert target.snapshot()[: len(before)] == before


def test_json_after_the_command_and_errors_as_json(target: Target) -> None:
    sid = target.finished()
    after = target.invoke("sessions", "show", str(sid), "--json")
    assert after.exit_code == 0 and json.loads(after.stdout)["id"] == str(sid)
    assert json.loads(target.invoke("usage", "--json", str(sid)).stdout)[str(sid)]["steps"] == 2
    # Not after `--`: there it is text (here: refused as an option nowhere, a title).
    titled = target.invoke("title", str(sid), "--", "--json")
    assert titled.exit_code == 0 and titled.stdout.strip() == "--json"

    for args, code, kind in ((["sessions", "show", MISSING], 1, "SessionNotFound"),
                             (["sessions", "show", "x", "--json"], 2, "BadParameter"),
                             (["frobnicate", "--json"], 2, "NoSuchCommand")):
        result = target.invoke(*args) if "--json" in args else target.invoke("--json", *args)
        assert result.exit_code == code
        error = json.loads(result.stdout)["error"]
        assert error["type"] == kind and error["exit_code"] == code and error["message"]
        assert one_line_error(result.stderr) == f"Error: {kind}: {error['message']}"


# --- views behind the log ----------------------------------------------------------------------


def test_views_behind_the_log_are_said_so(target: Target) -> None:
    sid = target.finished()
    target.parked()  # something for `approvals list` to list
    fresh = target.invoke("sessions", "list")
    assert fresh.exit_code == 0 and "warning" not in fresh.stderr
    assert all("stale" not in s for s in target.json("sessions", "list"))
    # An event the projections cannot decode halts them: what they show stops there.
    broken = target.new_session()
    stream = session_stream(broken)
    target.store().append(stream, [NewRecord(uuid4(), "turn/start", b"{not json")],
                          target.store().stream_version(stream))
    target.invoke("inject", str(sid), "after the break")
    # The title, policy and usage views do not read turn/start (and the session index counts
    # a record it cannot decode): they are whole, and nothing is said.
    for args in (["title", str(sid)], ["policy", "show", str(sid)], ["usage"]):
        quiet = target.invoke(*args)
        assert quiet.exit_code == 0 and "warning" not in quiet.stderr, (args, quiet.stderr)
        assert "stale" not in target.json(*args)
    for args in (["sessions", "list"], ["sessions", "show", str(sid)], ["approvals", "list"]):
        text = target.invoke(*args)
        assert text.exit_code == 0, (args, text.stderr)
        warnings = [line for line in text.stderr.splitlines() if line.startswith("warning: ")]
        assert len(warnings) == 1, (args, text.stderr)
        assert "behind the log" in warnings[0] and "halted at position" in warnings[0]
        data = target.json(*args)
        items = data if isinstance(data, list) else [data]
        for item in items:
            assert item["stale"]["behind"] >= 1, (args, item)
            halted = [p for p in item["stale"]["projections"].values() if p["halted"]]
            assert halted and halted[0]["halted"]["error"], (args, item)
    shown = target.json("sessions", "show", str(sid))
    assert shown["stale"]["head"] == target.store().head_position()
    # doctor does not contradict itself: halted projections are problems, never "equal".
    doctor = target.invoke("--json", "doctor")
    assert doctor.exit_code == 1
    report = json.loads(doctor.stdout)
    assert not report["ok"] and any("halted" in p for p in report["problems"])
    assert "every projection equals a rebuild from the log" not in report["checks"]
    halted_names = [s["name"] for s in target.json("projections", "status") if s["halted"]]
    for check in report["checks"]:
        assert not any(name in check.split("equal a rebuild")[0] for name in halted_names
                       if "equal a rebuild" in check), check
    # Skipped, they catch up: nothing more to say.
    for status in target.json("projections", "status"):
        if status["halted"]:
            assert target.invoke("projections", "skip", status["name"]).exit_code == 0
    again = target.invoke("sessions", "list")
    assert "warning" not in again.stderr, again.stderr
    assert all("stale" not in s for s in target.json("sessions", "list"))


# --- small truths ------------------------------------------------------------------------------


def _operator() -> Actor:
    return Actor(actor="operator", id="test")


def test_policy_deny_all_reset_and_the_floor(target: Target) -> None:
    commands = SessionCommands.on(target.store())
    sid = commands.create(agent="demo", roles={"main": "demo:ops-model-1"},
                          policy_floor=["service_status"])
    shown = target.json("policy", "show", str(sid))
    assert shown == {"session": str(sid), "patterns": None, "floor": ["service_status"]}
    text = target.invoke("policy", "show", str(sid)).stdout
    assert "floor at the session's start: service_status (a release serving it now" in text

    before = target.snapshot()
    nothing = target.invoke("policy", "set", str(sid))
    assert nothing.exit_code == 2 and "--deny-all" in one_line_error(nothing.stderr)
    both = target.invoke("policy", "set", str(sid), "x", "--deny-all")
    assert both.exit_code == 2
    assert target.snapshot() == before
    assert target.json("policy", "set", str(sid), "--deny-all")["patterns"] == []
    # The reset withdraws the recorded patterns (policy/reset): the floor of the release
    # serving each call applies, not the one recorded at the start (R32); the app says which.
    reset = target.json("policy", "reset", str(sid), "--app", DEMO_APP)
    assert reset == {"session": str(sid), "patterns": None,
                     "floor": ["service_status", "deploy"]}
    assert isinstance(target.events(sid)[-1].payload, PolicyReset)
    assert target.json("policy", "show", str(sid))["patterns"] is None
    unknown = target.json("policy", "reset", str(sid))  # the default app has no `demo`
    assert unknown == {"session": str(sid), "patterns": None, "floor": None}


def test_model_set_is_checked_against_the_app(target: Target,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENROUTER_API_KEY", raising=False)
    monkeypatch.delenv("TERRET_PROVIDERS_FILE", raising=False)
    sid = target.new_session()
    before = target.snapshot()
    refused = target.invoke("model", "set", str(sid), "main", "nosuchprovider:x")
    assert refused.exit_code == 2
    line = one_line_error(refused.stderr)
    assert "nosuchprovider" in line and "--force" in line, line
    demo = target.invoke("model", "set", str(sid), "main", "demo:y")  # not in the default app
    assert demo.exit_code == 2
    assert target.snapshot() == before
    assert target.invoke("model", "set", str(sid), "main", "demo:y", "--app",
                         DEMO_APP).exit_code == 0
    forced = target.invoke("model", "set", str(sid), "main", "nosuchprovider:x", "--force")
    assert forced.exit_code == 0, forced.stderr
    # A provider the app has, without its key in this shell: recorded, with a warning.
    keyless = target.invoke("model", "set", str(sid), "titler", "openrouter:openai/gpt-4o")
    assert keyless.exit_code == 0, keyless.stderr
    assert "warning:" in keyless.stderr and "OPENROUTER_API_KEY" in keyless.stderr
    specs = [e.payload.spec for e in target.events(sid) if isinstance(e.payload, ModelSet)]
    assert specs == ["demo:y", "nosuchprovider:x", "openrouter:openai/gpt-4o"]


PASTED_KEY = "sk-or-v1-PASTED0123456789abcdef0123456789"


@pytest.mark.parametrize("line", [f'api_key = "{PASTED_KEY}"',  # refused as unknown field
                                  f'api_key_env = "{PASTED_KEY}"',  # not a variable's name
                                  f'api_key_env = "{PASTED_KEY.replace("-", "_")}x y"'])
def test_a_key_pasted_into_the_providers_file_is_refused_without_quoting_it(
        target: Target, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, line: str) -> None:
    """docs/providers.md: a key pasted into the file fails loudly, and keys never appear in
    error messages. pydantic's refusal quoted the input; a key given as ``api_key_env`` was
    accepted and then written into the turn's recorded error as the variable's "name"."""
    config = tmp_path / "providers.toml"
    config.write_text(f'[endpoints.vllm]\nbase_url = "http://127.0.0.1:9/v1"\n{line}\n')
    monkeypatch.setenv("TERRET_PROVIDERS_FILE", str(config))
    sid = target.new_session()
    before = target.snapshot()
    for argv in (["model", "set", str(sid), "main", "vllm:m"],
                 ["--json", "model", "set", str(sid), "main", "vllm:m"]):
        refused = target.invoke(*argv)
        assert refused.exit_code == 2, refused.output
        shown = refused.stdout + refused.stderr
        assert "provider configuration" in shown and "endpoints.vllm.api_key" in shown, shown
        assert PASTED_KEY not in shown and "PASTED0123" not in shown, shown
    assert target.snapshot() == before


def test_compacting_a_session_the_model_has_seen_nothing_of_declines(target: Target) -> None:
    """A new session: nothing to summarize — it wrote an empty summary, which the model was
    then shown as the start of its history."""
    sid = target.new_session()
    before = target.snapshot()
    refused = target.run("compact", str(sid), "--app", DEMO_APP)  # another process
    assert refused.returncode == 1, refused.stderr
    line = one_line_error(refused.stderr)
    assert "CompactionDeclined" in line and "nothing the model sees is new yet" in line, line
    assert target.snapshot() == before


def test_compacting_twice_declines(target: Target) -> None:
    sid = target.finished()
    first = target.json("compact", str(sid), "--app", DEMO_APP)
    assert first["upto_seq"] is not None
    before = target.snapshot()
    again = target.invoke("compact", str(sid), "--app", DEMO_APP)
    assert again.exit_code == 1
    line = one_line_error(again.stderr)
    assert "CompactionDeclined" in line and "nothing the model sees is new" in line
    assert target.snapshot() == before
    target.invoke("inject", str(sid), "one more thing")  # not model-visible yet: still nothing
    assert target.invoke("compact", str(sid), "--app", DEMO_APP).exit_code == 1


def test_compact_refuses_a_turn_parked_before_its_first_step(target: Target) -> None:
    """docs/cli.md: compaction runs between turns only. A turn parked on its budget before its
    first step owes no tool result, yet a summary then would swallow its user message."""
    writer = target.writer()
    sid = target.finished()
    writer.execute(sid, lambda s: s.set_budget(0.5, by=Actor(actor="operator")))
    writer.execute(sid, lambda s: s.start_turn(trigger="user", text="the question still open"))
    writer.execute(sid, lambda s: s.park_on_budget(limit=0.5, spent=0.75, estimate=0.1))
    before = target.snapshot()
    refused = target.run("compact", str(sid), "--app", DEMO_APP)  # another process
    assert refused.returncode == 1, refused.stderr
    line = one_line_error(refused.stderr)
    assert line.startswith("Error: CompactionDeclined: turn 2 is open"), line
    assert target.snapshot() == before
    assert target.invoke("cancel", str(sid)).exit_code == 0
    resumed = target.invoke("resume", str(sid), "--app", DEMO_APP)  # closes it cancelled
    assert resumed.exit_code == 0, resumed.stderr
    done = target.json("compact", str(sid), "--app", DEMO_APP)  # between turns again
    assert done["upto_seq"] is not None


def test_text_shows_json_args_costs_and_steps(target: Target) -> None:
    parked = target.parked()
    listed = target.invoke("approvals", "list", str(parked)).stdout
    assert '{"service": "checkout", "version": "v2"}' in listed
    sid = target.finished()
    shown = target.invoke("sessions", "show", str(sid)).stdout
    assert "$0.750000, 2 steps" in shown and "$0.500000, 1 step\n" in shown
    assert "1 steps" not in shown
    usage = target.invoke("usage", str(sid)).stdout
    assert "$0.750000" in usage
    chat = target.invoke("chat", "--app", DEMO_APP, input="hello\n/quit\n")
    assert chat.exit_code == 0 and "\x1b[" not in chat.stdout  # no colour off a terminal


def test_resume_names_the_call_it_waits_for(sqlite_target: Target) -> None:
    t = sqlite_target
    sid = t.parked()
    resume = Proc.start(t, "resume", str(sid), "--app", DEMO_APP)
    note = resume.wait_line(lambda line: "waiting for a verdict" in line, "the waiting note")
    assert f"terret approve {sid} call-deploy" in note and "CALL_ID" not in note
    assert Proc.start(t, "approve", str(sid), "call-deploy").finish()[0] == 0
    assert resume.finish()[0] == 0


def test_resume_says_when_the_resumed_turn_parks_on_an_approval(target: Target) -> None:
    """`terret resume` said what the turn waited on only when it was parked before the resume
    began: a turn that reached an approval while resumed (a crash left its deploy call owed)
    waited in silence, the command looking hung. Said now, and approved from another shell."""
    from terret.domain.events import ToolCallData
    from tests.cli.conftest import DEPLOY_ARGS

    writer = target.writer()
    sid = target.new_session()
    writer.execute(sid, lambda s: s.start_turn(trigger="user", text="deploy v2"))
    writer.execute(sid, lambda s: s.start_step("demo:ops-model-1"))
    writer.execute(sid, lambda s: s.record_assistant(
        "", [ToolCallData(id="call-deploy", name="deploy", args=DEPLOY_ARGS)]))
    resume = Proc.start(target, "resume", str(sid), "--app", DEMO_APP)
    note = resume.wait_line(lambda line: "waiting for a verdict" in line, "the waiting note")
    assert f"terret approve {sid} call-deploy" in note
    assert Proc.start(target, "approve", str(sid), "call-deploy").finish()[0] == 0
    code, out, err = resume.finish()
    assert code == 0, err
    assert err.count("waiting for a verdict") == 1 and "completed" in out


def test_shell_completion_of_session_ids(target: Target) -> None:
    sid = target.finished()
    target.invoke("sessions", "list")  # the views know it
    env = {**subprocess_env(), "_TERRET_COMPLETE": "bash_complete",
           "COMP_WORDS": f"terret --store {target.uri} --views {target.views} sessions show "
                         f"{str(sid)[:6]}",
           "COMP_CWORD": "7"}
    done = subprocess.run([sys.executable, "-m", "terret"], env=env, capture_output=True,
                          text=True, timeout=60, cwd=target.cwd)
    assert done.returncode == 0, done.stderr
    assert f"plain,{sid}" in done.stdout.splitlines(), done.stdout
    script = subprocess.run([sys.executable, "-m", "terret"], capture_output=True, text=True,
                            env={**subprocess_env(), "_TERRET_COMPLETE": "bash_source"},
                            timeout=60)
    assert "_terret_completion" in script.stdout


def test_shell_completion_gives_up_on_an_unreachable_store_soon(tmp_path: Path) -> None:
    """A person waits on the Tab key: completion against a store that does not answer ends
    with nothing after two seconds (not the commands' ten), or the line's own
    --store-timeout."""
    def complete(line: str) -> float:
        words = line.split()
        env = {**subprocess_env(), "_TERRET_COMPLETE": "bash_complete",
               "COMP_WORDS": line, "COMP_CWORD": str(len(words) - 1)}
        began = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "terret"], env=env, capture_output=True,
                              text=True, timeout=60, cwd=tmp_path)
        assert done.returncode == 0 and done.stdout.strip() == "", (done.stdout, done.stderr)
        return time.monotonic() - began

    unreachable = "esdb://127.0.0.1:1?Tls=false"
    assert complete(f"terret --store {unreachable} sessions show ab") < 8
    assert complete(f"terret --store {unreachable} --store-timeout 0.5 sessions show ab") < 5


# --- who serves a session: a serving process beside the CLI -----------------------------------


def test_owner_and_workers_beside_a_serving_process(target: Target) -> None:
    sid = target.new_session()
    serve = Proc.start(target, "serve", "--app", DEMO_APP, "--grace", "2",
                       views=str(target.cwd / "serve-views.db"))
    try:
        serve.wait_line(lambda line: line.startswith("serving "), "the serving line")
        assert target.invoke("inject", str(sid), "Check the checkout service and deploy v2",
                             "--wake").exit_code == 0
        target.wait_for(sid, lambda e: e.wire_name == "approval/requested", "a parked deploy")

        shown = target.json("sessions", "show", str(sid))
        owner = shown["owner"]
        assert owner["lease"] == "live" and owner["pid"] == serve.popen.pid, owner
        assert owner["process"] == "running" and owner["worker"].count(":") == 2
        text = target.invoke("sessions", "show", str(sid)).stdout
        assert f"pid {serve.popen.pid}, lease live (last beat " in text
        row = next(line for line in target.invoke("sessions", "list").stdout.splitlines()
                   if line.startswith(str(sid)))
        assert f":{serve.popen.pid} live" in row
        workers = target.json("workers")
        mine = [w for w in workers if w["pid"] == serve.popen.pid]
        assert len(mine) == 1 and mine[0]["live"] and mine[0]["worker"] == owner["worker"]
        assert mine[0]["agents"] == ["demo"], mine  # the sessions it serves
        deadline = time.monotonic() + 20  # the sessions it owns arrive with its next beat
        while str(sid) not in mine[0]["sessions"] and time.monotonic() < deadline:
            time.sleep(0.2)
            mine = [w for w in target.json("workers") if w["pid"] == serve.popen.pid]
        assert str(sid) in mine[0]["sessions"], mine
        listed = target.invoke("workers").stdout
        assert owner["worker"] in listed and "live" in listed

        # Killed: on this host its lease is expired at once (its process is gone).
        serve.popen.send_signal(signal.SIGKILL)
        serve.finish()
        gone = target.json("sessions", "show", str(sid))["owner"]
        assert gone["lease"] == "expired" and gone["process"] == "gone", gone
        assert "its process is gone" in target.invoke("sessions", "show", str(sid)).stdout
        assert not [w for w in target.json("workers") if w["pid"] == serve.popen.pid]
        every = [w for w in target.json("workers", "--all") if w["pid"] == serve.popen.pid]
        assert every and not every[0]["live"] and every[0]["process"] == "gone"
        assert "gone" in target.invoke("workers", "--all").stdout
    finally:
        if serve.popen.poll() is None:
            os.kill(serve.popen.pid, signal.SIGKILL)
        STARTED.clear()


def test_a_verdict_is_bound_to_the_request_the_operator_decided_on(target: Target) -> None:
    """A model may ask again under the same call id with other arguments (after the reaper's
    timeout, say): an approval given for what `approvals list` showed ran the other request.
    `--tool`/`--args` bind the verdict to what was looked at; without them the command says
    which request it decided."""
    sid = target.parked()
    before = target.snapshot()
    other = target.invoke("approve", str(sid), "call-deploy", "--tool", "deploy", "--args",
                          '{"service": "checkout", "version": "v3"}')
    assert other.exit_code == 1, other.stderr
    assert one_line_error(other.stderr).startswith("Error: ApprovalNotPending: ")
    assert target.invoke("approve", str(sid), "call-deploy", "--tool", "migrate").exit_code == 1
    assert target.invoke("approve", str(sid), "call-deploy", "--args", "{}").exit_code == 2
    assert target.invoke("approve", str(sid), "call-deploy", "--tool", "deploy",
                         "--args", "[1]").exit_code == 2
    for odd in ('{"x": NaN}', '{"x": ' + "[" * 50_000 + "]" * 50_000 + "}"):
        refused = target.invoke("approve", str(sid), "call-deploy", "--tool", "deploy",
                                "--args", odd)  # not JSON; nested past any call's arguments
        assert refused.exit_code == 2 and "Invalid value for '--args'" in refused.stderr
    assert target.snapshot() == before  # nothing written

    done = target.run("approve", str(sid), "call-deploy", "--tool", "deploy", "--args",
                      json.dumps(DEPLOY_ARGS))  # another process, bound to what it saw
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"approved call-deploy: deploy {json.dumps(DEPLOY_ARGS)}"
    assert "approval/resolved" in target.types(sid)


def test_an_approval_the_policy_will_veto_says_so(target: Target) -> None:
    """R9: an approved call goes through the allow-list again when it runs. An approval after
    a policy that no longer allows the tool printed "approved" and the call never ran."""
    frozen, allowed = target.parked(), target.parked()
    assert target.invoke("policy", "set", str(frozen), "fs.*").exit_code == 0
    assert target.invoke("policy", "set", str(allowed), "deploy").exit_code == 0
    done = target.run("approve", str(frozen), "call-deploy")  # another process
    assert done.returncode == 0, done.stderr
    assert "does not allow deploy: the call will be vetoed when it runs" in done.stderr
    assert done.stdout.startswith("approved call-deploy")
    other = target.run("approve", str(allowed), "call-deploy")
    assert other.returncode == 0 and "vetoed" not in other.stderr, other.stderr


def test_the_api_binds_a_verdict_too_and_refuses_a_blank_denial() -> None:
    from terret import Actor, Runtime, ScriptedProvider, StaticResolver
    from terret.adapters.stores.memory import MemoryStore
    from terret.domain.errors import ApprovalNotPending, InvalidPayload
    from terret.domain.events import ToolCallData
    from terret.runtime.commands import SessionCommands

    store = MemoryStore()
    commands = SessionCommands.on(store)
    sid = commands.create(agent="default", roles={"main": "scripted:m"})
    writer = commands.writer
    writer.execute(sid, lambda s: s.start_turn(text="deploy"))
    writer.execute(sid, lambda s: s.start_step("scripted:m"))
    writer.execute(sid, lambda s: s.record_assistant(
        "", [ToolCallData(id="c1", name="deploy", args={"env": "prod"})]))
    writer.execute(sid, lambda s: s.request_approval("c1", "deploy", {"env": "prod"}))
    rt = Runtime(store, resolver=StaticResolver({"scripted": ScriptedProvider()}))
    operator = Actor(actor="operator", id="t")
    with pytest.raises(ApprovalNotPending):
        rt.approve(sid, "c1", by=operator, name="deploy", args={"env": "staging"})
    with pytest.raises(InvalidPayload):
        rt.deny(sid, "c1", by=operator, reason="  ")
    rt.approve(sid, "c1", by=operator, name="deploy", args={"env": "prod"})
    assert [r.wire_name for r in store.read_stream(f"session-{sid}")][-1] == "approval/resolved"
    rt.close()


def test_a_cancelled_turn_that_owes_a_tool_this_app_lacks_is_closed_by_resume(
        target: Target) -> None:
    """The refusal of a turn owing a tool the app lacks says "or close the turn with a
    cancel"; but with the cancel recorded, resume (and serve) still refused it, and the turn
    could never be closed. A cancelled turn runs no call: resume closes it cancelled."""
    sid = target.parked(target.new_session(agent="default"))  # owes `deploy`
    refused = Proc.start(target, "resume", str(sid)).finish()  # the default app has no deploy
    assert refused[0] == 1 and "ConfigurationError" in refused[2] and "cancel" in refused[2]
    assert target.run("cancel", str(sid)).returncode == 0
    code, out, err = Proc.start(target, "resume", str(sid)).finish()
    assert code == 0, err
    assert "cancelled" in out
    (end,) = [e for e in target.events(sid) if e.wire_name == "turn/end"]
    assert end.payload.status == "cancelled"
    assert not [e for e in target.events(sid) if e.wire_name == "tool/started"]
