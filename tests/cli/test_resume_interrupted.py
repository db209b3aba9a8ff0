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
