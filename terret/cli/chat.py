"""``terret chat``: an interactive session in the terminal — streamed text, tool calls, y/n
approvals, slash commands. The session is an ordinary durable one: quit and come back with its
id (the last exchanges are shown again).

On a terminal the prompt has line editing and a history (GNU readline or libedit, as Python's
``readline`` module has it), kept in ``TERRET_CHAT_HISTORY`` (default
``~/.terret_chat_history``). Lines starting with ``/`` are commands of the chat, never sent to
the model (``//`` sends a line that starts with ``/``). An approval question is withdrawn when a
verdict for the call arrives from elsewhere (``terret approve`` in another shell).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from typing import TYPE_CHECKING, Any, NoReturn
from uuid import UUID

import click

from terret._text import one_line
from terret.cli._app import App, check_resolves
from terret.cli._chat_questions import ApprovalQuestions
from terret.cli._chat_terminal import (
    Input,
    Screen,
    Terminated,
    sigterm_leaves,
    sigterm_waits,
    waited,
)
from terret.cli._context import MODEL_SPEC, SESSION, CliContext, operator
from terret.cli._format import actor_text, as_json, money
from terret.cli._params import AGENT_NAME
from terret.cli.admin import APP_OPTION, app_for, runtime_for
from terret.domain.errors import SessionClosed, SessionOwned, TerretError, TurnSuspended

if TYPE_CHECKING:
    from terret.domain.codec import RecordedEvent
    from terret.domain.store import StoredRecord
    from terret.runtime.agent import Agent
    from terret.runtime.runtime import Runtime

RECONNECT_EXCHANGES = 3
HELP = """commands (never sent to the model):
  /help              this list
  /log [N]           the session's last N events (default 10)
  /usage             tokens and cost so far, per model
  /approve [CALL]    approve a pending call (the only one, without CALL)
  /deny CALL REASON  deny a pending call; the model sees REASON
  /quit, /exit       leave (Ctrl-D too); the session stays in the store
  //text             send a line that starts with '/'"""


