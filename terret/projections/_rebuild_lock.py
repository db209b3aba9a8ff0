"""Who is rebuilding a views file: an advisory lock on ``<views>.rebuild`` held for the length of
a rebuild or a skip, by whichever process runs it.

A rebuild replays in one write transaction of the views file, so SQLite alone already keeps
every other writer out. What SQLite cannot tell the others is *why* the file is locked: a
batch of a runner ends within a second, a rebuild of a large log takes minutes. The lock says
it (with the holder's pid and start time in the file), so a runner elsewhere waits for the
rebuild instead of failing after SQLite's busy timeout, a read command shows the views as they
were before the rebuild (saying so) instead of waiting for it, and a second rebuild is refused
(``ViewsBusy``) instead of queueing behind the first. The kernel drops the lock when its
process ends, however it ends: a rebuild killed midway leaves no lock, and its transaction,
never committed, leaves the views as they were.

POSIX ``flock``; where there is none (Windows) the lock is not taken and the operations are
still correct, only the waiting and the messages are SQLite's.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime

from terret.domain.errors import StoreFull, ViewsBusy

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

_held_here: set[str] = set()
"""The lock files this process holds: its own rebuild is nobody it must wait for."""


class RebuildLock:
    def __init__(self, views_path: str) -> None:
        # In-memory views belong to one connection of one process: nobody else to tell.
        self.path = None if views_path == ":memory:" or fcntl is None \
            else f"{views_path}.rebuild"
        self._key = "" if self.path is None else os.path.realpath(self.path)

    @contextmanager
    def held(self) -> Iterator[None]:
        """Hold the lock; ``ViewsBusy`` naming the holder when another process has it."""
        if self.path is None:
            yield
            return
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise _typed(exc, self.path) from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise self._busy(self._holder(fd)) from None
            try:
                os.ftruncate(fd, 0)
                os.write(fd, f"{os.getpid()} {time.time():.0f}\n".encode())
            except OSError as exc:
                raise _typed(exc, self.path) from None
            _held_here.add(self._key)
            try:
                yield
            finally:
                _held_here.discard(self._key)
        finally:
            os.close(fd)  # releases the lock

    def refuse_if_held(self) -> None:
        """``ViewsBusy`` now when another process rebuilds, before any work is started (the
        rebuild itself checks again when it takes the lock)."""
        holder = self.holder()
        if holder is not None:
            raise self._busy(holder)

    def _busy(self, holder: str) -> ViewsBusy:
        assert self.path is not None
        return ViewsBusy(f"{holder} is rebuilding or skipping in the views "
                         f"{self.path.removesuffix('.rebuild')}; nothing was changed: run it "
                         "again when that one ends")

    def holder(self) -> str | None:
        """Who holds the lock (``"pid N since HH:MM:SS"``), or None when nobody does, or this
        process does (whose own transactions SQLite serialises)."""
        if self.path is None or self._key in _held_here:
            return None
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError:
            return None  # never taken here (or not readable): nobody is rebuilding
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return self._holder(fd)
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        finally:
            os.close(fd)

    @staticmethod
    def _holder(fd: int) -> str:
        parts = os.pread(fd, 64, 0).decode(errors="replace").split()
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            return "another process"
        since = datetime.fromtimestamp(int(parts[1])).strftime("%H:%M:%S")
        return f"process {parts[0]} (since {since})"


def _typed(exc: OSError, path: str) -> Exception:
    """A full disk as ``StoreFull`` (as a full disk under the views file is); other failures
    to write the lock file as they are."""
    if exc.errno == errno.ENOSPC:
        return StoreFull(f"the disk holding the views {path.removesuffix('.rebuild')} is full "
                         f"({exc.strerror}): nothing was changed; free some space and retry")
    return exc
