"""The projection runner: one catch-up subscription per process feeding every projection in log
order, then the listeners (so a listener always reads views that include its event).

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
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from terret.domain.catalogue import EventCatalogue, catalogue
from terret.domain.codec import RecordDecoder, RecordedEvent
from terret.domain.errors import (
    CorruptRecord,
    NotATerretStore,
    ProjectionHalted,
    StoreCorrupt,
    StoreError,
    TerretError,
)
from terret.domain.store import CaughtUp, Checkpoint, EventStore, StoredRecord, Subscription
from terret.projections._collector import collector_paused
from terret.projections._logcheck import LogCheck
from terret.projections.base import PURGED, Projection, ViewStore, views_error

log = logging.getLogger("terret.projections")

Listener = Callable[[RecordedEvent], None]
Progress = Callable[[int, int], None]


@dataclass
class ListenerHandle:
    runner: ProjectionRunner
    fn: Listener
    wire_names: frozenset[str] | None

    def remove(self) -> None:
        self.runner._remove_listener(self)


@dataclass(frozen=True)
class ProjectionState:
    name: str
    position: int
    lag: int
    fault: tuple[int, str] | None


_SKIPS = """CREATE TABLE IF NOT EXISTS projection_skips (
    projection TEXT NOT NULL, position INTEGER NOT NULL, error TEXT NOT NULL, by TEXT NOT NULL,
    recorded_at REAL NOT NULL, PRIMARY KEY (projection, position));"""


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
        self.store = store
        self.views = views
        self.projections = list(projections)
        self.batch_size = batch_size
        self.registry = registry
        self._decoder = RecordDecoder(registry)
        self._listeners: list[ListenerHandle] = []
        self._listeners_lock = threading.Lock()
        self._pause = threading.RLock()
        self._progress = threading.Condition()
        self._position = 0
        self._listen_from = 0
        self._thread: threading.Thread | None = None
        self._subscription: Subscription | None = None
        self._stopping = threading.Event()
        self._error: BaseException | None = None
        self._log = LogCheck(store, views)
        self._create_tables()
        self._position = self._lowest_tracked()
        self._applied = self._position  # applied to the views (published after the listeners)

    def _create_tables(self) -> None:
        with self.views.reading() as db:
            db.executescript(_SKIPS)
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
        handle = ListenerHandle(self, fn, frozenset(wire_names) if wire_names else None)
        with self._listeners_lock:
            self._listeners.append(handle)
        return handle

    def _remove_listener(self, handle: ListenerHandle) -> None:
        with self._listeners_lock:
            if handle in self._listeners:
                self._listeners.remove(handle)

    @property
    def listener_count(self) -> int:
        with self._listeners_lock:
            return len(self._listeners)

    def _notify(self, events: Sequence[RecordedEvent]) -> None:
        with self._listeners_lock:
            listeners = list(self._listeners)
        for event in events:
            if event.position <= self._listen_from:
                continue
            for handle in listeners:
                if handle.wire_names is not None and event.wire_name not in handle.wire_names:
                    continue
                try:
                    handle.fn(event)
                except Exception:  # a listener's failure must not stop the bus
                    log.exception("listener %r failed on %s at %d", handle.fn,
                                  event.wire_name, event.position)

    # --- running -------------------------------------------------------------------------

    def start(self) -> ProjectionRunner:
        """Start the background thread: catch up, then follow the log live. Listeners see events
        appended after this call (history is for projections only)."""
        if self._thread is not None:
            return self
        self.check_log()
        self._listen_from = self.store.head_position()
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, name="terret-projections", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping.set()
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
            except TerretError as exc:  # the views were reset under us (ViewsMismatch)
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
        sub = self.store.subscribe(after=self._lowest_tracked())
        self._subscription = sub
        batch: list[StoredRecord] = []
        try:
            for item in sub:
                if self._stopping.is_set():
                    break
                if isinstance(item, StoredRecord):
                    batch.append(item)
                    if len(batch) < self.batch_size and sub.buffered > 0:
                        continue
                    self._apply(batch, batch[-1].position)
                    batch = []
                elif isinstance(item, Checkpoint | CaughtUp):
                    if batch:
                        self._apply(batch, batch[-1].position)
                        batch = []
                    if item.position > self._position:
                        self._apply([], item.position)
        finally:
            sub.stop()
            self._subscription = None

    def catch_up(self, *, progress: Progress | None = None) -> int:
        """Process everything up to the store's head in this thread (CLI commands use this
        instead of a background runner). Returns the position reached."""
        head = self.store.head_position()
        self._recheck(head)
        self._each_page(self._lowest_tracked(), head, self._apply, progress)
        self._apply([], head)
        return head

    def _each_page(self, after: int, head: int,
                   apply: Callable[[list[StoredRecord], int], None],
                   progress: Progress | None) -> None:
        """Read the log after ``after`` up to ``head`` in pages of ``batch_size`` and pass each
        to ``apply`` with the page's last position; each page is read and applied with the
        collector paused."""
        while after < head:
            with collector_paused():
                records = _upto(self.store.read_all(after=after, limit=self.batch_size), head)
                if not records:
                    return
                apply(records, records[-1].position)
            after = records[-1].position
            if progress:
                progress(after, head)

    def wait_until(self, position: int, timeout: float = 10.0) -> None:
        """Block until every projection has processed ``position`` (read-your-writes)."""
        deadline = time.monotonic() + timeout
        with self._progress:
            while self._position < position:
                if isinstance(self._error, TerretError):
                    raise self._error  # typed: the store or the views cannot be used
                if self._error is not None:
                    raise StoreError(f"projection runner failed: {self._error}")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(
                        f"projections did not reach position {position} within {timeout}s "
                        f"(at {self._position})"
                    )
                self._progress.wait(remaining)

    # --- applying ------------------------------------------------------------------------

    def _apply(self, records: Sequence[StoredRecord], upto: int,
               only: Sequence[Projection] | None = None, notify: bool = True) -> None:
        projections = self.projections if only is None else only
        with self._pause, collector_paused():
            try:
                events = self._apply_fast(records, upto, projections)
            except _ProcessFailed:
                events = self._apply_careful(records, upto, projections)
            if only is None:
                self._applied = max(self._applied, upto)
        # Listeners run before the position is published, so whoever ``wait_until``s a
        # position also sees what the listeners derived from it (caches, signals).
        if notify and only is None:
            self._notify(events)
        with self._progress:
            if only is None:
                self._position = max(self._position, upto)
            self._progress.notify_all()

    @staticmethod
    def _tracking(db: sqlite3.Connection, projections: Sequence[Projection]
                  ) -> tuple[dict[str, int], set[str]]:
        """Each projection's tracked position (0 when none), and the names of halted ones."""
        tracked = dict(db.execute("SELECT projection, position FROM tracking").fetchall())
        halted = {r[0] for r in db.execute("SELECT projection FROM projection_faults")}
        return {p.name: tracked.get(p.name, 0) for p in projections}, halted

    def _apply_fast(self, records: Sequence[StoredRecord], upto: int,
                    projections: Sequence[Projection]) -> list[RecordedEvent]:
        """One transaction for the batch, each record going only to the projections that want
        its wire name, with no per-event bookkeeping. It takes the common batch — every live
        projection either behind its first record or past its last, no skip inside it, every
        record decodable, no projection raising — and hands anything else to
        ``_apply_careful``."""
        events: list[RecordedEvent] = []
        append = events.append
        decode = self._decoder
        with self.views.transaction() as db:
            self._log.guard(db)
            tracked, halted = self._tracking(db, projections)
            live = [p for p in projections if p.name not in halted]
            if records:
                first, last = records[0].position, records[-1].position
                if any(first <= tracked[p.name] < last for p in live):
                    raise _ProcessFailed()
                # A projection already past the batch (the others replay behind a newly added
                # or upgraded one) sits it out.
                live = [p for p in live if tracked[p.name] < first]
                names = {p.name for p in live}
                if any(name in names and first <= position <= last
                       for name, position in self._skips(db)):
                    raise _ProcessFailed()
            wanting: dict[str, list[Callable[..., None]]] = {}
            try:
                for p in live:
                    p.begin()
                for record in records:
                    targets = wanting.get(record.wire_name)
                    if targets is None:
                        targets = wanting[record.wire_name] = _targets(live, record.wire_name)
                    try:
                        event = decode(record)
                    except CorruptRecord:
                        if targets:
                            raise
                        continue  # wanted by none here; listeners get decoded events only
                    append(event)
                    if targets and event.is_opaque and record.wire_name in self.registry:
                        continue  # a newer version of a known event: no projection reads it
                    for apply in targets:
                        apply(db, event)
                for p in live:
                    p.flush(db)
            except Exception as exc:  # a record or a projection failed: the careful path
                raise _ProcessFailed() from exc
            for p in projections:
                position = tracked[p.name] if p.name in halted else max(tracked[p.name], upto)
                self.views.set_tracked(db, p.name, position)
            if records:
                self.views.note_applied(db, records[-1])
        return events

    def _decode(self, record: StoredRecord) -> RecordedEvent | CorruptRecord:
        try:
            return self._decoder(record)
        except CorruptRecord as exc:
            return exc

    def _apply_careful(self, records: Sequence[StoredRecord], upto: int,
                       projections: Sequence[Projection]) -> list[RecordedEvent]:
        """The slow path after a projection raised: one savepoint per event and projection,
        so the failing projection halts at the failing event and the others carry on."""
        events: list[RecordedEvent] = []
        with self.views.transaction() as db:
            self._log.guard(db)
            tracked, halted = self._tracking(db, projections)
            skipped = self._skips(db)
            for p in projections:
                p.begin()
            for record in records:
                event = self._decode(record)
                newer = False  # a newer version of a known event: no projection reads it
                if isinstance(event, RecordedEvent):
                    events.append(event)
                    newer = event.is_opaque and record.wire_name in self.registry
                for p in projections:
                    if p.name in halted or record.position <= tracked[p.name]:
                        continue
                    if (not newer and p.wants(record.wire_name)
                            and (p.name, record.position) not in skipped):
                        error: str | None = str(event) if isinstance(event, CorruptRecord) else None
                        if error is None:
                            assert isinstance(event, RecordedEvent)
                            db.execute("SAVEPOINT event")
                            try:
                                p.apply(db, event)
                                p.flush(db)
                                db.execute("RELEASE event")
                            except Exception as exc:
                                if _not_the_events_fault(db, exc):
                                    raise  # a full disk, a damaged file: nothing to halt on
                                db.execute("ROLLBACK TO event")
                                db.execute("RELEASE event")
                                p.begin()
                                error = f"{type(exc).__name__}: {exc}"
                        if error is not None:
                            self.views.record_fault(db, p.name, record.position, error)
                            halted.add(p.name)
                            log.error("projection %s halted at %d: %s", p.name,
                                      record.position, error)
                            continue
                    tracked[p.name] = record.position
            for p in projections:
                if p.name not in halted and upto > tracked[p.name]:
                    tracked[p.name] = upto
                self.views.set_tracked(db, p.name, tracked[p.name])
            if records:
                self.views.note_applied(db, records[-1])
        return events

    @staticmethod
    def _skips(db: sqlite3.Connection) -> set[tuple[str, int]]:
        rows = db.execute("SELECT projection, position FROM projection_skips")
        return {(r[0], r[1]) for r in rows}

    def _lowest_tracked(self) -> int:
        with self.views.reading() as db:
            tracked, halted = self._tracking(db, self.projections)
        live = [position for name, position in tracked.items() if name not in halted]
        return min(live, default=max(tracked.values(), default=0))

    # --- operations ----------------------------------------------------------------------

    def projection(self, name: str) -> Projection:
        for p in self.projections:
            if p.name == name:
                return p
        raise KeyError(f"no projection named {name!r}; known: "
                       f"{', '.join(p.name for p in self.projections)}")

    def states(self) -> list[ProjectionState]:
        self._checked()
        head = self.store.head_position()
        out = []
        for p in self.projections:
            position = self.views.tracked(p.name)
            out.append(ProjectionState(p.name, position, max(0, head - position),
                                       self.views.fault(p.name)))
        return out

    def check_halted(self) -> None:
        for p in self.projections:
            fault = self.views.fault(p.name)
            if fault is not None:
                raise ProjectionHalted(p.name, fault[0], fault[1])

    def skip(self, name: str, *, by: str = "operator") -> int:
        """Skip the event a halted projection stopped at. The skip is recorded in the view
        store and honoured by later rebuilds."""
        self._checked()
        projection = self.projection(name)
        with self._pause:
            with self.views.transaction() as db:
                row = db.execute(
                    "SELECT position, error FROM projection_faults WHERE projection = ?", (name,)
                ).fetchone()
                if row is None:
                    raise KeyError(f"projection {name!r} is not halted")
                db.execute("INSERT OR REPLACE INTO projection_skips VALUES (?, ?, ?, ?, ?)",
                           (name, row[0], row[1], by, time.time()))
                db.execute("DELETE FROM projection_faults WHERE projection = ?", (name,))
            log.warning("projection %s: event at %d skipped by %s", name, row[0], by)
            # The subscription has moved past the events after the skipped one and will not
            # deliver them again: replay them into the resumed projection, up to where the
            # others are, so that none is lost.
            self._replay_into(self, [projection], None, upto=self._applied,
                              after=self.views.tracked(name))
        return int(row[0])

    def rebuild(self, name: str, *, progress: Progress | None = None) -> int:
        """Drop one projection's view and tracked position and replay it from position 0."""
        self._checked()
        projection = self.projection(name)
        with self._pause:
            with self.views.reading() as db:
                # executescript commits on its own, so this runs outside a transaction; the
                # pause lock keeps the runner from applying anything meanwhile.
                db.execute("DELETE FROM tracking WHERE projection = ?", (name,))
                db.execute("DELETE FROM projection_faults WHERE projection = ?", (name,))
                projection.drop(db)
                projection.create(db)
            return self._replay_into(self, [projection], progress)

    def _replay_into(self, target: ProjectionRunner, projections: Sequence[Projection],
                     progress: Progress | None, upto: int | None = None, after: int = 0) -> int:
        head = self.store.head_position() if upto is None else upto
        self._each_page(after, head, lambda records, last: target._apply(
            records, last, only=projections, notify=False), progress)
        target._apply([], head, only=projections, notify=False)
        return head

    def verify(self, name: str, *, progress: Progress | None = None) -> list[str]:
        """Rebuild one projection into a scratch view and list every difference from the live
        one (empty when they agree)."""
        self._checked()
        live = self.projection(name)
        with self._pause:
            upto = self.views.tracked(name)
            scratch_views = ViewStore(":memory:")
            fresh = type(live)()
            scratch = ProjectionRunner(self.store, scratch_views, [fresh], registry=self.registry)
            with self.views.reading() as db:
                skips = db.execute("SELECT * FROM projection_skips WHERE projection = ?",
                                   (name,)).fetchall()
            with scratch_views.transaction() as sdb:
                sdb.executemany("INSERT INTO projection_skips VALUES (?, ?, ?, ?, ?)", skips)
            self._replay_into(scratch, [fresh], progress, upto=upto)
            with self.views.reading() as db:
                expected = live.dump(db)
            with scratch_views.reading() as sdb:
                actual = fresh.dump(sdb)
            scratch_views.close()
        return _differences(name, expected, actual)


