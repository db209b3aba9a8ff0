"""The chat's terminal: what it prints (:class:`Screen`, shared by the turn's text, the log's
listener and the prompt) and how it reads lines (:class:`Input`: readline on a terminal, a polled
descriptor so that an approval's question can be withdrawn)."""

from __future__ import annotations

import os
import re
import select
import signal
import sys
import termios
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

import click

from terret.cli._format import printable

HISTORY_ENV = "TERRET_CHAT_HISTORY"
HISTORY_LINES = 1000


class Withdrawn(Exception):
    """The question was answered elsewhere while it was asked."""


class Terminated(EOFError):
    """SIGTERM reached the chat: it leaves as at the input's end (Ctrl-D)."""


def waited(event: threading.Event, timeout: float) -> bool:
    """``event.wait(timeout)`` for the main thread, where a Ctrl-C or a SIGTERM may interrupt
    it: polled with ``time.sleep``, never inside the event's lock. An interrupt that lands in
    ``Event.wait`` between its condition's release and re-acquire leaves the lock released,
    and the wait's exit then raises ``RuntimeError: release unlocked lock`` in place of the
    interrupt (the chat printed that error instead of stopping its wait)."""
    deadline = time.monotonic() + timeout
    while not event.is_set():
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(0.01, left))
    return True


@contextmanager
def _first_sigterm(then: Callable[[], None]) -> Iterator[None]:
    """While inside, on the main thread: the first SIGTERM calls ``then`` there, and puts the
    default back, so that a second stops the process at once."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def first(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        then()

    before = signal.signal(signal.SIGTERM, first)
    try:
        yield
    finally:
        if signal.getsignal(signal.SIGTERM) is first:
            signal.signal(signal.SIGTERM, before)


def _terminate() -> None:
    raise Terminated


def sigterm_leaves() -> AbstractContextManager[None]:
    """While inside: SIGTERM (``kill``, a supervisor or a closing terminal emulator stopping
    the chat) raises ``Terminated`` in the main thread, so the chat leaves as at Ctrl-D — the
    open turn stops at its step boundary, open, and the session is released for a ``serve``
    to take over at once — instead of dying unreleased until its lease expires. A second
    SIGTERM stops the process at once."""
    return _first_sigterm(_terminate)


def sigterm_waits() -> AbstractContextManager[None]:
    """While inside (the chat leaving): a first SIGTERM asks for what is being done, so it is
    taken without interrupting it; a second stops the process at once. Inside
    ``sigterm_leaves`` whose SIGTERM came already, the first one here stops it."""
    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        return nullcontext()
    return _first_sigterm(lambda: None)


class Screen:
    """What the chat prints, from three threads (the turn's text, the log's events, the
    prompt): one lock, and a record of whether the cursor is at the start of a line, so a
    prompt never runs into streamed output and every answer starts with ``agent>``."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.at_line_start = True
        self.agent_prefix = True  # the next text starts an answer (after a prompt, a tool)
        self.waiting: str | None = None
        """The prompt shown and waiting for a line: output from a turn started elsewhere
        starts below it, and the prompt is shown again when that turn ends."""

    def write(self, text: str, **style: Any) -> None:
        if not text:
            return
        with self.lock:
            click.secho(text, nl=False, color=False if os.environ.get("NO_COLOR") else None,
                        **style)
            self.at_line_start = text.endswith("\n")

    def line(self, text: str = "", **style: Any) -> None:
        """One line; the control characters a session's text holds shown escaped, as the
        CLI's other output shows them (a BEL, an escape sequence is seen, never acted on)."""
        with self.lock:
            self.fresh_line()
            self.write(printable(text) + "\n", **style)

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
            self.write(printable(chunk))


