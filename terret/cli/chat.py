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

import os
import select
import sys
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any
from uuid import UUID

import click

from terret.cli._app import check_resolves
from terret.cli._context import MODEL_SPEC, SESSION, CliContext, as_json, money, operator
from terret.cli._params import AGENT_NAME
from terret.cli.admin import APP_OPTION, runtime_for
from terret.domain.errors import TerretError

if TYPE_CHECKING:
    from terret.domain.codec import RecordedEvent
    from terret.runtime.runtime import Runtime

HISTORY_ENV = "TERRET_CHAT_HISTORY"
HISTORY_LINES = 1000
RECONNECT_EXCHANGES = 3
HELP = """commands (never sent to the model):
  /help              this list
  /log [N]           the session's last N events (default 10)
  /usage             tokens and cost so far, per model
  /approve [CALL]    approve a pending call (the only one, without CALL)
  /deny CALL REASON  deny a pending call; the model sees REASON
  /quit, /exit       leave (Ctrl-D too); the session stays in the store
  //text             send a line that starts with '/'"""


class Withdrawn(Exception):
    """The question was answered elsewhere while it was asked."""


class Screen:
    """What the chat prints, from three threads (the turn's text, the log's events, the
    prompt): one lock, and a record of whether the cursor is at the start of a line, so a
    prompt never runs into streamed output and every answer starts with ``agent>``."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.at_line_start = True
        self.agent_prefix = True  # the next text starts an answer (after a prompt, a tool)

    def write(self, text: str, **style: Any) -> None:
        if not text:
            return
        with self.lock:
            click.secho(text, nl=False, color=False if os.environ.get("NO_COLOR") else None,
                        **style)
            self.at_line_start = text.endswith("\n")

    def line(self, text: str = "", **style: Any) -> None:
        with self.lock:
            self.fresh_line()
            self.write(text + "\n", **style)

    def fresh_line(self) -> None:
        with self.lock:
            if not self.at_line_start:
                self.write("\n")

    def text(self, chunk: str) -> None:
        """Streamed model text."""
        with self.lock:
            if self.agent_prefix:
                self.fresh_line()
                self.write("agent> ", bold=True)
                self.agent_prefix = False
            self.write(chunk)


class Input:
    """Lines from the user. The chat's prompt is ``input()`` (with readline on a terminal);
    an approval's question polls the terminal so that it can be withdrawn."""

    def __init__(self) -> None:
        try:
            self.fd: int | None = sys.stdin.fileno()
        except (AttributeError, OSError, ValueError):
            self.fd = None  # not a real file (a test harness): questions cannot be withdrawn
        self.tty = self.fd is not None and os.isatty(self.fd)
        self.history: Path | None = None
        self._buffer = b""
        if self.tty:
            self._readline()

    def _readline(self) -> None:
        try:
            import readline
        except ImportError:  # a Python without it: plain input, no history
            return
        path = Path(os.environ.get(HISTORY_ENV) or Path.home() / ".terret_chat_history")
        self.history = path
        readline.set_history_length(HISTORY_LINES)
        try:
            readline.read_history_file(path)
        except OSError:
            pass

    def save(self) -> None:
        if self.history is None:
            return
        import readline

        try:
            self.history.parent.mkdir(parents=True, exist_ok=True)
            readline.write_history_file(self.history)
        except OSError:
            pass

    def prompt(self, screen: Screen, text: str) -> str:
        """The chat's prompt; EOFError at Ctrl-D."""
        screen.fresh_line()
        if self.tty:
            line = input(text)  # readline edits it (a styled prompt would confuse its cursor)
        else:
            click.echo(click.style(text, bold=True), nl=False)
            # Piped input: the questions read the same buffer, so a line meant for an
            # approval is not swallowed ahead of it by the prompt's reader.
            line = self._next_line(self.fd) if self._polled() else input()
            click.echo(line)  # what a terminal would have echoed: the transcript reads right
        screen.at_line_start = True
        screen.agent_prefix = True
        return line

    def ask(self, screen: Screen, text: str, withdraw: Callable[[], str | None]) -> str:
        """A question that ``withdraw`` can take back (it returns why, or None)."""
        screen.write(text)
        if not self._polled():
            answer = input()
            screen.at_line_start = True
            return answer
        answer = self._next_line(self.fd, withdraw)
        if not self.tty:
            click.echo(answer)  # echoed, as the prompt's lines are
        screen.at_line_start = True
        return answer

    def _polled(self) -> bool:
        """Whether lines are read from the file descriptor itself (polled, so that a question
        can be withdrawn), rather than through ``input()``."""
        if self.fd is None:
            return False
        try:
            select.select([self.fd], [], [], 0)
        except (OSError, ValueError, TypeError):
            return False
        return True

    def _next_line(self, fd: int | None, withdraw: Callable[[], str | None] | None = None
                   ) -> str:
        """The next line read from ``fd`` (EOFError at its end); while none has come,
        ``withdraw`` is asked whether the question still stands (``Withdrawn`` if not)."""
        assert fd is not None
        while b"\n" not in self._buffer:
            ready, _, _ = select.select([fd], [], [], 0.1)
            if ready:
                chunk = os.read(fd, 4096)
                if not chunk:
                    if not self._buffer:
                        raise EOFError
                    self._buffer += b"\n"  # a last line without its newline
                self._buffer += chunk
            elif withdraw is not None and (why := withdraw()) is not None:
                raise Withdrawn(why)
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode(errors="surrogateescape").rstrip("\r")