def _differences(name: str, live: dict[str, list[tuple[object, ...]]],
                 rebuilt: dict[str, list[tuple[object, ...]]]) -> list[str]:
    out = []
    for table in sorted(set(live) | set(rebuilt)):
        a, b = set(live.get(table, [])), set(rebuilt.get(table, []))
        for row in sorted(a - b, key=repr)[:20]:
            out.append(f"{name}.{table}: live has {row!r}, rebuild does not")
        for row in sorted(b - a, key=repr)[:20]:
            out.append(f"{name}.{table}: rebuild has {row!r}, live does not")
    return out


def _upto(records: list[StoredRecord], head: int) -> list[StoredRecord]:
    """The records at or before ``head`` (a page read after it was taken may run past it)."""
    if not records or records[-1].position <= head:
        return records
    return [r for r in records if r.position <= head]


class _ProcessFailed(Exception):
    pass


def _not_the_events_fault(db: sqlite3.Connection, exc: Exception) -> bool:
    """Whether a failure while applying an event is the view file's (SQLite rolled the batch
    back, the disk is full, the file is damaged) rather than the event's or projection's."""
    return not db.in_transaction or (
        isinstance(exc, sqlite3.Error) and views_error(exc, "") is not None)


def _targets(projections: Sequence[Projection], wire_name: str) -> list[Callable[..., None]]:
    """What to call for each projection that wants an event of this wire name: its
    ``process`` straight away when ``Projection.apply`` would only forward to it."""
    return [
        p.process if wire_name != PURGED and type(p).apply is Projection.apply else p.apply
        for p in projections if p.wants(wire_name)
    ]



