"""A ``terret chat`` process on a pseudo-terminal of its own, for the chat's pty tests: what
it prints (escape codes stripped), keys typed at it, its exit."""

from __future__ import annotations

import fcntl
import os
import re
import select
import signal
import subprocess
import sys
import termios
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from uuid import UUID

from tests.cli.conftest import Target

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][AB0-2]|\r")
LEFT, RIGHT, UP = "\x1b[D", "\x1b[C", "\x1b[A"


def _controlling_terminal() -> None:
    """In the child, after its ``setsid``: make the pty its controlling terminal, so that
    Ctrl-C typed there is a SIGINT to it, as in a shell."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class Terminal:
    """A ``python -m terret …`` process on a pseudo-terminal of its own."""

    def __init__(self, target: Target, *args: str, env: dict[str, str]) -> None:
        master, slave = os.openpty()
        self.master = master
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "terret", *target.args(*args)], stdin=slave, stdout=slave,
            stderr=slave, cwd=target.cwd, env=env, start_new_session=True, close_fds=True,
            preexec_fn=_controlling_terminal)
        os.close(slave)
        self.seen = ""
        self.mark = 0

    def _read(self, timeout: float) -> None:
        ready, _, _ = select.select([self.master], [], [], timeout)
        if ready:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:  # the process ended and closed its side
                chunk = b""
            if not chunk:
                raise EOFError(self.text())
            self.seen += chunk.decode(errors="replace")

    def text(self) -> str:
        return ANSI.sub("", self.seen)

    def expect(self, needle: str | tuple[str, ...], timeout: float = 30.0) -> str:
        """Wait until ``needle`` (or one of them) appears after the last match; returns what
        came before it."""
        deadline = time.monotonic() + timeout
        needles = (needle,) if isinstance(needle, str) else needle
        while True:
            plain = self.text()
            for one in needles:
                found = plain.find(one, self.mark)
                if found >= 0:
                    before = plain[self.mark:found]
                    self.mark = found + len(one)
                    return before
            if time.monotonic() > deadline:
                raise AssertionError(f"no {needle!r} in the terminal:\n{plain[self.mark:]}")
            try:
                self._read(0.1)
            except EOFError:
                raise AssertionError(f"the chat ended before {needle!r}:\n{self.text()}") \
                    from None

    def session(self) -> UUID:
        """The session the chat's banner names (its first line)."""
        return UUID(self.expect("\n").split("session ")[-1].strip())

    def type(self, keys: str) -> None:
        os.write(self.master, keys.encode())

    def finish(self, timeout: float = 30.0) -> int:
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            try:
                self._read(0.1)
            except EOFError:
                break
        code = self.proc.wait(max(0.1, deadline - time.monotonic()))
        os.close(self.master)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def say(self, line: str, then: str) -> str:
        """Type ``line`` and Enter; what came before ``then``, once it shows."""
        self.type(line + "\r")
        return self.expect(then)

    def leave(self) -> None:
        """``/quit``: the chat ends, exit 0."""
        self.type("/quit\r")
        assert self.finish() == 0, self.text()


CHAT_APP = "tests.cli.chat_app:app"


@contextmanager
def chatting(target: Target, env: dict[str, str], app: str, *args: str
             ) -> Iterator[tuple[Terminal, UUID]]:
    """``terret chat ARGS --app APP`` on a pty, at its first prompt: the terminal and the
    session its banner names. Killed afterwards, whatever happened in the block."""
    term = Terminal(target, "chat", *args, "--app", app, env=env)
    try:
        sid = term.session()
        term.expect("you> ")
        yield term, sid
    finally:
        term.kill()


def running(started: Path) -> None:
    deadline = time.monotonic() + 30
    while not started.exists():
        assert time.monotonic() < deadline, "the tool never started"
        time.sleep(0.05)
