"""An app that defines agents serves those alone: the implicit ``default`` agent exists only
for an app that defines none (docs/cli.md, *The app*; docs/runtime.md, *The pieces*).

With docs/cli.md's ``myapp.py`` (agent ``ops`` only) a session of agent ``default`` — what
``terret sessions new`` without ``--agent`` creates — is left to another process: ``serve``
writes nothing to it and logs the documented warning; ``policy reset`` with that app refuses
it with ``ConfigurationError``, ``chat --agent default`` with a usage error. The default app
(one agent, ``default``) still serves it. On SQLite and on the EventStoreDB emulator.
"""

from __future__ import annotations

import subprocess
import sys
from uuid import UUID

from terret.domain.events import TurnEnded
from tests.cli.conftest import Target, is_type, one_line_error
from tests.cli.docs_app import APP, app_env, new_session, run, serving, write_app


def test_serve_leaves_a_default_session_alone_when_its_app_defines_other_agents(
        target: Target) -> None:
    write_app(target)
    with serving(target) as server:
        default = new_session(target)  # no --agent: agent `default`
        ops = new_session(target, "--agent", "ops")
        assert target.invoke("inject", str(default), "hello", "--wake").exit_code == 0
        before = target.types(default)
        # The ops session is served: once it parks, the server has seen the earlier wake too.
        assert target.invoke("inject", str(ops), "deploy checkout v2", "--wake").exit_code == 0
        target.wait_for(ops, is_type("approval/requested", call_id="call-deploy"),
                        "the ops session's deploy to park")
        server.wait_for("the warning for the default session",
                        lambda text: f"session {default}: " in text)
        assert target.types(default) == before == ["session/started", "inbox/queued"]
    mentions = [line for line in server.lines() if str(default) in line]
    assert mentions, server.text()
    for line in mentions:
        assert " WARNING " in line, line
        assert line.endswith("no agent definition named 'default'"), line
    assert target.types(default) == ["session/started", "inbox/queued"]


def test_policy_reset_with_an_app_that_does_not_define_the_agent_says_whose_floor_applies(
        target: Target) -> None:
    """The reset withdraws the recorded allow-list whatever the app: the floor of the app
    serving the session applies; the app given only says what that floor is here."""
    write_app(target)
    sid = new_session(target)
    done = run(target, "policy", "reset", str(sid), "--app", APP)
    assert done.returncode == 0, done.stderr
    assert "this app defines no agent 'default': that of the app serving it" in done.stdout
    assert target.types(sid)[-1] == "policy/reset"
    # The default app defines `default` (allowing nothing).
    reset = target.json("policy", "reset", str(sid))
    assert reset == {"floor": [], "patterns": None, "session": str(sid)}


def test_chat_refuses_agent_default_of_an_app_that_defines_other_agents(
        target: Target) -> None:
    write_app(target)
    before = target.snapshot()
    done = subprocess.run(
        [sys.executable, "-m", "terret", *target.args("chat", "--app", APP, "--agent",
                                                      "default")],
        capture_output=True, text=True, timeout=60, cwd=target.cwd, env=app_env(),
        input="hello\n/quit\n")
    # A usage error on --agent (docs/cli.md, `terret chat`), naming the app's agents.
    assert done.returncode == 2, (done.stdout, done.stderr)
    error = one_line_error(done.stderr)
    assert error.startswith("Error: BadParameter: ") and "'--agent'" in error, error
    assert "no agent definition named 'default'" in error and "ops" in error, error
    assert target.snapshot() == before  # no session was created


def test_the_default_app_still_serves_a_default_session(target: Target) -> None:
    """No ``--app``: the default app's one agent, ``default``, with the echo model."""
    from tests.cli.test_cross_process import Proc

    sid = new_session(target)
    server = Proc.start(target, "serve", "--grace", "5", views=str(target.cwd / "sv.db"))
    try:
        server.wait_line(lambda line: line.startswith("serving "), "serving line")
        assert target.invoke("inject", str(sid), "hello", "--wake").exit_code == 0
        end = target.wait_for(sid, is_type("turn/end"), "the turn to end").payload
        assert isinstance(end, TurnEnded) and end.status == "completed"
    finally:
        server.popen.terminate()
        code, _, err = server.finish()
    assert code == 0, err
    texts = [getattr(e.payload, "text", None) for e in target.events(sid)
             if e.wire_name == "assistant/message"]
    assert texts == ["(echo) hello"]


def _ended_turn(target: Target, sid: UUID) -> None:
    """A turn another process ran to its end (a reply, no tools), as its log shows it."""
    writer = target.writer()
    writer.execute(sid, lambda s: s.start_turn(trigger="user", text="status of the other app"))
    writer.execute(sid, lambda s: s.start_step("other:model"))
    writer.execute(sid, lambda s: (s.record_assistant("fine"), s.end_step(),
                                   s.end_turn("completed")))


def test_serve_titles_no_session_of_an_agent_its_app_does_not_define(target: Target) -> None:
    """Between-turn upkeep is a write too: the untitled session of another app's agent is left
    to that app's processes, at start and when one of its turns ends while serving."""
    write_app(target)
    before_start = target.new_session(agent="other")
    _ended_turn(target, before_start)
    ops = new_session(target, "--agent", "ops")
    with serving(target):
        during = target.new_session(agent="other")
        _ended_turn(target, during)
        # The server sees the ops wake after the other session's turn/end: once it parks,
        # the upkeep for that turn/end was queued, and a graceful stop lets it finish.
        assert target.invoke("inject", str(ops), "deploy checkout v2", "--wake").exit_code == 0
        target.wait_for(ops, is_type("approval/requested"), "the ops session to park")
    for sid in (before_start, during):
        assert "session/titled" not in target.types(sid), target.types(sid)
        assert target.types(sid)[-1] == "turn/end"
