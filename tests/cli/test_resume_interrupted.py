"""Ctrl-C on ``terret resume`` waiting for a verdict leaves the turn open (docs/cli.md,
``terret resume``): no ``turn/end``, the call still pending, the session released
(``agent/detached``), one ``Error: TurnSuspended: …`` line, exit 1. Another process then
approves and resumes the same turn to its end. On SQLite and on the EventStoreDB emulator.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from tests.cli.conftest import Target, is_type
from tests.cli.docs_app import APP, app_env, new_session, run, write_app


def test_ctrl_c_on_a_resume_parked_on_an_approval_leaves_the_turn_open(target: Target) -> None:
    write_app(target)
    sid = target.parked(new_session(target, "--agent", "ops"))
    proc = subprocess.Popen([sys.executable, "-m", "terret",
                             *target.args("resume", str(sid), "--app", APP)],
                            cwd=target.cwd, env=app_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        target.wait_for(sid, is_type("agent/attached"), "the resume to take the session")
        time.sleep(0.5)  # parked on the verdict
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 1, err
    assert out == ""
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    lines = err.strip().splitlines()
    assert lines[0].startswith("turn parked on call-deploy: waiting for a verdict"), err
    assert lines[1] == "interrupted: the parked turn stops now and stays open", err
    assert lines[-1] == (f"Error: TurnSuspended: interrupted: turn 1 of {sid} stays open; "
                         f"resume it with `terret resume {sid}` or `terret serve`"), err

    types = target.types(sid)
    assert "turn/end" not in types and "tool/result" not in types, types
    assert types[-1] == "agent/detached", types
    shown = target.json("sessions", "show", str(sid))
    assert shown["open_turn"] == 1 and shown["resumable"] is True, shown
    assert [p["call_id"] for p in shown["pending_approvals"]] == ["call-deploy"], shown

    # The same turn, resumed by another process after a verdict from a third.
    assert target.invoke("approve", str(sid), "call-deploy").exit_code == 0
    done = run(target, "resume", str(sid), "--app", APP)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "turn 1 completed"
    ends = [e for e in target.events(sid) if e.wire_name == "turn/end"]
    assert [(e.payload.turn, e.payload.status) for e in ends] == [(1, "completed")], ends


def test_a_released_parked_turn_cancelled_then_resumed_says_its_call_was_not_run(
        target: Target) -> None:
    """A chat left a turn parked (it released the session: no call was under way). A cancel,
    then a late approval (refused: the cancel denies the call), from two other processes; the
    resume closes the turn ``cancelled`` and says so first — not "waiting for a verdict" —
    and the call's result says it was not run (it never was), not that it "may have run",
    which is for an owner that crashed."""
    write_app(target)
    chat = subprocess.run([sys.executable, "-m", "terret",
                           *target.args("chat", "--app", APP, "--agent", "ops")],
                          input="deploy checkout v2\n", capture_output=True, text=True,
                          timeout=60, cwd=target.cwd, env=app_env())
    assert chat.returncode == 0, chat.stderr
    sid = chat.stdout.rsplit("terret chat ", 1)[1].split()[0]
    assert target.types(sid)[-1] == "agent/detached"
    assert target.invoke("cancel", sid, "--reason", "c1").exit_code == 0
    late = target.invoke("approve", sid, "call-deploy", "--reason", "late")
    assert late.exit_code == 1 and "cancel is recorded" in late.stderr  # it would never run

    done = run(target, "resume", sid, "--app", APP)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "turn 1 cancelled"
    assert done.stderr.strip() == ("a cancel of turn 1 is recorded: it closes cancelled, its "
                                   "pending calls denied"), done.stderr
    results = [e.payload for e in target.events(sid)
               if e.wire_name == "tool/result" and e.payload.call_id == "call-deploy"]
    assert [(r.is_error, r.content) for r in results] == [
        (True, "deploy was not run: the turn ended cancelled: c1")], results
