"""What an outside tester found following docs/cli.md, each held to what the page says: a
negative budget refused for its amount, an unknown chat agent a usage error, views behind the
log said in the documented `warning:` line only, error messages naming their parameter, the
default app's environment checked when it is built, a views file that is the store's own
refused, and help text in step with the page."""

from __future__ import annotations

from uuid import UUID

from tests.cli.conftest import DEMO_APP, Target, one_line_error

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