class Chat:
    def __init__(self, obj: CliContext, runtime: Runtime, sid: UUID) -> None:
        self.obj = obj
        self.runtime = runtime
        self.sid = sid
        self.screen = Screen()
        self.input = Input()
        self.asked: set[str] = set()
        self.asking: str | None = None
        """The call whose approval question is on the screen."""
        self.withdrawn: str | None = None

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
        if isinstance(p, ApprovalResolved):
            if p.call_id == self.asking:  # a verdict from elsewhere: take the question back
                who = p.by.actor + (f" ({p.by.id})" if p.by.id else "")
                self.withdrawn = f"{p.call_id} was {p.verdict} elsewhere by {who}"
                self.screen.line(f"  ({self.withdrawn})", dim=True)
        elif isinstance(p, AssistantMessage):
            for c in p.tool_calls:
                self.screen.line(f"  → {c.name}({as_json(c.args)})", fg="yellow")
        elif isinstance(p, ToolResult):
            colour = "red" if p.is_error else "green"
            self.screen.line(f"  ← {p.name}: {_one_line(p.content, 200)}", fg=colour)
            self.screen.agent_prefix = True  # the text after a tool round is a new answer
        elif isinstance(p, SessionCompacted):
            self.screen.line("  (history compacted)", dim=True)

    # --- turns -----------------------------------------------------------------------------

    def drive(self, run: Callable[[], object]) -> None:
        """Run a turn in the background; ask about each approval as it comes (withdrawn when a
        verdict arrives from elsewhere). Ctrl-C cancels the turn."""
        work = threading.Thread(target=self._guarded(run), daemon=True)
        work.start()
        try:
            while work.is_alive():
                self._ask_pending()
                work.join(0.05)
        except KeyboardInterrupt:
            self.screen.line("  (cancelling the turn…)", dim=True)
            try:
                self.runtime.cancel(self.sid, by=operator(), reason="interrupted in chat")
            except TerretError:
                pass
            work.join(30)
        self.screen.fresh_line()

    def _guarded(self, fn: Callable[[], object]) -> Callable[[], None]:
        def run() -> None:
            try:
                fn()
            except TerretError as exc:
                self.screen.line(f"  {type(exc).__name__}: {exc}", fg="red")

        return run

    def _ask_pending(self) -> None:
        agent = self.runtime.agent_for_session(self.sid)
        if agent is None or agent.status != "waiting_approval":
            return
        for approval in self.runtime.views.pending(self.sid):
            if approval.call_id in self.asked:
                continue
            self.asked.add(approval.call_id)
            self._ask(approval.call_id, approval.name, approval.args)

    def _withdraw(self, call_id: str) -> str | None:
        """Why the question about ``call_id`` no longer stands, or None while it does."""
        if self.withdrawn is not None:
            return self.withdrawn  # the verdict's listener said so on the screen
        if any(p.call_id == call_id for p in self.runtime.views.pending(self.sid)):
            return None
        deadline = time.monotonic() + 1.0  # the view moved: its listener is about to run
        while self.withdrawn is None and time.monotonic() < deadline:
            time.sleep(0.02)
        if self.withdrawn is None:
            self.withdrawn = f"{call_id} is no longer pending"
            self.screen.line(f"  ({self.withdrawn})", dim=True)
        return self.withdrawn

    def _ask(self, call_id: str, name: str, args: dict[str, Any]) -> None:
        def withdraw() -> str | None:
            return self._withdraw(call_id)

        self.asking, self.withdrawn = call_id, None
        try:
            approved = self._yes_or_no(f"  approve {name}({as_json(args)})? [y/N] ", withdraw)
            if approved:
                self._verdict(call_id, "approved", None)
            else:
                self._verdict(call_id, "denied", self._reason(withdraw))
        except Withdrawn:
            return
        except EOFError:
            self.screen.line("  (no answer: the call stays pending)", dim=True)
        finally:
            self.asking = None

    def _yes_or_no(self, question: str, withdraw: Callable[[], str | None]) -> bool:
        """The answer to an approval's question: y/yes, or n/no/nothing (the default). Anything
        else is asked again — a message or a ``/command`` typed here is neither a verdict nor
        sent to the model (``/approve`` and ``/deny`` answer it)."""
        while True:
            answer = self.input.ask(self.screen, question, withdraw).strip().lower()
            if answer in ("y", "yes", "/approve"):
                return True
            if answer in ("", "n", "no", "/deny"):
                return False
            self.screen.line("  (answer y or n: the call waits for its verdict; messages and "
                             "/commands come after it)", dim=True)

    def _reason(self, withdraw: Callable[[], str | None]) -> str:
        """The denial's reason, which the model sees: free text, never a ``/command``."""
        while True:
            reason = self.input.ask(self.screen, "  reason (the model sees it) "
                                    "[denied in chat]: ", withdraw).strip()
            if reason.startswith("//"):  # as at the prompt: a text that starts with "/"
                return reason[1:]
            if not reason.startswith("/"):
                return reason or "denied in chat"
            self.screen.line("  (a /command is not a reason: type the reason the model will "
                             "see, or nothing)", dim=True)

    def _verdict(self, call_id: str, verdict: str, reason: str | None) -> None:
        from terret.domain.errors import ApprovalNotPending

        self.asking = None  # this chat's own verdict: nothing to withdraw
        try:
            if verdict == "approved":
                self.runtime.approve(self.sid, call_id, by=operator(), reason=reason)
            else:
                self.runtime.deny(self.sid, call_id, by=operator(), reason=reason or "denied")
        except ApprovalNotPending:
            self.screen.line(f"  ({call_id} was decided elsewhere already)", dim=True)

    # --- the conversation --------------------------------------------------------------------

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
        """The last few exchanges of a continued session."""
        self.runtime.catch_up_views()
        messages = [m for m in self.runtime.views.messages(self.sid) if m.role != "system"]
        starts = [i for i, m in enumerate(messages) if m.role == "user"]
        if not starts:
            return
        tail = messages[starts[-RECONNECT_EXCHANGES] if len(starts) >= RECONNECT_EXCHANGES
                        else starts[0]:]
        self.screen.line("— the last exchanges —", dim=True)
        for m in tail:
            if m.role == "user":
                self.screen.line(f"you> {_one_line(m.text, 300)}", dim=True)
            elif m.role == "assistant":
                for c in m.tool_calls:
                    self.screen.line(f"  → {c.name}({as_json(c.args)})", dim=True)
                if m.text:
                    self.screen.line(f"agent> {_one_line(m.text, 300)}", dim=True)
            elif m.role == "tool":
                self.screen.line(f"  ← {m.tool_name}: {_one_line(m.text, 120)}", dim=True)
        self.screen.line("—", dim=True)

    def loop(self) -> None:
        while True:
            try:
                text = self.input.prompt(self.screen, "you> ")
            except EOFError:
                self.screen.line()
                break
            except KeyboardInterrupt:
                self.screen.line("^C (/quit or Ctrl-D to leave)", dim=True)
                continue
            stripped = text.strip()
            if not stripped:
                continue
            if stripped.startswith("/") and not stripped.startswith("//"):
                if self.command(stripped) == "quit":
                    break
                continue
            if stripped.startswith("//"):
                text = text.lstrip()[1:]
            self.asked.clear()
            self.drive(partial(self.runtime.run_turn, self.sid, text))
        self.input.save()

    def command(self, line: str) -> str | None:
        name, _, rest = line.partition(" ")
        rest = rest.strip()
        if name in ("/quit", "/exit", "/q"):
            return "quit"
        if name in ("/help", "/?"):
            self.screen.line(HELP)
        elif name == "/log":
            self._log(int(rest) if rest.isdigit() else 10)
        elif name == "/usage":
            self._usage()
        elif name == "/approve":
            self._decide(rest.split(" ", 1)[0] if rest else None, "approved", None)
        elif name == "/deny":
            call, _, reason = rest.partition(" ")
            if not call or not reason.strip():
                self.screen.line("usage: /deny CALL REASON", fg="red")
            else:
                self._decide(call, "denied", reason.strip())
        else:
            self.screen.line(f"unknown command {name}; /help lists them", fg="red")
        return None

    def _decide(self, call: str | None, verdict: str, reason: str | None) -> None:
        pending = [p.call_id for p in self.runtime.views.pending(self.sid)]
        if call is None:
            if len(pending) != 1:
                self.screen.line(f"pending: {', '.join(pending) or 'nothing'}; name the call",
                                 fg="red")
                return
            call = pending[0]
        matches = [c for c in pending if c == call] or [c for c in pending if c.startswith(call)]
        if len(matches) != 1:
            self.screen.line(f"no single pending call {call!r} (pending: "
                             f"{', '.join(pending) or 'nothing'})", fg="red")
            return
        self._verdict(matches[0], verdict, reason)
        self.screen.line(f"  {verdict} {matches[0]}", dim=True)

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

    def _usage(self) -> None:
        total = self.runtime.usage(self.sid)
        self.screen.line(f"usage: {total['prompt_tokens']} prompt + "
                         f"{total['completion_tokens']} completion tokens, "
                         f"{money(total['cost'])}, {total['steps']} step"
                         f"{'' if total['steps'] == 1 else 's'}")
        for spec, used in sorted(self.runtime.views.usage_by_model(self.sid).items()):
            self.screen.line(f"  {spec}: {used.prompt_tokens} + {used.completion_tokens} "
                             f"tokens, {money(used.cost)}")