class Chat:
    def __init__(self, obj: CliContext, runtime: Runtime, sid: UUID) -> None:
        self.obj = obj
        self.runtime = runtime
        self.sid = sid
        self.screen = Screen()
        self.input = Input()
        self.questions = ApprovalQuestions(self.screen, self.input, runtime, sid)
        self.closing: threading.Event | None = None
        """A cancelled turn the user stopped waiting for (a second Ctrl-C), set once it has
        closed: a message waits for it."""
        self.leaving = False
        """Ctrl-D at an approval's question: the chat ends, the call stays pending."""
        self.closed = False
        """The session was closed from another shell while the chat ran."""
        self.muted = False
        """Ctrl-C cancelled the turn this chat drives: the rest of its streamed text is not
        shown."""
        self.agent: Agent | None = None
        """This process's agent for the session; None while another worker runs its turn."""
        self.result: object = None
        """How the turn this chat drove last ended (its ``TurnResult``), until it is said."""

    # --- what the session does, as it happens ------------------------------------------------

    def on_event(self, event: RecordedEvent) -> None:
        from terret.domain.events import (
            ApprovalResolved,
            AssistantMessage,
            SessionCompacted,
            ToolResult,
        )

        if event.session_id != self.sid:
            return
        p: Any = event.payload
        if self._from_elsewhere(p):
            return
        if isinstance(p, ApprovalResolved):
            self.questions.resolved(p)
        elif isinstance(p, AssistantMessage):
            if self.agent is None and p.text:  # another worker's turn: its text streamed there
                self.screen.line(f"agent> {p.text}")
            for c in p.tool_calls:
                self.screen.line(f"  → {c.name}({as_json(c.args)})", fg="yellow")
        elif isinstance(p, ToolResult):
            colour = "red" if p.is_error else "green"
            self.screen.line(f"  ← {p.name}: {one_line(p.content, 200)}", fg=colour)
            self.screen.agent_prefix = True  # the text after a tool round is a new answer
        elif isinstance(p, SessionCompacted):
            self.screen.line("  (history compacted)", dim=True)

    def _from_elsewhere(self, p: Any) -> bool:
        """What a turn another process woke (`terret inject --wake`) shows: the text it
        answers, and — at the prompt, where no question is asked — its end or its approval
        (then the prompt again). False for the events shown the same for every turn."""
        from terret.domain.events import (
            AgentAttached,
            ApprovalRequested,
            ContextInjected,
            TurnEnded,
            UserMessage,
        )

        at_prompt = self.screen.waiting is not None
        if isinstance(p, AgentAttached):
            self._attached(p)
        elif isinstance(p, UserMessage):
            if p.inbox_id is not None:  # queued by another process: not the user's own line
                self.screen.line(f"inbox> {one_line(p.text, 300)}", dim=True)
                self.screen.agent_prefix = True
            elif self.agent is None:  # a turn another process started (its run_turn)
                self.screen.line(f"user> {one_line(p.text, 300)}  (from another process)",
                                 dim=True)
                self.screen.agent_prefix = True
        elif isinstance(p, ContextInjected):
            self.screen.line(f"  (injected: {one_line(p.text, 200)})", dim=True)
        elif isinstance(p, TurnEnded) and at_prompt:
            if p.status != "completed":
                why = p.error or p.reason
                self.screen.line(f"  (turn {p.turn} {p.status}"
                                 + (f": {one_line(why, 200)})" if why else ")"), dim=True)
            self.input.show_again(self.screen)
        elif isinstance(p, ApprovalRequested) and at_prompt:
            self.questions.needs_approval(p.call_id, p.name, p.args)
            self.input.show_again(self.screen)
        else:
            return isinstance(p, (TurnEnded, ApprovalRequested))
        return True

    def _attached(self, p: Any) -> None:
        """Another process took the session (its ``run_turn`` moved the idle session there):
        its turns show here as they are recorded, as a followed turn's do."""
        if p.worker == self.runtime.lease.worker or self.agent is None:
            return  # this process's own claim, or already following another's
        self.agent = None
        self.screen.line(f"  (another process took the session: worker {p.worker} runs its "
                         "turns; they show here as they are recorded, a message you type is "
                         "queued for it)", dim=True)

    def on_text(self, agent: Agent, chunk: str) -> None:
        """The model's streamed text, after what the turn recorded before it is shown (the
        listener prints the tool round, a message from the inbox, on the runner's thread)."""
        try:
            self.runtime.wait_for(agent.recorded_to)
        except (TerretError, TimeoutError):
            pass  # the lines come late, not never
        if self.muted:
            return  # what the stream still said after Ctrl-C: not part of the answer shown
        self.screen.text(chunk)

    # --- turns -----------------------------------------------------------------------------

    def drive(self, run: Callable[[], object]) -> None:
        """Run a turn in the background; ask about each approval as it comes (withdrawn when a
        verdict arrives from elsewhere). Ctrl-C cancels the turn and waits for it to close."""
        done = threading.Event()
        self.muted = False
        thread = threading.Thread(target=self._guarded(run, done), daemon=True)
        try:
            # Inside the try: the turn's thread may run as far as its tool before start()
            # returns here, and a Ctrl-C then must cancel the turn, not clear a prompt.
            thread.start()
            # An event polled (``waited``), not Thread.join: a join interrupted by Ctrl-C
            # leaves the thread looking finished on Python 3.11, and the prompt came back
            # over a running turn.
            while not waited(done, 0.05):
                self.questions.ask_pending()
        except KeyboardInterrupt:
            self._cancel(done)
        except Terminated:
            self.leaving = True
            self.screen.line("  (terminated: leaving)", dim=True)
        except EOFError:  # Ctrl-D (or the input's end) at a question: leave, the call pending
            self.leaving = True
            self.screen.line("  (no answer: the call stays pending — `terret approve` or "
                             f"`terret chat {self.sid}` answers it later)", dim=True)
        if done.is_set():
            self._settle()
            self._say_if_stopped_elsewhere()
        self.screen.fresh_line()

    def _say_if_stopped_elsewhere(self) -> None:
        """A turn this chat drove that another process cancelled (`terret cancel`) or a hook
        rejected: one line says who and why — its text just stopped, or its question was
        taken back as if decided."""
        result, self.result = self.result, None
        if getattr(result, "status", None) not in ("cancelled", "rejected") or self.muted:
            return  # completed, failed (said already), or cancelled by this chat's Ctrl-C
        summary = self.runtime.views.summary(self.sid)
        last = summary.last_turn if summary is not None else None
        if last is None or last.get("turn") != getattr(result, "turn", None):
            return
        by = actor_text(last.get("by"))
        self.screen.line(f"  (turn {last['turn']} {last['status']}" + (f" by {by}" if by else "")
                         + (f": {one_line(last['reason'], 200)})" if last.get("reason")
                            else ")"), dim=True)

    def _cancel(self, done: threading.Event) -> None:
        # A second Ctrl-C anywhere in here — the user pressing it as soon as a line shows, or
        # twice in a row — stops the waiting; it must not escape and end the chat.
        self.muted = True  # the stream may say a few more words before the cancel stops it
        try:
            self.screen.line("  (cancelling the turn…)", dim=True)
            try:
                self.runtime.cancel(self.sid, by=operator(), reason="interrupted in chat")
            except TerretError:
                pass
            if waited(done, 0.5):
                return
            self.screen.line(f"  ({self._still_running()}: the turn closes cancelled when it "
                             "returns; Ctrl-C again to stop waiting)", dim=True)
            while not waited(done, 0.2):
                pass
        except KeyboardInterrupt:
            self.closing = done
            self.screen.line("  (not waiting: the turn closes in the background; a message "
                             "you type waits for it)", dim=True)

    def _still_running(self) -> str:
        """What the cancelled turn still waits on: a tool (its step's reply is recorded, its
        calls not all answered), or the model's request."""
        try:
            state = self.runtime.writer.load(self.sid).state
        except TerretError:
            return "the turn is still running"
        if state.step_open and state.step_answered:
            return "a tool is still running"
        return "the model's request is still running"

    def _closed(self, why: str) -> bool:
        """Wait for a turn left closing by a second Ctrl-C (a new one would be refused while it
        runs, and the message lost). False if the user stops waiting (Ctrl-C)."""
        closing = self.closing
        if closing is None or closing.is_set():
            self.closing = None
            return True
        try:
            self.screen.line(f"  (waiting for the cancelled turn to close before {why}; "
                             "Ctrl-C to stop waiting)", dim=True)
            while not waited(closing, 0.2):
                pass
        except KeyboardInterrupt:
            return False
        self.closing = None
        self._settle()
        return True

    def _settle(self) -> None:
        """Let the log's listener print what the turn recorded (its last tool result) before
        the prompt comes back."""
        try:
            self.runtime.catch_up_views(self.sid)
        except (TerretError, TimeoutError):
            pass  # the lines come late, not never

    def _guarded(self, fn: Callable[[], object], done: threading.Event) -> Callable[[], None]:
        def run() -> None:
            try:
                result = self.result = fn()
                if getattr(result, "status", None) == "failed":
                    self.screen.line(f"  (turn {getattr(result, 'turn', '?')} failed: "
                                     f"`terret sessions show {self.sid}` says why)", fg="red")
            except TurnSuspended:
                if not self.leaving:  # leaving suspends it on purpose: the hint says so
                    self.screen.line("  (the turn stopped: this process is stopping)",
                                     dim=True)
            except Exception as exc:  # one line, as every error: not a thread's traceback
                self.screen.line(f"  Error: {type(exc).__name__}: {one_line(str(exc), 300)}",
                                 fg="red")
            finally:
                done.set()

        return run

    # --- the conversation --------------------------------------------------------------------

    def attach(self, agent: Agent) -> None:
        """This process runs the session's turns: their text streams here."""
        self.agent = agent
        agent.on_text = partial(self.on_text, agent)

    def follow(self, held: SessionOwned) -> None:
        """Another live worker runs the open turn (a `terret serve` that took it over): the
        chat shows it as recorded and answers its approvals — any process may."""
        self.screen.line(f"  ({held}, which runs its open turn: this chat follows it — "
                         "its answers show as they are recorded, /approve and /deny answer "
                         "its calls, a message goes to the turn's next step)", dim=True)
        try:  # its requests were recorded before this chat listened: the views must hold them
            self.runtime.catch_up_views(self.sid)
        except (TimeoutError, TerretError):
            pass  # as far as they got: `/approve` names a call all the same
        for approval in self.runtime.views.pending(self.sid):
            self.questions.needs_approval(approval.call_id, approval.name, approval.args)

    def banner(self, *, new: bool) -> None:
        session = self.runtime.writer.load(self.sid)
        try:
            model = self.runtime.model_spec(session, "main")
        except TerretError:
            model = "(no main model configured)"
        self.screen.line(f"session {self.sid}", dim=True)
        self.screen.line(f"terret chat — agent {session.state.agent}, model {model}, store "
                         f"{self.obj.masked_uri}" + ("" if new else " (continued)"), dim=True)
        self.screen.line("type /help for commands, /quit or Ctrl-D to leave", dim=True)

    def recap(self) -> None:
        """The last few exchanges of a continued session, from its log: what was said, not
        what the model is shown now — a compaction's summary stands there for everything
        before it, and was shown as something the user typed."""
        from terret.domain import events as ev
        from terret.domain.store import session_stream

        records = self.runtime.store.read_stream(session_stream(self.sid), backwards=True,
                                                 limit=RECAP_EVENTS)
        said = [e.payload for e in _readable(reversed(records))
                if isinstance(e.payload, ev.UserMessage | ev.ContextInjected
                              | ev.AssistantMessage | ev.ToolResult)]
        starts = [i for i, p in enumerate(said) if isinstance(p, ev.UserMessage)]
        if not said:
            return
        # A turn longer than the events read (many steps and calls) begins before them: its
        # latest part is shown.
        first = (starts[-RECONNECT_EXCHANGES] if len(starts) >= RECONNECT_EXCHANGES
                 else starts[0] if starts else max(0, len(said) - RECAP_LONG_TURN))
        tail = said[first:]
        self.screen.line("— the last exchanges —", dim=True)
        for p in tail:
            if isinstance(p, ev.UserMessage):
                self.screen.line(f"you> {one_line(p.text, 300)}", dim=True)
            elif isinstance(p, ev.ContextInjected):
                self.screen.line(f"inbox> {one_line(p.text, 300)}", dim=True)
            elif isinstance(p, ev.AssistantMessage):  # its text, then its calls: as shown live
                if p.text:
                    self.screen.line(f"agent> {one_line(p.text, 300)}", dim=True)
                for c in p.tool_calls:
                    self.screen.line(f"  → {c.name}({as_json(c.args)})", dim=True)
            else:
                self.screen.line(f"  ← {p.name}: {one_line(p.content, 120)}", dim=True)
        self.screen.line("—", dim=True)

    def loop(self) -> None:
        try:
            self._lines()
        finally:  # whatever ends the chat, the lines typed are kept for the next one
            self.input.save()

    def _lines(self) -> None:
        while not self.leaving:
            try:
                ahead = self.input.typed_ahead()
                text = self.input.prompt(self.screen, "you> ")
            except EOFError:
                self.screen.line()
                break
            except KeyboardInterrupt:
                self.screen.line("^C (/quit or Ctrl-D to leave)", dim=True)
                continue
            stripped = text.strip()
            if not stripped or self.questions.too_late(stripped, ahead):
                continue
            if stripped.startswith("/") and not stripped.startswith("//"):
                if self.command(stripped) == "quit":
                    break
                continue
            self.send(text.lstrip()[1:] if stripped.startswith("//") else text)
        if not self._closed("leaving"):
            self.screen.line("  (leaving before the tool returned: the turn stays open with "
                             "its cancel recorded and closes when the session is next resumed)",
                             dim=True)

    def send(self, text: str) -> None:
        """A message to the model: a new turn, once a cancelled one has closed. While another
        worker runs the session's open turn, the message waits in its inbox (``wake``): that
        turn's next step takes it (R24), as it takes `terret inject`'s."""
        if not self._closed("this message is sent"):
            self.screen.line("  (not sent)", dim=True)
            return
        # An agent here whose session another process took since holds nothing: dropped
        # before it is attached again (it would stream nothing of the turn run anew).
        self.runtime.agent_host.drop_if_moved(self.sid)
        here = self.runtime.agent_for_session(self.sid)
        if here is not None and here.busy:  # a turn woken from another shell runs here
            self.runtime.inject(self.sid, text, wake=True)
            self.screen.line("  (queued: a turn woken from another shell is running; its next "
                             "step takes the message, or the next turn starts with it)", dim=True)
            return
        if here is not None and here is not self.agent:
            self.attach(here)  # an agent spawned anew (it lost the session, took it back)
        elif here is None:
            try:  # the turn may have ended: an idle session moves to this process
                self.attach(self.runtime.spawn_agent(self.sid))
            except SessionClosed as exc:
                self._closed_elsewhere(exc)
                return
            except SessionOwned as exc:
                self.runtime.inject(self.sid, text, wake=True)
                self.screen.line(f"  (queued: {exc}, which runs the open turn: its next "
                                 "step takes the message)", dim=True)
                return
        self.questions.new_turn()
        self.drive(partial(self._run_turn, text))

    def _run_turn(self, text: str) -> object:
        try:
            return self.runtime.run_turn(self.sid, text)
        except SessionClosed as exc:  # the close came before this agent here heard of it
            self._closed_elsewhere(exc)
            return None

    def _closed_elsewhere(self, exc: SessionClosed) -> None:
        """Closed from another shell: the message was not sent, and the chat ends."""
        self.screen.line(f"  (not sent: {type(exc).__name__}: {exc} — closed from another "
                         "shell)", fg="red")
        self.leaving = self.closed = True

    def command(self, line: str) -> str | None:
        name, _, rest = line.partition(" ")
        rest = rest.strip()
        if name in ("/quit", "/exit", "/q"):
            return "quit"
        if name in ("/help", "/?"):
            self.screen.line(HELP)
        elif name == "/log":
            if rest and not (rest.isascii() and rest.isdigit()
                             and 1 <= int(rest) <= MAX_LOG_LINES):
                self.screen.line(f"usage: /log [N], N a number of events from 1 to "
                                 f"{MAX_LOG_LINES:,} (default 10)", fg="red")
            else:
                self._log(int(rest) if rest else 10)
        elif name == "/usage":
            self._usage()
        elif name == "/approve":
            self.questions.decide(rest.split(" ", 1)[0] if rest else None, "approved", None)
        elif name == "/deny":
            call, _, reason = rest.partition(" ")
            if not call or not reason.strip():
                self.screen.line("usage: /deny CALL REASON", fg="red")
            else:
                self.questions.decide(call, "denied", reason.strip())
        else:
            self.screen.line(f"unknown command {name}; /help lists them", fg="red")
        return None

    def _log(self, count: int) -> None:
        from terret.cli.logcmd import summarize
        from terret.domain.codec import decode
        from terret.domain.store import session_stream

        store = self.runtime.store
        stream = session_stream(self.sid)
        start = max(1, store.stream_version(stream) - count + 1)
        for record in store.read_stream(stream, from_seq=start, limit=count):
            event = decode(record)
            self.screen.line(f"{event.seq:>6}  {event.wire_name:<22} {summarize(event)}",
                             dim=True)

    def _say_if_halted(self, *views: str) -> None:
        """One line before what is read from a halted view: it is old (the CLI's read commands
        say the same on stderr)."""
        for name in views:
            fault = self.runtime.views.store.fault(name)
            if fault is not None:
                self.screen.line(f"  (what follows may be old: the {name} view halted at "
                                 f"position {fault[0]} — see `terret doctor`)", fg="yellow")

    def _usage(self) -> None:
        self._say_if_halted("usage")
        total = self.runtime.usage(self.sid)
        self.screen.line(f"usage: {total['prompt_tokens']} prompt + "
                         f"{total['completion_tokens']} completion tokens, "
                         f"{money(total['cost'])}, {total['steps']} step"
                         f"{'' if total['steps'] == 1 else 's'}")
        for spec, used in sorted(self.runtime.views.usage_by_model(self.sid).items()):
            self.screen.line(f"  {spec}: {used.prompt_tokens} + {used.completion_tokens} "
                             f"tokens, {money(used.cost)}")
        for purpose, upkeep in sorted(self.runtime.upkeep_usage(self.sid).items()):
            self.screen.line(f"  upkeep, {purpose}: {upkeep['prompt_tokens']} + "
                             f"{upkeep['completion_tokens']} tokens, {money(upkeep['cost'])}")

    def run(self, *, new: bool, live: Agent | None, held: SessionOwned | None) -> None:
        """The whole conversation: banner, recap, the open turn (followed when another worker
        holds it, else resumed here), then the prompt until the user leaves."""
        from terret.domain import events as ev

        runtime, sid = self.runtime, self.sid
        # A woken turn that fails is said by the chat itself ("(turn 3 failed: …)"), below the
        # prompt: the serving log's line for it would say it twice.
        logging.getLogger("terret.serving").addFilter(_said_by_chat)
        try:  # SIGTERM (``sigterm_leaves``, around the command) leaves from here on
            self.banner(new=new)
            if live is not None:
                self.attach(live)
            runtime.runner.add_listener(self.on_event, {
                c.wire_name for c in (ev.AssistantMessage, ev.ToolResult, ev.SessionCompacted,
                                      ev.ApprovalResolved, ev.ApprovalRequested,
                                      ev.UserMessage, ev.ContextInjected, ev.TurnEnded,
                                      ev.AgentAttached)})
            if not new:
                self.recap()
            if held is not None:
                self.follow(held)
            elif runtime.resumable(sid):
                self.screen.line("resuming the open turn…", dim=True)
                self.drive(lambda: runtime.resume_turn(sid))
            self.loop()
        except Terminated:  # outside a turn and the prompt (the banner, a /command's output)
            self.screen.line()
        with sigterm_waits():  # a SIGTERM now asks for this leaving: it goes on
            time.sleep(0)  # let a last listener line out before the goodbye
            self._release()
        self.screen.line("bye — the session is closed" if self.closed
                         else f"bye — resume with: terret chat {sid}", dim=True)

    def _release(self) -> None:
        """Stop as SIGTERM stops ``serve``: a turn left parked here (the input ended at its
        question) or still closing stops, open and resumable, and the session is released
        (``agent/detached``) so that a running ``serve`` takes it over at once. Without the
        grace the parked turn had not stopped yet and kept the session until its lease
        expired. Ctrl-C here leaves as a crash would: the tool still running dies with this
        process, unreleased, and a worker on this host takes the turn over as soon as the
        process is gone (the running call runs again, or waits in doubt)."""
        try:
            # Inside the try: a Ctrl-C may land while the line is still being written (the
            # reader acts on it at once), and it must stop the wait as one a moment later does.
            if self.agent is not None and self.agent.busy:
                self.screen.line("  (leaving: the open turn stops at its step boundary and "
                                 "stays open; Ctrl-C to stop waiting)", dim=True)
            _close_on_a_thread_of(self.runtime)
        except KeyboardInterrupt:
            self.screen.line("  (stopped waiting: the turn is left as after a crash; a running "
                             "`terret serve` takes it over once this process is gone)", dim=True)
            # Left as a crash leaves it: the command's own close at exit must not wait for,
            # release or warn about the turn (the interrupt may have come before this close
            # marked the runtime stopping).
            self.runtime.stopping.set()
            self.runtime.runner.stop(timeout=1.0)  # not left reading a store about to close


