"""A turn a live ``terret serve`` holds parked is its owner's: ``sessions show`` says so (not
"resumable yes" pointing at ``terret resume``; ``--json``: ``resumable`` false), and ``terret
resume`` from another process is refused with one line, ``SessionOwned``, before saying
anything about the turn, with nothing written (docs/cli.md, *Exit codes and errors*,
``sessions show``, ``resume``). Once the server stopped and released the session, both say any
process may resume it, and ``resume`` does. On SQLite and on the EventStoreDB emulator.
"""

from __future__ import annotations

from tests.cli.conftest import Target, is_type, one_line_error
from tests.cli.docs_app import APP, new_session, run, serving, write_app


def test_resume_of_a_turn_a_live_server_owns_is_one_line_and_writes_nothing(
        target: Target) -> None:
    write_app(target)
    sid = new_session(target, "--agent", "ops")
    with serving(target):
        assert target.invoke("inject", str(sid), "deploy checkout v2", "--wake").exit_code == 0
        target.wait_for(sid, is_type("approval/requested", call_id="call-deploy"),
                        "the deploy to park on an approval")
        shown = target.json("sessions", "show", str(sid))
        assert shown["owner"]["lease"] == "live", shown["owner"]
        worker = shown["owner"]["worker"]
        # The log holds an open turn (open_turn), but no other process may resume it.
        assert shown["open_turn"] == 1 and shown["resumable"] is False, shown
        text = target.invoke("sessions", "show", str(sid)).stdout.splitlines()
        line = next(line for line in text if line.startswith("resumable "))
        assert line == (f"resumable no: worker {worker} (live) runs the turn; "
                        "`terret resume` elsewhere is refused"), line

        before = target.snapshot()
        done = run(target, "resume", str(sid), "--app", APP)
        assert done.returncode == 1, done.stderr
        assert done.stdout == ""
        error = one_line_error(done.stderr)
        assert error.startswith(f"Error: SessionOwned: session {sid} is owned by worker "
                                f"{worker}"), error
        assert done.stderr.strip() == error, done.stderr  # nothing said before it
        assert target.snapshot() == before

    # The server stopped (SIGTERM) and released the session: anyone may resume it now.
    assert target.types(sid)[-1] == "agent/detached"
    shown = target.json("sessions", "show", str(sid))
    assert shown["owner"] is None and shown["resumable"] is True, shown
    text = target.invoke("sessions", "show", str(sid)).stdout
    assert ("resumable yes, once decided: it waits on a verdict (above), and `terret serve` "
            f"takes it when one is recorded (`terret resume {sid}` waits for it here)") in text
    assert target.invoke("approve", str(sid), "call-deploy").exit_code == 0
    done = run(target, "resume", str(sid), "--app", APP)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "turn 1 completed"
    assert target.json("sessions", "show", str(sid))["resumable"] is False


def test_resume_of_an_unserved_parked_turn_still_says_what_it_waits_on(
        target: Target) -> None:
    """No live owner: the note about the verdict it waits for comes before the turn runs (the
    check that moved ahead of it let it through). Deny from this process unparks it."""
    import subprocess
    import sys
    import time

    from tests.cli.docs_app import app_env

    write_app(target)
    sid = target.parked(new_session(target, "--agent", "ops"))
    proc = subprocess.Popen([sys.executable, "-m", "terret",
                             *target.args("resume", str(sid), "--app", APP)],
                            cwd=target.cwd, env=app_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        target.wait_for(sid, is_type("agent/attached"), "the resume to take the session")
        time.sleep(0.3)
        assert target.invoke("deny", str(sid), "call-deploy", "--reason", "no").exit_code == 0
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0, err
    assert out.strip() == "turn 1 completed", (out, err)
    assert err.startswith("turn parked on call-deploy: waiting for a verdict"), err
    assert "Error" not in err, err