KEY_SEQUENCES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[O\[]?.|[\x00-\x08\x0b-\x1f\x7f]")
"""What arrow, function and editing keys send (CSI and SS3 sequences, a lone ESC and its key)
and other control characters: not text."""


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
        self._kept: list[str] = []  # lines typed before a question showed: the next messages
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
        except OSError as exc:  # the chat is over: said, not an error
            click.echo(f"warning: the chat's history was not saved to {self.history} "
                       f"({exc.strerror or exc}); set {HISTORY_ENV} to a file you can write",
                       err=True)

    def prompt(self, screen: Screen, text: str) -> str:
        """The chat's prompt; EOFError at Ctrl-D."""
        with screen.lock:
            screen.fresh_line()
            if not self.tty:
                click.echo(click.style(text, bold=True), nl=False)
            # The prompt holds the line: what a turn woken elsewhere prints starts below it.
            screen.at_line_start = False
            screen.agent_prefix = True
            screen.waiting = text
        try:
            if self._kept:  # typed before a question showed, kept for the prompt after it
                line = self._kept.pop(0)
                click.echo(click.style(text, bold=True) + printable(line))
                self._remember(line)
            elif self.tty:
                line = input(text)  # readline edits it (a styled prompt confuses its cursor)
            else:
                # Piped input: the questions read the same buffer, so a line meant for an
                # approval is not swallowed ahead of it by the prompt's reader.
                line = self._next_line(self.fd) if self._polled() else input()
                # What a terminal would have echoed (escaped): the transcript reads
                click.echo(printable(line))
        finally:
            with screen.lock:
                screen.waiting = None
                screen.at_line_start = True
                screen.agent_prefix = True
        return line

    def show_again(self, screen: Screen) -> None:
        """The waiting prompt again, below what a turn woken elsewhere printed, with what the
        user had typed at it (readline keeps the line; the terminal lost it)."""
        with screen.lock:
            if screen.waiting is None:
                return
            typed = ""
            if self.tty and self.history is not None:
                import readline

                typed = readline.get_line_buffer()
            screen.fresh_line()
            if self.tty:
                screen.write(screen.waiting + typed)
            else:
                screen.write(screen.waiting, bold=True)
            screen.agent_prefix = True

    def ask(self, screen: Screen, text: str, withdraw: Callable[[], str | None]) -> str:
        """A question that ``withdraw`` can take back (it returns why, or None)."""
        screen.write(text)
        if not self._polled():
            answer = input()
            screen.at_line_start = True
            return answer
        try:
            answer = self._next_line(self.fd, withdraw)
        except Withdrawn:
            if self.tty and self.fd is not None and not self.typed_ahead():
                # What was typed at the withdrawn question with no Enter yet is for it alone:
                # left in the terminal's line, it would be read by the next prompt and sent.
                # A whole line already typed (the terminal makes a line readable at its Enter)
                # stays: the next prompt reports it as the question's late answer.
                termios.tcflush(self.fd, termios.TCIFLUSH)
            raise
        if self.tty:
            # Read without readline (it cannot be withdrawn from): the terminal's own editing
            # applies (Backspace, Ctrl-U), and the keys it does not know arrive as escape
            # sequences — dropped, never written into the log as a reason.
            answer = KEY_SEQUENCES.sub("", answer)
        else:
            click.echo(printable(answer))  # echoed, as the prompt's lines are
        screen.at_line_start = True
        return answer

    def keep_typed_ahead(self) -> list[str]:
        """The whole lines typed at a terminal before a question shows, taken out of its way
        and kept for the prompts after it: nobody answers a question not yet seen (a ``y``
        typed ahead would approve a call unread), and a message typed while the model worked
        was taken for a wrong answer and lost. Piped input is read in order, each line where
        it is asked."""
        if not self.tty or not self._polled():
            return []
        assert self.fd is not None
        while select.select([self.fd], [], [], 0)[0]:
            chunk = os.read(self.fd, 4096)
            if not chunk:
                break
            self._buffer += chunk
        lines = []
        while b"\n" in self._buffer:
            lines.append(self._take_line())
        self._kept.extend(lines)
        return lines

    def _remember(self, line: str) -> None:
        """A line kept from before a question, in the history as if typed at the prompt."""
        if self.history is not None and line.strip():
            import readline

            readline.add_history(line)

    def typed_ahead(self) -> bool:
        """Whether a line (or part of one) is already waiting to be read: typed before the
        prompt or question about to be shown could be seen."""
        if self._buffer or self._kept:
            return True
        if not self._polled():
            return False
        assert self.fd is not None
        ready, _, _ = select.select([self.fd], [], [], 0)
        return bool(ready)

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
        return self._take_line()

    def _take_line(self) -> str:
        """The buffer's first whole line, taken out of it."""
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode(errors="surrogateescape").rstrip("\r")