def _close_on_a_thread_of(runtime: Runtime) -> None:
    """``runtime.close`` on a thread of its own, waited for here: a Ctrl-C lands in this wait,
    never inside the close — where it could leave a lock of the runtime's taken for good (one
    landing inside ``stopping.set()`` hung the chat when it set it again)."""
    failed: list[BaseException] = []
    done = threading.Event()

    def close() -> None:
        try:
            runtime.close(grace=LEAVING_GRACE)
        except BaseException as exc:  # handed to the waiting thread
            failed.append(exc)
        finally:
            done.set()

    threading.Thread(target=close, name="terret-chat-leaving", daemon=True).start()
    while not waited(done, 0.1):
        pass
    if failed:
        raise failed[0]


def _said_by_chat(record: logging.LogRecord) -> bool:
    from terret.runtime.serving import WOKEN_TURN_FAILED

    return not getattr(record, WOKEN_TURN_FAILED, False)


def _readable(records: Iterable[StoredRecord]) -> Iterator[RecordedEvent]:
    """The records decoded, those no reader can decode (another client's) passed over."""
    from terret.domain.codec import decode
    from terret.domain.errors import CorruptRecord

    for record in records:
        try:
            yield decode(record)
        except CorruptRecord:
            continue


RECAP_EVENTS = 500
"""How far back in the log a continued chat looks for its last exchanges."""
RECAP_LONG_TURN = 12
"""What of them is shown when they hold no user message (a turn longer than them)."""

