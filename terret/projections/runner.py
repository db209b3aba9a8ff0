"""The projection runner: one catch-up subscription per process feeding every projection in log
order, then the listeners (so a listener always reads views that include its event).

It is four parts: the subscription loop (here: ``start``/``stop``, ``catch_up``,
``wait_until``), the batch applier (``_applier``: a page into the projections in one
transaction, tracked positions only moving forward), the listener bus (``_bus``), and the
operators' operations (``_operations``: rebuild, verify, skip — each one pass over the log for
all the projections it is given).

During catch-up the runner commits in batches (``batch_size`` events, fewer when the
subscription delivers smaller pages); live, it commits as soon as the subscription has nothing
more buffered. ``wait_until(position)`` gives read-your-writes. Projections may keep state in
memory for the length of a batch (``Projection.begin``/``flush``): a batch of thousands of events
writes each touched row once.

Before it reads the views, the runner checks that they were built from its store's log
(``check_log``): views built from another store, or ahead of the log (a store restored from an
older copy), are emptied and rebuilt from position 0, with a warning.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial

from terret.domain.catalogue import EventCatalogue, catalogue
from terret.domain.errors import (
    ConfigurationError,
    NotATerretStore,
    ProjectionHalted,
    RuntimeFault,
    StoreCorrupt,
    StoreError,
    TerretError,
    ViewsMismatch,
)
from terret.domain.store import CaughtUp, Checkpoint, EventStore, StoredRecord, Subscription
from terret.projections import _operations as operations
from terret.projections._applier import BatchApplier
from terret.projections._bus import Listener, ListenerBus, ListenerHandle
from terret.projections._collector import collector_paused
from terret.projections._logcheck import LogCheck
from terret.projections._operations import Progress
from terret.projections._view_store import is_busy, table_clash
from terret.projections.base import Projection, ViewStore

__all__ = ["Listener", "ListenerHandle", "ProjectionRunner", "ProjectionState", "Progress"]

log = logging.getLogger("terret.projections")

REPLAY_BATCHES = 8
"""Rebuild, verify and skip apply batches this many times ``batch_size``."""


@dataclass(frozen=True)
class ProjectionState:
    name: str
    position: int
    lag: int
    fault: tuple[int, str] | None


@dataclass
class StreamScope:
    """What a scoped runner follows: the streams watched, and for each stream it ever
    watched the position of its last event applied (a stream watched again, or delivered again
    by a new subscription, is applied from there)."""

    watched: set[str]
    marks: dict[str, int] = field(default_factory=dict)

    def streams(self) -> frozenset[str]:
        return frozenset(self.watched)

    def unseen(self, records: Sequence[StoredRecord]) -> list[StoredRecord]:
        """The records of watched streams past their marks (``note`` them once applied)."""
        marks, watched = self.marks, self.watched
        return [r for r in records
                if r.stream in watched and r.position > marks.get(r.stream, 0)]

    def note(self, records: Sequence[StoredRecord]) -> None:
        for r in records:
            self.marks[r.stream] = r.position


class ProjectionRunner:
    def __init__(
        self,
        store: EventStore,
        views: ViewStore,
        projections: Sequence[Projection],
        *,
        batch_size: int = 5000,
        registry: EventCatalogue = catalogue,
    ) -> None:
        names = [p.name for p in projections]
        if len(set(names)) != len(names):
            raise ValueError(f"projection names must be unique: {names}")
        clash = table_clash(projections)
        if clash is not None:
            raise ConfigurationError(clash)
        self.store = store
        self.views = views
        self.projections = list(projections)
        self.batch_size = batch_size
        self.replay_batch_size = REPLAY_BATCHES * batch_size
        """The batches of rebuild, verify and skip: a pass from position 0 pays for each batch
        (every row the batch touched written, the view's pages rewritten at its commit) and
        holds one batch in memory, which a one-off pass can afford eight times over."""
        self.registry = registry
        self._log = LogCheck(store, views, self.projections)
        self._applier = BatchApplier(views, registry, self._log.guard)
        self._bus = ListenerBus()
        self._pause = threading.RLock()
        self._progress = threading.Condition()
        self._thread: threading.Thread | None = None
        self._subscription: Subscription | None = None
        self._stopping = threading.Event()
        self._error: BaseException | None = None
        self._create_tables()
        self._position = self._lowest_tracked()
        self._applied = self._position  # applied to the views (published after the listeners)
        self._applying = self._locked_out = False  # what a waiting turn waits out (wait_until)
        self._scope: StreamScope | None = None
        self._generation = 0
        """Moves on whenever the scope changes: a batch of an older subscription is dropped."""

    def _create_tables(self) -> None:
        for projection in self.projections:
            self.views.ensure(projection)

    # --- which log ---------------------------------------------------------------------------

    def check_log(self) -> bool:
        """Check that the views were built from this store's log (``_logcheck``); if not,
        empty them and let them replay from position 0 (a warning says why), and return True.
        ``start`` and ``catch_up`` call it, so nothing reads views ahead of the log: the
        allow-list reads the policy view only after one of them."""
        with self._pause:
            if not self._log.check():
                return False
            self._create_tables()
            self._applied = 0
            if self._scope is not None:  # emptied: the watched streams replay from 0 too
                self._scope.marks.clear()
            with self._progress:
                self._position = 0
            return True

    def _recheck(self, head: int) -> None:
        if self._log.needed(head):
            self.check_log()

    def _checked(self) -> None:
        if self._log.generation is None:
            self.check_log()

    # --- listeners -----------------------------------------------------------------------

    def add_listener(self, fn: Listener, wire_names: Collection[str] | None = None
                     ) -> ListenerHandle:
        return self._bus.add(fn, wire_names)

    @property
    def listener_count(self) -> int:
        return len(self._bus)

    # --- running -------------------------------------------------------------------------

    def start(self) -> ProjectionRunner:
        """Start the background thread: catch up, then follow the log live. Listeners see events
        appended after this call (history is for projections only)."""
        if self._thread is not None:
            return self
        self.check_log()
        self._bus.listen_from = self.store.head_position()
        self._stopping.clear()
        self.views.wait_for_rebuilds = True
        self._thread = threading.Thread(target=self._run, name="terret-projections", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping.set()
        self.views.wait_for_rebuilds = False  # a batch waiting for one elsewhere gives up
        sub = self._subscription
        if sub is not None:
            sub.stop()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        with self._progress:
            self._progress.notify_all()

    @property
    def position(self) -> int:
        return self._position

    def check_views_kept(self) -> None:
        """Fail for good (``failure``) if another process reset the views since this runner
        checked them — as its next batch would, but without waiting for an event to land."""
        if self._error is not None or self.views.rebuild_lock.holder() is not None:
            return  # a rebuild elsewhere holds the views: the batch after it checks
        if not self.views.still_at_path():
            exc = ViewsMismatch(
                f"the views file {self.views.path} was deleted or replaced while this process "
                "had it open: what it writes now no other process reads; restart it (its "
                "views are then rebuilt from the log)")
            log.error("projection runner stopped: %s", exc)
            self._fail(exc)
            return
        if not self.views.lock.acquire(blocking=False):
            return  # this runner is in a batch (or waiting for one): it checks there
        try:
            kept = self._log.kept()
        finally:
            self.views.lock.release()
        if not kept:
            exc = self._log.reset_elsewhere()
            log.error("projection runner stopped: %s", exc)
            self._fail(exc)

    @property
    def failure(self) -> BaseException | None:
        """What stopped the runner for good (the store or the views cannot be used), or None
        while it runs: a process serving turns on views that no longer follow the log must
        stop, not carry on as a live worker that serves nothing."""
        return self._error

    def _run(self) -> None:
        delay = 0.05
        while not self._stopping.is_set():
            try:
                self._follow()
                delay = 0.05
            except (StoreCorrupt, NotATerretStore) as exc:  # retrying cannot help
                log.error("projection runner stopped: %s", exc)
                self._fail(exc)
                return
            except StoreError as exc:
                log.warning("projection subscription failed (%s); resubscribing", exc)
                self._stopping.wait(delay)
                delay = min(delay * 2, 2.0)
            except sqlite3.OperationalError as exc:
                if not is_busy(exc):
                    log.error("projection runner stopped: the views file %s: %s",
                              self.views.path, exc)
                    self._fail(exc)
                    return
                # Another process holds the views file's write lock past the busy timeout (a
                # command catching the views up, suspended with Ctrl-Z): waited out, as a
                # rebuild elsewhere is — the runner stopping would stop every turn here.
                log.warning("the views file %s is locked by another process (%s); waiting "
                            "for it", self.views.path, exc)
                self._locked_out = True
                self._stopping.wait(delay)
                delay = min(delay * 2, 2.0)
            except TerretError as exc:  # the views were reset under us (ViewsMismatch)
                if self._stopping.is_set():
                    return  # stopped while waiting for a rebuild elsewhere (ViewsBusy)
                log.error("projection runner stopped: %s", exc)
                self._fail(exc)
                return
            except BaseException as exc:  # pragma: no cover - reported via wait_until
                log.exception("projection runner stopped")
                self._fail(exc)
                return

    def _fail(self, exc: BaseException) -> None:
        self._error = exc
        with self._progress:
            self._progress.notify_all()

    def _follow(self) -> None:
        self._recheck(self.store.head_position())
        with self._pause:
            generation = self._generation
            after = self._lowest_tracked()
            # Unscoped, the port's older spelling: an adapter written before ``streams`` serves.
            sub = (self.store.open_subscription(after=after) if self._scope is None else
                   self.store.open_subscription(after=after, streams=self._scope.streams()))
            self._subscription = sub
        apply = partial(self._apply, generation=generation)
        batch: list[StoredRecord] = []
        try:
            for item in sub:
                if self._stopping.is_set() or generation != self._generation:
                    break
                if isinstance(item, StoredRecord):
                    batch.append(item)
                    if len(batch) < self.batch_size and sub.buffered > 0:
                        continue
                    apply(batch, batch[-1].position)
                    batch = []
                elif isinstance(item, Checkpoint | CaughtUp):
                    if batch:
                        apply(batch, batch[-1].position)
                        batch = []
                    if item.position > self._position:
                        apply([], item.position)
        finally:
            sub.stop()
            self._subscription = None

    # --- a scoped runner ---------------------------------------------------------------------

    def scope_to(self, streams: Iterable[str] = ()) -> None:
        """From now on, follow only the streams watched (``watch``), starting with
        ``streams``: a pool worker's views hold the sessions it serves, and it receives no
        other session's events (filtered by the store, server-side on EventStoreDB). Called
        before ``start`` on views that hold nothing yet (a scoped runner's per-stream marks
        live in memory)."""
        if self._thread is not None:
            raise RuntimeError("scope_to() must be called before start()")
        self._scope = StreamScope(set(streams))

    @property
    def scoped(self) -> bool:
        return self._scope is not None

    def watch(self, stream: str) -> None:
        """Follow ``stream`` too (a scoped runner): its events not yet applied are applied
        now, from the store, before this returns — a worker that is about to own a session
        reads complete views of it — and the subscription follows it from here on."""
        scope = self._scope
        if scope is None or stream in scope.watched:
            return
        with self._pause:
            self._restart()
            history = [r for r in self.store.read_stream(stream)
                       if r.position > scope.marks.get(stream, 0)]
            if history:
                with collector_paused():
                    self._applier.apply_history(history, self.projections)
                scope.note(history[-1:])
            scope.watched.add(stream)

    def scope_head(self, stream: str | None = None) -> int:
        """A scoped runner's head: the position of the last event of the streams it watches
        (0 when none has any), or of ``stream`` alone (one read), read from the store. An
        unscoped runner's is the log's head."""
        scope = self._scope
        if scope is None:
            return self.store.head_position()
        streams = scope.streams() if stream is None else [stream]
        last = [r.position for s in streams
                for r in self.store.read_stream(s, backwards=True, limit=1)]
        return max(last, default=0)

    def follows(self, stream: str) -> bool:
        """Whether the views hold ``stream``'s events: every stream, unless the runner is
        scoped (then the ones it watches)."""
        return self._scope is None or stream in self._scope.watched

    def unwatch(self, stream: str) -> None:
        """Stop following ``stream`` (a scoped runner) and forget it: its rows leave the views
        (each projection's ``purge``), so a pool member's memory holds the sessions it serves,
        not every one it ever served, and a later ``watch`` replays the stream from its start.
        A projection whose ``purge`` fails keeps the stream's rows (a warning says so), and a
        later ``watch`` then applies only what came meanwhile."""
        scope = self._scope
        if scope is None or stream not in scope.watched:
            return
        with self._pause:
            self._restart()
            scope.watched.discard(stream)
            try:
                with collector_paused():
                    self._applier.forget(stream, self.projections)
            except Exception as exc:  # a projection's own purge: its rows stay, consistent
                log.warning("the views keep %s after this process stopped following it (a "
                            "projection's purge failed: %s)", stream, exc)
                return
            scope.marks.pop(stream, None)

    def _restart(self) -> None:
        """Under the pause lock: end the subscription; the runner's thread opens the next one
        with the scope as it is then, from the tracked position (nothing of the old one is
        applied after this: its generation is past)."""
        self._generation += 1
        sub = self._subscription
        if sub is not None:
            sub.stop()

    def catch_up(self, *, progress: Progress | None = None) -> int:
        """Process everything up to the store's head in this thread (CLI commands use this
        instead of a background runner). Returns the position reached."""
        head = self.store.head_position()
        self._recheck(head)
        operations.each_page(self.store, self._lowest_tracked(), head, self.batch_size,
                             self._apply, progress)
        self._apply([], head)
        return head

    def wait_until(self, position: int, timeout: float = 10.0, *,
                   stop: Callable[[], bool] | None = None) -> bool:
        """Block until every projection has processed ``position`` (read-your-writes);
        ``TimeoutError`` after ``timeout``. With ``stop``, the time the runner spends on a
        batch is not counted — a slow projection, one added later catching up, another
        process's rebuild its batch waits for, the views file locked by another process past
        the busy timeout (``_locked_out``) — only a runner that makes no progress times
        out; and the wait ends early, returning False, once ``stop()`` is true."""
        deadline = time.monotonic() + timeout
        seen = self._position
        with self._progress:
            while self._position < position:
                if isinstance(self._error, TerretError):
                    raise self._error  # typed: the store or the views cannot be used
                if self._error is not None:
                    raise StoreError(f"projection runner failed: {self._error}")
                if stop is not None and stop():
                    return False
                if stop is not None and (self._applying or self._locked_out
                                         or self._position > seen):
                    seen = self._position
                    # A batch in hand (a slow projection, one added later catching up, a
                    # rebuild elsewhere it waits for) is progress, not a stuck runner.
                    deadline = time.monotonic() + timeout  # counted from the batch's end
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(
                        f"projections did not reach position {position} within {timeout}s "
                        f"(at {self._position})"
                    )
                # With ``stop``, short waits: a stop, or a rebuild's end, is seen within one.
                self._progress.wait(remaining if stop is None else min(remaining, 0.5))
        return True

    def _apply(self, records: Sequence[StoredRecord], upto: int, *,
               generation: int | None = None) -> None:
        """Apply a batch to every projection, then hand its events to the listeners, then
        publish the position: whoever ``wait_until``s a position also sees what the listeners
        derived from it (caches, signals). A batch of a subscription the scope has moved past
        (``generation``) is dropped: the next one delivers it again."""
        self._applying = True
        self._locked_out = False
        try:
            with self._pause, collector_paused():
                if generation is not None and generation != self._generation:
                    return
                if self._scope is not None:
                    records = self._scope.unseen(records)
                events = self._applier.apply(records, upto, self.projections)
                if self._scope is not None:
                    self._scope.note(records)
                self._applied = max(self._applied, upto)
            self._bus.publish(events)
        finally:
            self._applying = False
        with self._progress:
            self._position = max(self._position, upto)
            self._progress.notify_all()

    def _lowest_tracked(self) -> int:
        with self.views.reading() as db:
            tracked = self.views.positions(db, [p.name for p in self.projections])
            halted = self.views.halted(db) | self._applier.superseded
        live = [position for name, position in tracked.items() if name not in halted]
        return min(live, default=max(tracked.values(), default=0))

    # --- operations ----------------------------------------------------------------------

    def projection(self, name: str) -> Projection:
        for p in self.projections:
            if p.name == name:
                return p
        raise KeyError(f"no projection named {name!r}; known: "
                       f"{', '.join(p.name for p in self.projections)} (a custom projection "
                       "is known once the module that registers it is imported: the CLI's "
                       "--extensions)")

    def _whole_log(self) -> None:
        """Rebuild, verify and skip replay the whole log: not for a scoped runner's views,
        which hold only the sessions watched (a pool member's)."""
        if self._scope is not None:
            raise RuntimeFault("a pool member's views hold only the sessions it serves: "
                               "rebuild, verify and skip run on views of the whole log")

    def _chosen(self, names: Sequence[str] | None) -> list[Projection]:
        return list(self.projections) if names is None else [self.projection(n) for n in names]

    def states(self, head: int | None = None) -> list[ProjectionState]:
        """Each projection's position, lag behind ``head`` (the store's head by default: pass
        the one ``catch_up`` returned, as events appended since by others are no lag) and
        fault."""
        self._checked()
        head = self.store.head_position() if head is None else head
        out = []
        for p in self.projections:
            position = self.views.tracked(p.name)
            out.append(ProjectionState(p.name, position, max(0, head - position),
                                       self.views.fault(p.name)))
        return out

    def other_versions(self) -> dict[str, int]:
        """The projections loaded here whose view the views file holds at another version
        (another release opened it: a rolling deploy), by the file's version: this process
        neither maintains, rebuilds nor verifies them."""
        with self.views.reading() as db:
            recorded = self.views.versions(db)
        return {p.name: recorded[p.name] for p in self.projections
                if recorded.get(p.name, p.version) != p.version}

    def unloaded(self) -> list[ProjectionState]:
        """Projections the views file keeps a position or a fault for that this runner does not
        maintain: a custom projection whose module this process has not imported (or one no
        longer used). Nothing here checks, rebuilds or skips them."""
        known = {p.name for p in self.projections}
        tracked, faults = self.views.bookkeeping()
        head = self.store.head_position()
        return [ProjectionState(name, tracked.get(name, 0),
                                max(0, head - tracked.get(name, 0)), faults.get(name))
                for name in sorted((tracked.keys() | faults.keys()) - known)]

    def check_halted(self) -> None:
        for p in self.projections:
            fault = self.views.fault(p.name)
            if fault is not None:
                raise ProjectionHalted(p.name, fault[0], fault[1])

    def skip(self, name: str, *, by: str = "operator") -> int:
        """Skip the event a halted projection stopped at. The skip is recorded in the view
        store and honoured by later rebuilds."""
        self._whole_log()
        self._checked()
        projection = self.projection(name)
        with self._pause:
            return operations.skip(self.store, self.views, self._applier, projection, by,
                                   self.replay_batch_size)

    def rebuild(self, name: str, *, progress: Progress | None = None) -> int:
        """Drop one projection's view and tracked position and replay it from position 0."""
        return self.rebuild_all([name], progress=progress)

    def rebuild_all(self, names: Sequence[str] | None = None, *,
                    progress: Progress | None = None) -> int:
        """Drop the views of the projections named (all of them by default) and replay them
        from position 0 to the store's head, in one pass over the log and one write
        transaction of the views: safe while this runner is live (it is paused meanwhile) or
        another process's (it waits for the commit); readers see the views as they were until
        then. ``ViewsBusy`` if another process is rebuilding the same views."""
        self._whole_log()
        self._checked()
        chosen = self._chosen(names)
        with self._pause:
            return operations.rebuild(self.store, self.views, self._applier, chosen,
                                      self.replay_batch_size, progress)

    def verify(self, name: str, *, progress: Progress | None = None) -> list[str]:
        """Rebuild one projection into a scratch view and list every difference from the live
        one (empty when they agree)."""
        return self.verify_all([name], progress=progress)[name]

    def verify_all(self, names: Sequence[str] | None = None, *,
                   progress: Progress | None = None) -> dict[str, list[str]]:
        """``verify`` for the projections named (all of them by default), in one pass over
        the log."""
        self._whole_log()
        self._checked()
        chosen = self._chosen(names)
        with self._pause:
            return operations.verify(self.store, self.views, chosen, self.registry,
                                     self.replay_batch_size, progress)

