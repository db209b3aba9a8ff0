"""``terret chat`` in a pseudo-terminal, as a person types in it: line editing with the arrow
keys (nothing of the escape codes reaches the log), a banner naming the model, slash commands
that never reach the model, the ``agent>`` prefix after a tool round, an approval question
withdrawn when the verdict comes from another process (answering it afterwards does not
crash), the history kept across runs, and the last exchanges shown on reconnect — on SQLite
and on the EventStoreDB emulator."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from uuid import UUID

import pytest

from terret.domain.events import (
    ApprovalResolved,
    CancelRequested,
    ContextInjected,
    ToolResult,
    TurnEnded,
    UserMessage,
)
from tests.cli.conftest import DEMO_APP, Target, is_type, subprocess_env
from tests.cli.docs_app import AppServer
from tests.cli.pty_terminal import CHAT_APP, LEFT, RIGHT, UP, Terminal, chatting, running


def test_chat_in_a_terminal(target: Target, chat_env: dict[str, str], tmp_path: Path) -> None:
    term = Terminal(target, "chat", "--app", DEMO_APP, env=chat_env)
    try:
        sid = term.session()
        term.expect("terret chat — agent demo, model demo:ops-model-1")
        term.expect("/help for commands")
        term.expect("you> ")
        assert "\x1b[2m" in term.seen  # colour on a terminal (the banner is dim)

        # Line editing: a typo fixed with the left arrow; the log holds the fixed line only.
        term.type(f"helo{LEFT}l\r")
        term.expect("agent> You said: hello")
        term.expect("you> ")

        # A slash command is the chat's own: the model never sees it.
        term.type("/help\r")
        term.expect("/approve [CALL]")
        term.expect("you> ")
        term.type("/bogus\r")
        term.expect("unknown command /bogus")
        term.expect("you> ")
        users = [e.payload.text for e in target.events(sid)
                 if isinstance(e.payload, UserMessage)]
        assert users == ["hello"], users

        # A tool round, then an approval; the verdict comes from another process.
        term.type("Check the checkout service and deploy v2\r")
        term.expect("→ service_status(")
        term.expect("← service_status:")
        term.expect("approve deploy(")
        approved = target.run("approve", str(sid), "call-deploy", "--reason", "from elsewhere")
        assert approved.returncode == 0, approved.stderr
        term.expect("call-deploy was approved elsewhere by operator")
        term.expect("← deploy: checkout v2 rolled out")
        after = term.expect("Done: checkout v2 rolled out to 3/3 instances.")
        assert after.rstrip().endswith("agent>"), after  # the answer after the tool round
        term.expect("you> ")
        verdicts = [e.payload for e in target.events(sid)
                    if isinstance(e.payload, ApprovalResolved)]
        assert [v.reason for v in verdicts] == ["from elsewhere"]  # chat wrote none

        # History: the up arrow brings the last line back (and it runs again).
        term.type(f"{UP}\r")
        term.expect("approve deploy(")
        term.type("n\r")
        term.expect("reason")
        term.type(f"not{LEFT} twice{RIGHT}\r")  # keys the question has no editing for
        term.expect("denied by operator: not twice")
        term.expect("you> ")
        term.type("/quit\r")
        term.expect(f"resume with: terret chat {sid}")
        assert term.finish() == 0
    finally:
        term.kill()
    history = Path(chat_env["TERRET_CHAT_HISTORY"]).read_text()
    assert "hello" in history and "/help" in history and "\x1b" not in history
    deploys = [e.payload for e in target.events(sid)
               if isinstance(e.payload, ToolResult) and e.payload.name == "deploy"]
    assert [d.is_error for d in deploys] == [False, True]
    reasons = [e.payload.reason for e in target.events(sid)
               if isinstance(e.payload, ApprovalResolved)]
    assert reasons == ["from elsewhere", "not twice"], reasons  # no escape codes in the log

    # Reconnect: the banner says so, the last exchanges come back, the session goes on.
    # (With NO_COLOR, no colour even on a terminal.)
    again = Terminal(target, "chat", str(sid), "--app", DEMO_APP,
                     env={**chat_env, "NO_COLOR": "1"})
    try:
        again.expect("(continued)")
        again.expect("— the last exchanges —")
        again.expect("you> Check the checkout service and deploy v2")
        exchange = again.expect("agent> The deploy did not happen")
        # A reply's text, then its calls: as they were shown live.
        assert exchange.index("agent> Checking the service first.") < \
            exchange.index("→ service_status("), exchange
        again.expect("you> ")
        again.type("\x04")  # Ctrl-D
        again.expect("bye — resume with")
        assert again.finish() == 0
        assert "\x1b[2m" not in again.seen and "\x1b[1m" not in again.seen
    finally:
        again.kill()


@pytest.mark.parametrize("answer, verdict", [("y", "approved"), ("n\nnot today", "denied")])
def test_chat_with_piped_input_reads_each_answer_where_it_is_asked(
        target: Target, answer: str, verdict: str) -> None:
    """All the lines arrive at once through a pipe: the approval's answer is read by its
    question (not swallowed by the prompt's reader and sent to the model), and the lines after
    it — ``/exit`` — are still read."""
    done = subprocess.run(
        [sys.executable, "-m", "terret", *target.args("chat", "--app", DEMO_APP)],
        input=f"deploy checkout\n{answer}\n/exit\n", capture_output=True, text=True,
        timeout=60, cwd=target.cwd, env=subprocess_env())
    assert done.returncode == 0, done.stderr
    assert "bye — resume with" in done.stdout
    assert f"? [y/N] {answer.splitlines()[0]}\n" in done.stdout  # echoed where it was read
    sid = UUID(done.stdout.split("terret chat ")[-1].split()[0])
    events = target.events(sid)
    resolved = [e.payload for e in events if isinstance(e.payload, ApprovalResolved)]
    assert [r.verdict for r in resolved] == [verdict]
    if verdict == "denied":
        assert resolved[0].reason == "not today"
    said = [e.payload.text for e in events if isinstance(e.payload, UserMessage)]
    assert said == ["deploy checkout"]  # the answer never reached the model


def test_ctrl_c_while_a_tool_runs_waits_for_the_turn_to_close(
        target: Target, chat_env: dict[str, str], tmp_path: Path) -> None:
    """Ctrl-C while a tool without a timeout runs: the prompt comes back only once the turn has
    closed, the tool's result printed before it. A second Ctrl-C stops the waiting; a message
    typed then waits for the turn to close and is sent after it, never refused and lost."""
    release = tmp_path / "release"
    started = release.with_suffix(".started")
    term = Terminal(target, "chat", "--app", CHAT_APP,
                    env={**chat_env, "CHAT_RELEASE": str(release)})
    try:
        sid = term.session()
        term.expect("you> ")
        term.type("hold one\r")
        term.expect("→ hold(")
        running(started)
        term.type("\x03")
        term.expect("(cancelling the turn…)")
        term.expect("a tool is still running")
        time.sleep(1.0)
        with pytest.raises(AssertionError):
            term.expect("you> ", timeout=0.5)  # no prompt over the running turn
        shown = target.run("--json", "sessions", "show", str(sid))  # a second process
        assert json.loads(shown.stdout)["open_turn"] == 1, shown.stdout
        release.touch()
        before = term.expect("you> ")
        assert "← hold: released one" in before, before
        release.unlink()
        started.unlink()

        term.type("hold two\r")
        term.expect("→ hold(")
        running(started)
        term.type("\x03")
        term.expect("a tool is still running")
        term.type("\x03")
        term.expect("not waiting")
        term.expect("you> ")
        term.type("hello after\r")
        term.expect("waiting for the cancelled turn to close before this message is sent")
        release.touch()
        term.expect("← hold: released two")
        term.expect("agent> You said: hello after")
        term.expect("you> ")
        term.type("/quit\r")
        assert term.finish() == 0
        assert "TurnAlreadyRunning" not in term.text()
    finally:
        term.kill()
    events = target.events(sid)
    ends = [e.payload.status for e in events if isinstance(e.payload, TurnEnded)]
    assert ends == ["cancelled", "cancelled", "completed"], ends
    said = [e.payload.text for e in events if isinstance(e.payload, UserMessage)]
    assert said == ["hold one", "hold two", "hello after"]


def test_a_late_answer_to_a_withdrawn_question_is_reported_not_sent(
        target: Target, chat_env: dict[str, str]) -> None:
    """The call is approved from another process while its question is asked; the ``y`` typed
    just after is reported as too late — not an error, not a message to the model. The next
    ``y`` is an ordinary message."""
    term = Terminal(target, "chat", "--app", DEMO_APP, env=chat_env)
    try:
        sid = term.session()
        term.expect("you> ")
        term.type("deploy checkout v2\r")
        term.expect("approve deploy(")
        approved = target.run("approve", str(sid), "call-deploy")
        assert approved.returncode == 0, approved.stderr
        term.type("y\r")
        # Read by the question before the verdict was seen, or as the late answer after it:
        # reported as late either way.
        late = term.expect("was not used)")
        assert "too late for call-deploy" in late, late
        term.expect("you> ")
        assert "Error" not in term.text(), term.text()
        # The same with a denial from elsewhere and a late 'n': no reason is asked for.
        term.type("deploy checkout v3\r")
        term.expect("approve deploy(")
        denied = target.run("deny", str(sid), "call-deploy", "--reason", "no")
        assert denied.returncode == 0, denied.stderr
        term.type("n\r")
        late = term.expect("was not used)")
        assert "too late for call-deploy" in late and "reason" not in late, late
        term.expect("you> ")
        term.type("y\r")
        term.expect("agent> You said: y")
        term.expect("you> ")
        term.type("/quit\r")
        assert term.finish() == 0
    finally:
        term.kill()
    events = target.events(sid)
    said = [e.payload.text for e in events if isinstance(e.payload, UserMessage)]
    assert said == ["deploy checkout v2", "deploy checkout v3", "y"], said
    verdicts = [e.payload.by.actor for e in events if isinstance(e.payload, ApprovalResolved)]
    assert len(verdicts) == 2


def test_chat_input_ending_at_a_question_leaves_the_call_pending(target: Target) -> None:
    """The input ends (Ctrl-D, or a pipe's end) while an approval is asked: the chat leaves —
    it used to wait for the parked turn for ever — and the call stays pending, for another
    process to answer."""
    done = subprocess.run(
        [sys.executable, "-m", "terret", *target.args("chat", "--app", DEMO_APP)],
        input="deploy checkout\n", capture_output=True, text=True, timeout=60,
        cwd=target.cwd, env=subprocess_env())
    assert done.returncode == 0, done.stderr
    assert "no answer: the call stays pending" in done.stdout
    sid = UUID(done.stdout.split("terret chat ")[-1].split()[0])
    approved = target.run("approve", str(sid), "call-deploy")
    assert approved.returncode == 0, approved.stderr
    assert not [e for e in target.events(sid) if isinstance(e.payload, UserMessage)][1:]


def test_a_turn_woken_from_another_shell_shows_below_the_prompt(
        target: Target, chat_env: dict[str, str]) -> None:
    """Chat sits at its prompt with a half-typed line; another shell runs ``terret inject
    SID TEXT --wake``. Chat runs that turn (its process owns the session): the injected text
    shows as ``inbox>`` on a line of its own, the answer with ``agent>``, then the prompt
    again with the half-typed line kept. A woken turn that parks on an approval says how to
    answer it, and ``/approve`` there lets it finish."""
    term = Terminal(target, "chat", "--app", DEMO_APP, env=chat_env)
    try:
        sid = term.session()
        term.expect("you> ")
        term.type("half")  # typed, not sent
        time.sleep(0.3)
        done = target.run("inject", str(sid), "hello from elsewhere", "--wake")
        assert done.returncode == 0, done.stderr
        before = term.expect("inbox> hello from elsewhere")
        assert before.endswith("\n"), before  # below the prompt, not run into it
        between = term.expect("agent> You said: hello from elsewhere")
        assert between.strip() == "", between
        term.expect("you> half")  # the prompt again, the line kept
        term.type(" typed\r")
        term.expect("agent> You said: half typed")
        term.expect("you> ")
        # A session's text is shown, never acted on: its control characters escaped.
        done = target.run("inject", str(sid), "ring\a the \x1b[31mbell", "--wake")
        assert done.returncode == 0, done.stderr
        shown = term.expect("agent> You said: ring\\x07 the \\x1b[31mbell")
        assert "inbox> ring\\x07 the \\x1b[31mbell" in shown and "\a" not in shown
        term.expect("you> ")

        done = target.run("inject", str(sid), "deploy checkout v2", "--wake")
        assert done.returncode == 0, done.stderr
        term.expect("inbox> deploy checkout v2")
        term.expect("approval needed: deploy(")
        term.expect("/approve call-deploy or /deny call-deploy REASON")
        term.expect("you> ")
        # A message while that turn runs here: queued for it, not refused and lost.
        term.type("and say done\r")
        term.expect("(queued: a turn woken from another shell is running")
        term.expect("you> ")
        term.type("/approve call-deploy\r")
        term.expect("approved call-deploy")
        term.expect("← deploy: checkout v2 rolled out")
        term.expect("agent> ")
        term.expect("you> ")
        term.type("/quit\r")
        assert term.finish() == 0
    finally:
        term.kill()
    said = [e.payload.text for e in target.events(sid) if isinstance(e.payload, UserMessage)]
    assert said[:4] == ["hello from elsewhere", "half typed", "ring\a the \x1b[31mbell",
                        "deploy checkout v2"], said
    taken = [e.payload.text for e in target.events(sid)
             if isinstance(e.payload, (UserMessage, ContextInjected))]
    assert taken.count("and say done") == 1, taken


def test_chat_follows_a_turn_another_worker_took_over(
        target: Target, chat_env: dict[str, str]) -> None:
    """A running ``terret serve`` runs a session's turn (woken from another shell) and holds it
    parked on a call. ``terret chat SID`` follows that turn instead of failing with
    ``SessionOwned``: it lists the pending call; a message typed
    meanwhile waits in the inbox for the turn's next step; ``/approve`` answers the call,
    serve runs it and its next step (with the message) shows here; once serve's turn has
    ended, the next message moves the idle session to the chat and runs in it."""
    server = AppServer(target, "serve", DEMO_APP).start()
    try:
        term = Terminal(target, "chat", "--app", DEMO_APP, env=chat_env)
        try:
            sid = term.session()
            term.expect("you> ")
            term.type("\x04")  # Ctrl-D: leave, the session released
            assert term.finish() == 0
        finally:
            term.kill()
        woken = target.run("inject", str(sid), "deploy checkout v2", "--wake")
        assert woken.returncode == 0, woken.stderr
        server.wait_for("serve to park the woken turn",
                        lambda text: f"session {sid} parked on an approval" in text)

        again = Terminal(target, "chat", str(sid), "--app", DEMO_APP, env=chat_env)
        try:
            again.expect("this chat follows it")
            again.expect("approval needed: deploy(")
            again.expect("/approve call-deploy or /deny call-deploy REASON")
            again.expect("you> ")
            again.type("status please\r")  # the turn is serve's: the message waits for it
            again.expect("(queued: session")
            again.expect("you> ")
            again.type("/approve call-deploy\r")
            again.expect("approved call-deploy")
            again.expect("← deploy: checkout v2 rolled out")
            again.expect("(injected: status please)")  # serve's next step took it
            again.expect("agent> You said: status please")
            target.wait_for(sid, is_type("turn/end", turn=1, status="completed"),
                            "serve to end the turn")
            again.type("hello\r")
            again.expect("agent> You said: hello")
            again.expect("you> ")
            again.type("/quit\r")
            assert again.finish() == 0
        finally:
            again.kill()
    finally:
        code = server.stop()
    assert code == 0, server.text()
    assert "Traceback" not in server.text(), server.text()
    attached = [e.payload.pid for e in target.events(sid) if e.wire_name == "agent/attached"]
    assert len(attached) == 3 and attached[1] == server.pid, attached  # chat, serve, chat


def test_a_session_closed_from_another_shell_ends_the_chat_keeping_its_history(
        target: Target, chat_env: dict[str, str]) -> None:
    """``terret sessions close SID`` in another shell while chat waits at its prompt: the next
    message says it was not sent and why, and the chat ends with exit 0 and a goodbye that
    does not point at a closed session; the lines typed are in the history. It ended with
    ``Error: SessionClosed`` (exit 1) and the run's history was never written."""
    term = Terminal(target, "chat", "--app", DEMO_APP, env=chat_env)
    try:
        sid = term.session()
        term.expect("you> ")
        term.type("hi\r")
        term.expect("agent> ")
        term.expect("you> ")
        closed = target.run("sessions", "close", str(sid), "--reason", "done here")
        assert closed.returncode == 0, closed.stderr
        time.sleep(0.5)  # the chat's process lets the session go
        term.type("hello?\r")
        term.expect("(not sent: SessionClosed:")
        term.expect("bye — the session is closed")
        assert term.finish() == 0
    finally:
        term.kill()
    history = Path(chat_env["TERRET_CHAT_HISTORY"]).read_text()
    assert "hi" in history and "hello?" in history, history
    said = [e.payload.text for e in target.events(sid) if isinstance(e.payload, UserMessage)]
    assert said == ["hi"], said


def test_ctrl_c_while_the_answer_streams_shows_no_more_of_it(
        target: Target, chat_env: dict[str, str], tmp_path: Path) -> None:
    """Ctrl-C in the middle of a streamed answer cancels the turn; what the stream still said
    before the cancel reached it is not printed (a stray fragment landed below the cancel
    line, or ran into the ``^C``)."""
    term = Terminal(target, "chat", "--app", CHAT_APP,
                    env={**chat_env, "CHAT_RELEASE": str(tmp_path / "release")})
    try:
        sid = term.session()
        term.expect("you> ")
        term.type("long answer please\r")
        term.expect("agent> word word ")
        term.type("\x03")
        term.expect("(cancelling the turn…)")
        after = term.expect("you> ")
        assert "word" not in after, after
        term.type("/quit\r")
        assert term.finish() == 0
    finally:
        term.kill()
    ends = [e.payload.status for e in target.events(sid) if isinstance(e.payload, TurnEnded)]
    assert ends == ["cancelled"], ends


def test_ctrl_c_at_the_prompt_beside_a_woken_turn_only_clears_the_line(
        target: Target, chat_env: dict[str, str], tmp_path: Path) -> None:
    """A turn woken from another shell runs below the prompt (a tool holding it); Ctrl-C at
    the prompt clears the half-typed line and leaves that turn alone: nothing is cancelled,
    the turn completes once its tool returns, and the chat goes on."""
    release = tmp_path / "release"
    try:
        with chatting(target, {**chat_env, "CHAT_RELEASE": str(release)}, CHAT_APP) \
                as (term, sid):
            done = target.run("inject", str(sid), "hold woken", "--wake")
            assert done.returncode == 0, done.stderr
            term.expect("inbox> hold woken")
            running(release.with_suffix(".started"))
            term.type("half typed")
            time.sleep(0.3)
            term.type("\x03")
            term.expect("^C (/quit or Ctrl-D to leave)")
            term.expect("you> ")
            # The new line holds only what follows the Ctrl-C.
            term.say("fresh", "(queued: a turn woken from another shell is running")
            release.touch()
            term.expect("← hold: released woken")
            term.expect("(injected: fresh)")  # the woken turn's next step took it
            term.expect("agent> You said: fresh")
            term.expect("you> ")
            term.leave()
    finally:
        release.touch()
    events = target.events(sid)
    assert not [e for e in events if isinstance(e.payload, CancelRequested)]
    ends = [e.payload.status for e in events if isinstance(e.payload, TurnEnded)]
    assert ends and set(ends) == {"completed"}, ends
    taken = [e.payload.text for e in events
             if isinstance(e.payload, (UserMessage, ContextInjected))]
    assert "fresh" in taken and not [t for t in taken if "half" in t], taken


def test_sigterm_while_the_chat_leaves_lets_it_finish_leaving(
        target: Target, chat_env: dict[str, str], tmp_path: Path) -> None:
    """``/quit`` while a turn woken from another shell runs a tool here: the chat waits for
    its step boundary. A SIGTERM then (a supervisor stopping it) used to kill the process at
    once, the session held until its lease expired; leaving is what it asks for, so the wait
    goes on: the tool's result is recorded once, the turn stops open and the session is
    released (``agent/detached``)."""
    import signal

    release = tmp_path / "release"
    started = release.with_suffix(".started")
    with chatting(target, {**chat_env, "CHAT_RELEASE": str(release)}, CHAT_APP) as (term, sid):
        done = target.run("inject", str(sid), "hold on", "--wake")  # a second process
        assert done.returncode == 0, done.stderr
        term.expect("→ hold(")
        running(started)
        term.type("/quit\r")
        term.expect("(leaving: the open turn stops at its step boundary")
        term.proc.send_signal(signal.SIGTERM)
        time.sleep(1.0)
        assert term.proc.poll() is None, term.text()  # still leaving, not killed
        release.touch()
        assert term.finish() == 0, term.text()
        assert "bye — resume with: terret chat" in term.text()
    events = target.events(sid)
    results = [e.payload.call_id for e in events if isinstance(e.payload, ToolResult)]
    assert results == ["call-hold"], results
    assert events[-1].wire_name == "agent/detached", [e.wire_name for e in events]
    shown = json.loads(target.run("--json", "sessions", "show", str(sid)).stdout)
    assert shown["owner"] is None, shown