MAX_LOG_LINES = 100_000
"""The most events ``/log N`` shows (a larger N is refused, as ``terret log --tail`` refuses
a number its store cannot take)."""

LEAVING_GRACE = 30.0
"""How long leaving waits for a turn of this chat to reach a step boundary (a parked one
stops at once; a running tool finishes first)."""


@click.command("chat")
@click.argument("session_id", type=SESSION, required=False)
@click.option("--model", "spec", type=MODEL_SPEC, default=None,
              help="Main model spec, e.g. openrouter:openai/gpt-4o (recorded as model/set).")
@click.option("--agent", type=AGENT_NAME, default=None,
              help="Agent definition for a new session.")
@APP_OPTION
@click.pass_obj
def chat(obj: CliContext, session_id: UUID | None, spec: str | None, agent: str | None,
         app_spec: str | None) -> None:
    """Chat with an agent in the terminal; a new session unless SESSION is given.
    Type /help for the chat's commands, /quit (or Ctrl-D) to leave; the session stays in the
    store."""
    if session_id is not None and agent is not None:  # it was silently ignored
        raise click.BadParameter("names the agent of a new session; SESSION keeps its own",
                                 param_hint="'--agent'")
    # The command line is checked before the store is opened: a refused one leaves no new
    # store or views file behind (as serve's).
    app = app_for(app_spec)
    if spec is not None:  # this process runs its steps: one it cannot resolve would fail them
        check_resolves(app.resolver, spec, param_hint="'--model'", served_here=True)
    if session_id is None and agent is not None:
        _require_defined(app, agent)
    obj.store(create=session_id is None)  # an existing session needs an existing store
    if session_id is not None:
        obj.require_session(session_id)
    runtime = runtime_for(obj, app_spec, app)
    runtime.start()
    with sigterm_leaves():
        try:
            _converse(obj, runtime, session_id, spec, agent)
        except Terminated:
            # Outside the conversation, which leaves on its own (before it began, or in the
            # instant around its leaving): the command's close at exit releases the session.
            click.echo("bye — stopped by SIGTERM", err=True)


