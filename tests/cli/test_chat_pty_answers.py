"""``terret chat`` on a pty: what is typed at an approval's question and reason stays theirs —
bytes that are not text are asked for again (they crashed the chat, exit 2, and one path left
the session unreleased), and a reason half typed when the question is withdrawn is dropped, not
read by the next prompt and sent to the model. Leaving, Ctrl-C stops the wait for a running
tool quietly, as a crash. What another process does to the chat's session — a cancel, a turn
run there — is said. On SQLite and on the EventStoreDB emulator."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from terret.domain.events import ApprovalResolved, TurnEnded, UserMessage
from tests.cli.conftest import DEMO_APP, Target, subprocess_env
from tests.cli.pty_terminal import CHAT_APP, chatting, running


def _other_shell(target: Target, *args: str) -> None:
    done = target.run(*args)
    assert done.returncode == 0, done.stderr


def test_a_reason_that_is_not_text_is_asked_for_again(
        target: Target, chat_env: dict[str, str]) -> None:
    with chatting(target, chat_env, DEMO_APP) as (term, sid):
        term.say("deploy checkout v2", "approve deploy(")
        term.say("n", "reason")
        os.write(term.master, b"bad \xff reason\r")  # a paste that is not UTF-8
        term.expect("(not recorded: ")
        term.expect("reason")
        term.say("change freeze", "denied by operator: change freeze")
        term.expect("you> ")
        # The same for /deny at the prompt, on a second call.
        term.say("deploy checkout v3", "approve deploy(")
        os.write(term.master, b"/deny call-deploy caf\xc3\r")  # half a character
        term.expect("(not recorded: ")
        term.say("/deny call-deploy not today", "denied by operator: not today")
        term.expect("you> ")
        term.leave()
    reasons = [e.payload.reason for e in target.events(sid)
               if isinstance(e.payload, ApprovalResolved)]
    assert reasons == ["change freeze", "not today"], reasons
    assert target.types(sid)[-1] == "agent/detached"


def test_a_reason_half_typed_when_the_question_is_withdrawn_is_not_sent(
        target: Target, chat_env: dict[str, str]) -> None:
    with chatting(target, chat_env, DEMO_APP) as (term, sid):
        term.say("deploy checkout v2", "approve deploy(")
        term.say("n", "reason")
        term.type("wrong version, wait for v3")  # no Enter yet
        time.sleep(0.3)
        _other_shell(target, "deny", str(sid), "call-deploy", "--reason", "shell says no")
        term.expect("denied elsewhere")
        time.sleep(0.5)
        term.say("", "you> ")  # the Enter that would have sent it
        time.sleep(0.5)
        term.leave()
    said = [e.payload.text for e in target.events(sid) if isinstance(e.payload, UserMessage)]
    assert said == ["deploy checkout v2"], said


def test_ctrl_c_while_leaving_stops_the_wait_quietly(
        target: Target, chat_env: dict[str, str], tmp_path: Path) -> None:
    release = tmp_path / "release"
    env = {**chat_env, "CHAT_RELEASE": str(release)}
    try:
        with chatting(target, env, CHAT_APP) as (term, sid):
            _other_shell(target, "inject", str(sid), "hold woken", "--wake")
            running(release.with_suffix(".started"))
            term.type("\x04")  # Ctrl-D: leave
            term.expect("Ctrl-C to stop waiting")
            term.type("\x03")
            term.expect("(stopped waiting: the turn is left as after a crash")
            term.expect("bye")
            assert term.finish() == 0
    finally:
        release.touch()
    assert "warning" not in term.text().split("bye", 1)[1], term.text()
    assert "agent/detached" not in target.types(sid)[-2:]  # not released: the tool ran on


def test_a_turn_cancelled_from_another_shell_says_so(
        target: Target, chat_env: dict[str, str], tmp_path: Path) -> None:
    """`terret cancel` from another shell while the chat's answer streams: the text stopped
    mid-word and the prompt came back with no word of why; now one line says who cancelled
    the turn and why. Its own Ctrl-C says nothing more than '(cancelling the turn…)'."""
    env = {**chat_env, "CHAT_RELEASE": str(tmp_path / "release")}
    with chatting(target, env, CHAT_APP) as (term, sid):
        term.say("long answer please", "agent> word word ")
        _other_shell(target, "cancel", str(sid), "--reason", "wrong channel")
        term.expect("(turn 1 cancelled by operator")
        term.expect("wrong channel)")
        term.expect("you> ")
        term.say("long again", "agent> word word ")
        term.type("\x03")
        term.expect("(cancelling the turn…)")
        after = term.expect("you> ")
        assert "(turn 2 cancelled" not in after, after
        term.leave()
    ends = [e.payload.status for e in target.events(sid) if isinstance(e.payload, TurnEnded)]
    assert ends == ["cancelled", "cancelled"], ends


def test_a_cancel_from_another_shell_at_a_question_is_not_called_a_denial(
        target: Target, chat_env: dict[str, str]) -> None:
    """The turn's cancel denies the pending call (R13); the chat said '(call-deploy was denied
    elsewhere by operator)', as if someone had decided it."""
    with chatting(target, chat_env, DEMO_APP) as (term, sid):
        term.say("deploy checkout v2", "approve deploy(")
        _other_shell(target, "cancel", str(sid), "--reason", "wrong channel")
        said = term.expect("(turn 1 cancelled by operator")
        assert "call-deploy will not run: the turn was cancelled" in said, said
        assert "denied elsewhere" not in said, said
        term.expect("you> ")
        term.leave()


