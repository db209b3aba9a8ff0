"""The emulator's persistent subscription groups, one lock over all of them, and their clock.

Every group operation runs under `changed` (a Condition on one lock) and notifies it, which
wakes the Read calls waiting for their outbox. A clock thread, started with the first group,
gives groups their ticks: when the store's log grows (new events reach live consumers) and
when a message deadline or a time-based checkpoint is due.

Lock order: this lock, then the store's (groups write checkpoints and parked messages);
nothing holding the store's lock ever takes this one, so the two cannot deadlock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from .persistent import Group
from .persistent_model import GroupSettings
from .persistent_source import Source, validate_all_start
from .reads import Origin
from .store import EventStore

# The clock sleeps at most this long; message time-outs and checkpoints are due at most
# this late (plus the time to wake up).
IDLE_SLICE_SECONDS = 0.5
MIN_SLICE_SECONDS = 0.005

T = TypeVar("T")


class GroupExists(Exception):
    pass


class GroupNotFound(Exception):
    pass


class PersistentRegistry:
    def __init__(self, store: EventStore) -> None:
        self._store = store
        self.changed = threading.Condition(threading.RLock())
        self._groups: dict[tuple[str, str], Group] = {}  # (source, group name) -> group
        self._clock: threading.Thread | None = None
        self._closed = False

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Run a group operation; waiting Read calls are woken afterwards."""
        with self.changed:
            try:
                yield
            finally:
                self.changed.notify_all()

    # -- groups ----------------------------------------------------------------------------

    def create(self, source: Source, name: str, settings: GroupSettings, origin: Origin) -> None:
        settings.validate()
        if source.is_all:
            validate_all_start(self._store, origin)
        with self.locked():
            if (source.name, name) in self._groups:
                raise GroupExists(name)
            self._groups[(source.name, name)] = Group(self._store, source, name, settings, origin)
            self._start_clock()

    def get(self, source: str, name: str) -> Group:
        group = self._groups.get((source, name))
        if group is None:
            raise GroupNotFound(name)
        return group

    def update(self, source: str, name: str, settings: GroupSettings, origin: Origin) -> None:
        with self.locked():
            group = self.get(source, name)
            settings.validate()
            if group.source.is_all:
                validate_all_start(self._store, origin)
            group.update(settings, origin)

    def delete(self, source: str, name: str) -> None:
        with self.locked():
            group = self.get(source, name)
            del self._groups[(source, name)]
            group.delete()

    def run(self, source: str, name: str, operation: Callable[[Group], T]) -> T:
        """`operation` on the named group, under the lock (GroupNotFound if none)."""
        with self.locked():
            group = self.get(source, name)
            self._start_clock()  # again after a stop/start of the emulator
            return operation(group)

    def groups(self, source: str | None = None) -> list[Group]:
        """Groups ordered as the server lists them: by event source, then creation."""
        with self.changed:
            groups = [g for (s, _), g in self._groups.items() if source is None or s == source]
        return sorted(groups, key=lambda g: g.source.name)

    # -- the clock ---------------------------------------------------------------------------

    def _start_clock(self) -> None:
        if self._clock is None:
            self._clock = threading.Thread(
                target=self._run_clock, name="esdb-emulator-persistent", daemon=True
            )
            self._clock.start()

    def _run_clock(self) -> None:
        store = self._store
        seen = store.event_count
        timeout = IDLE_SLICE_SECONDS

        def grown_past(length: int) -> Callable[[], bool]:
            return lambda: self._closed or store.event_count > length

        while not self._closed:
            store.wait_for(grown_past(seen), timeout)
            seen = store.event_count
            with self.locked():
                now = time.monotonic()
                deadlines = []
                for group in list(self._groups.values()):
                    group.tick(now)
                    deadline = group.next_deadline()
                    if deadline is not None:
                        deadlines.append(deadline)
            # Checkpoints and parked messages written by the ticks grow the log too; they
            # are seen on the next pass, which is harmless.
            timeout = IDLE_SLICE_SECONDS
            if deadlines:
                timeout = min(timeout, max(MIN_SLICE_SECONDS, min(deadlines) - time.monotonic()))

    def wake(self) -> None:
        """Wake waiting Read calls (e.g. after `cut_subscriptions()`)."""
        with self.locked():
            pass

    def close(self) -> None:
        """Stop the clock (the emulator stopped); groups stay, as the server's do."""
        self._closed = True
        self._store.wake_waiters()
        self.wake()
        clock, self._clock = self._clock, None
        if clock is not None:
            clock.join(timeout=2)
        self._closed = False