def _converse(obj: CliContext, runtime: Runtime, session_id: UUID | None, spec: str | None,
              agent: str | None) -> None:
    new = session_id is None
    sid = _new_session(runtime, agent, spec) if session_id is None else session_id
    # Attached first: a session whose agent the app does not define is refused before the
    # model/set below is written.
    held: SessionOwned | None = None
    try:
        live = runtime.agent_for_session(sid) or runtime.spawn_agent(sid)
    except SessionOwned as exc:  # another live worker runs its open turn: follow it
        live, held = None, exc
    if not new and spec is not None:
        runtime.set_model(sid, "main", spec, by=operator())
    Chat(obj, runtime, sid).run(new=new, live=live, held=held)


def _require_defined(app: App, agent: str) -> None:
    """An agent the app does not define is a usage error on ``--agent``."""
    names = sorted(a.name for a in app.agents)
    if agent not in (names or ["default"]):
        _undefined(agent, names, f"no agent definition named {agent!r}")


def _undefined(agent: str, names: list[str], message: str) -> NoReturn:
    defined = ", ".join(names) or "none, so only 'default'"
    raise click.BadParameter(f"{message} (the app's agents: {defined})", param_hint="'--agent'")


def _new_session(runtime: Runtime, agent: str | None, spec: str | None) -> UUID:
    """A new session of ``agent`` (default: the app's first agent). An agent the app does not
    define is a usage error on ``--agent``, before anything is written."""
    from terret.domain.errors import ConfigurationError

    name = agent or next(iter(runtime.definitions), "default")
    try:
        return runtime.create_session(agent=name,
                                      roles={"main": spec} if spec is not None else None)
    except ConfigurationError as exc:
        if agent is None:
            raise
        _undefined(agent, sorted(runtime.definitions), str(exc))


def register(cli: click.Group) -> None:
    cli.add_command(chat)