def test_a_woken_turn_that_fails_is_said_once(
        target: Target, chat_env: dict[str, str], tmp_path: Path) -> None:
    env = {**chat_env, "CHAT_RELEASE": str(tmp_path / "release")}
    with chatting(target, env, CHAT_APP) as (term, sid):
        _other_shell(target, "inject", str(sid), "explode now", "--wake")
        term.expect("(turn 1 failed: RuntimeError: the model blew up")
        term.expect("you> ")
        time.sleep(0.5)
        term.leave()
    assert term.text().count("the model blew up") == 1, term.text()


def test_a_history_file_that_cannot_be_written_is_said(
        target: Target, chat_env: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "a-directory").mkdir()
    env = {**chat_env, "TERRET_CHAT_HISTORY": str(tmp_path / "a-directory")}
    with chatting(target, env, DEMO_APP) as (term, _):
        term.say("/quit", "warning: the chat's history was not saved to")
        assert term.finish() == 0


MOVE = """import sys
from terret import Runtime, open_store
from terret.cli.demo_app import demo_app
app = demo_app()
rt = Runtime(open_store(sys.argv[1]), resolver=app.resolver, agents=app.agents,
             config=app.config, summarizer=app.summarizer).start()
print(rt.run_turn(sys.argv[2], "hello from B").status)
rt.close()
"""


def test_a_turn_another_process_runs_on_the_idle_session_shows_in_the_chat(
        target: Target, chat_env: dict[str, str]) -> None:
    """Another process's ``run_turn`` moves the chat's idle session there (its caller chose
    it): the chat said nothing of that turn — not its message, not its answer. Now it says the
    session moved, shows both as they are recorded, and the next message takes it back."""
    with chatting(target, chat_env, DEMO_APP) as (term, sid):
        term.say("hi", "agent> You said: hi")
        term.expect("you> ")
        moved = subprocess.run([sys.executable, "-c", MOVE, target.uri, str(sid)],
                               capture_output=True, text=True, timeout=60, cwd=target.cwd,
                               env=subprocess_env())
        assert moved.stdout.strip() == "completed", moved.stderr
        term.expect("(another process took the session")
        term.expect("user> hello from B  (from another process)")
        term.expect("agent> You said: hello from B")
        term.say("back here", "agent> You said: back here")
        term.expect("you> ")
        term.leave()


def test_a_message_typed_while_the_model_works_is_kept_when_a_question_comes(
        target: Target, chat_env: dict[str, str]) -> None:
    """Typed while the model was still answering, a message was read by the approval's
    question that followed — not a y or n, it was refused there and lost, never sent. A line
    typed before a question shows is no answer to it (a ``y`` would approve a call unseen): it
    is kept and sent at the next prompt, once the question is answered."""
    with chatting(target, chat_env, CHAT_APP) as (term, sid):
        term.type("slow deploy please\r")
        time.sleep(0.3)
        term.type("and then tell me the status\r")  # while the model thinks
        term.expect("typed before this question showed, kept for after it: "
                    "'and then tell me the status'")
        term.say("y", "← deploy: checkout v9")
        term.expect("you> and then tell me the status")
        term.expect("agent> ")
        term.expect("you> ")
        term.leave()
    said = [e.payload.text for e in target.events(sid) if isinstance(e.payload, UserMessage)]
    assert said == ["slow deploy please", "and then tell me the status"], said
    verdicts = [e.payload.verdict for e in target.events(sid)
                if isinstance(e.payload, ApprovalResolved)]
    assert verdicts == ["approved"], verdicts


def test_a_close_from_another_shell_ends_the_chat_at_the_next_message_at_once(
        target: Target, chat_env: dict[str, str]) -> None:
    """The close came while this process still held the session's agent (its listener lets
    it go a moment later): the message's turn was refused with a bare error line and the chat
    went on, ending only at a second message."""
    with chatting(target, chat_env, CHAT_APP) as (term, sid):
        term.say("hello", "agent> ")
        term.expect("you> ")
        _other_shell(target, "sessions", "close", str(sid))
        term.type("are you there\r")
        term.expect("(not sent: SessionClosed: ")
        term.expect("bye — the session is closed")
        assert term.finish() == 0
    said = [e.payload.text for e in target.events(sid) if isinstance(e.payload, UserMessage)]
    assert said == ["hello"], said
