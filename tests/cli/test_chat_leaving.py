"""``terret chat`` whose input ends at an approval question (a script piping its lines, or
Ctrl-D there) leaves the call pending and the turn open, and releases the session
(``agent/detached``) every time, so a running ``serve`` — or any process — takes the parked
turn over at once, not after the lease expires. On SQLite and on the EventStoreDB emulator.
"""

from __future__ import annotations

import subprocess
import sys

from tests.cli.conftest import Target
from tests.cli.docs_app import APP, app_env, run, write_app


def test_chat_whose_input_ends_at_an_approval_question_releases_the_session(
        target: Target) -> None:
    write_app(target)
    for attempt in range(4):  # the release used to be a race, lost most times
        done = subprocess.run([sys.executable, "-m", "terret",
                               *target.args("chat", "--app", APP, "--agent", "ops")],
                              input="deploy checkout v2\n", capture_output=True, text=True,
                              timeout=60, cwd=target.cwd, env=app_env())
        assert done.returncode == 0, done.stderr
        assert "approval needed" in done.stdout or "[y/N]" in done.stdout, done.stdout
        assert "the call stays pending" in done.stdout, done.stdout
        sid = done.stdout.rsplit("terret chat ", 1)[1].split()[0]
        types = target.types(sid)
        assert "turn/end" not in types, (attempt, types)
        assert types[-1] == "agent/detached", (attempt, types)
        shown = target.json("sessions", "show", sid)
        assert shown["owner"] is None and shown["resumable"] is True, (attempt, shown)
        assert [p["call_id"] for p in shown["pending_approvals"]] == ["call-deploy"], shown

    # The last one, answered and resumed from two other processes.
    assert target.invoke("approve", sid, "call-deploy").exit_code == 0
    resumed = run(target, "resume", sid, "--app", APP)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.strip() == "turn 1 completed"


def test_chat_terminated_at_an_approval_question_releases_the_session(target: Target) -> None:
    """SIGTERM (``kill``, a supervisor, a terminal emulator closing) at the question left the
    session held until its lease expired, as a crash does: it leaves as Ctrl-D does now."""
    import signal
    import time

    write_app(target)
    chat = subprocess.Popen([sys.executable, "-m", "terret",
                             *target.args("chat", "--app", APP, "--agent", "ops")],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=target.cwd, env=app_env())
    try:
        assert chat.stdin is not None
        chat.stdin.write("deploy checkout v2\n")
        chat.stdin.flush()  # and kept open: the chat waits at the question
        deadline = time.monotonic() + 60
        sid = None
        while sid is None and time.monotonic() < deadline:
            listed = target.json("sessions", "list")
            sid = next((s["id"] for s in listed
                        if s["status"] == "waiting_approval"), None) if listed else None
            time.sleep(0.2)
        assert sid is not None, "the chat's turn never parked"
        chat.send_signal(signal.SIGTERM)
        out, err = chat.communicate(timeout=60)
    finally:
        if chat.poll() is None:
            chat.kill()
    assert chat.returncode == 0, err
    assert "bye — resume with: terret chat" in out, out
    types = target.types(sid)
    assert "turn/end" not in types and types[-1] == "agent/detached", types
    shown = target.json("sessions", "show", sid)
    assert shown["owner"] is None and shown["resumable"] is True, shown
    assert [p["call_id"] for p in shown["pending_approvals"]] == ["call-deploy"], shown


def test_a_continued_chat_shows_the_last_exchanges_said_not_a_summary(target: Target) -> None:
    """Compacted from another shell, the session's model-visible history begins with the
    summary: a continued chat showed it as the user's words (``you> Summary of earlier
    conversation: …``) and not the exchanges it stands for. They come from the log."""
    from tests.cli.conftest import DEMO_APP

    first = subprocess.run([sys.executable, "-m", "terret", *target.args(
        "chat", "--app", DEMO_APP)], input="hello one\nhello two\n/quit\n",
        capture_output=True, text=True, timeout=60, cwd=target.cwd, env=app_env())
    assert first.returncode == 0, first.stderr
    sid = first.stdout.rsplit("terret chat ", 1)[1].split()[0]
    compacted = run(target, "compact", sid, "--app", DEMO_APP)
    assert compacted.returncode == 0, compacted.stderr
    assert "session/compacted" in target.types(sid)
    again = subprocess.run([sys.executable, "-m", "terret", *target.args(
        "chat", sid, "--app", DEMO_APP)], input="/quit\n", capture_output=True, text=True,
        timeout=60, cwd=target.cwd, env=app_env())
    assert again.returncode == 0, again.stderr
    recap = again.stdout.split("— the last exchanges —", 1)[1].split("\n—", 1)[0]
    assert "you> hello one" in recap and "you> hello two" in recap, recap
    assert "Summary of earlier conversation" not in recap, recap