def _one_line(text: str, n: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 1] + "…"


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
    obj.store(create=session_id is None)  # an existing session needs an existing store
    if session_id is not None:
        obj.require_session(session_id)
    runtime = runtime_for(obj, app_spec)
    if spec is not None:  # this process runs its steps: one it cannot resolve would fail them
        check_resolves(runtime.resolver, spec, param_hint="'--model'", served_here=True)
    runtime.start()
    new = session_id is None
    sid = _new_session(runtime, agent, spec) if session_id is None else session_id
    # Attached first: a session whose agent the app does not define is refused before the
    # model/set below is written.
    live = runtime.agent_for_session(sid) or runtime.spawn_agent(sid)
    if not new and spec is not None:
        runtime.set_model(sid, "main", spec, by=operator())
    session = Chat(obj, runtime, sid)
    session.banner(new=new)
    live.on_text = session.screen.text
    from terret.domain import events as ev

    runtime.runner.add_listener(session.on_event, {
        c.wire_name for c in (ev.AssistantMessage, ev.ToolResult, ev.SessionCompacted,
                              ev.ApprovalResolved)})
    if not new:
        session.recap()
    if runtime.resumable(sid):
        session.screen.line("resuming the open turn…", dim=True)
        session.drive(lambda: runtime.resume_turn(sid))
    session.loop()
    time.sleep(0)  # let a last listener line out before the goodbye
    session.screen.line(f"bye — resume with: terret chat {sid}", dim=True)


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
        defined = ", ".join(sorted(runtime.definitions)) or "none, so only 'default'"
        raise click.BadParameter(f"{exc} (the app's agents: {defined})",
                                 param_hint="'--agent'") from None


def register(cli: click.Group) -> None:
    cli.add_command(chat)
