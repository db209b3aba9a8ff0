"""What an operator does to projections: rebuild them from position 0, verify them against a
replay into a scratch view, skip the event a halted one stopped at. Each reads the log once for
all the projections it is given (``terret projections rebuild`` replays all eight in one
pass), in pages of ``batch_size``, read and applied with the collector paused."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from terret.domain.catalogue import EventCatalogue
from terret.domain.errors import ViewsMismatch
from terret.domain.store import EventStore, StoredRecord
from terret.projections._applier import BatchApplier
from terret.projections._collector import collector_paused
from terret.projections.base import Projection, ViewStore

if TYPE_CHECKING:
    from terret.domain.codec import RecordedEvent

log = logging.getLogger("terret.projections")

Progress = Callable[[int, int], None]
Apply = Callable[[list[StoredRecord], int], object]


def each_page(store: EventStore, after: int, head: int, batch_size: int, apply: Apply,
              progress: Progress | None = None) -> None:
    """Read the log after ``after`` up to ``head`` in pages of ``batch_size`` and pass each to
    ``apply`` with the page's last position; each page is read and applied with the collector
    paused. ``progress(position, head)`` after each page."""
    while after < head:
        with collector_paused():
            records = _upto(store.read_all(after=after, limit=batch_size), head)
            if not records:
                return
            apply(records, records[-1].position)
        after = records[-1].position
        if progress:
            progress(after, head)


def replay(store: EventStore, applier: BatchApplier, projections: Sequence[Projection],
           batch_size: int, *, after: int = 0, upto: int | None = None,
           progress: Progress | None = None) -> int:
    """Replay the log after ``after`` up to ``upto`` (the store's head) into ``projections``
    through ``applier``, without listeners; returns the position reached."""
    head = store.head_position() if upto is None else upto

    def apply(records: list[StoredRecord], last: int) -> list[RecordedEvent]:
        return applier.apply(records, last, projections, keep=False)

    each_page(store, after, head, batch_size, apply, progress)
    with collector_paused():
        applier.apply([], head, projections)
    return head


def rebuild(store: EventStore, views: ViewStore, applier: BatchApplier,
            projections: Sequence[Projection], batch_size: int,
            progress: Progress | None = None) -> int:
    """Empty the projections' tables, tracked positions and faults, and replay them from
    position 0 to the store's head in one pass (recorded skips are honoured) — all in one
    write transaction of the views (``ViewStore.exclusive``): a runner in another process
    applies nothing between two of its pages (it would move the tracked positions past the
    pages still to come), and every reader sees the views as they were until it commits."""
    with views.exclusive() as db:
        refuse_other_versions(views, projections, "rebuild")
        for projection in projections:
            views.forget(db, projection)
        return replay(store, applier, projections, batch_size, progress=progress)


def refuse_other_versions(views: ViewStore, projections: Sequence[Projection],
                          what: str) -> None:
    """``ViewsMismatch`` for a projection whose view another release wrote (another version):
    this process would empty it and replay nothing into it (it leaves such a view alone), or
    compare it with a replay of another meaning."""
    with views.reading() as db:
        recorded = views.versions(db)
    for p in projections:
        if recorded.get(p.name, p.version) != p.version:
            raise ViewsMismatch(
                f"projection {p.name}: the views file holds version {recorded[p.name]} of it, "
                f"this process has version {p.version}: {what} it from a process of that "
                "release (or restart this one on it)")


def skip(store: EventStore, views: ViewStore, applier: BatchApplier, projection: Projection,
         by: str, batch_size: int) -> int:
    """Record the skip of the event ``projection`` halted at and replay what follows it into
    the projection, up to the store's head, so that none is lost — in one write transaction
    of the views, as ``rebuild``: a runner elsewhere would otherwise apply its next batch to
    the resumed projection first, past the events in between."""
    with views.exclusive():
        # Another release's view: this process neither maintains nor checks it, and its
        # replay after the skip would be refused — the skip alone would pass the event over.
        refuse_other_versions(views, [projection], "skip an event of")
        position, _ = views.skip(projection.name, by)
        log.warning("projection %s: event at %d skipped by %s", projection.name, position, by)
        # The runners have moved past the events after the skipped one and will not deliver
        # them again: replay them into the resumed projection.
        replay(store, applier, [projection], batch_size, after=views.tracked(projection.name))
    return position


REPLAY_HALTS = "the replay halts at"
"""How ``verify`` says that its own replay halted where the live view did not."""


def verify(store: EventStore, views: ViewStore, projections: Sequence[Projection],
           registry: EventCatalogue, batch_size: int, progress: Progress | None = None
           ) -> dict[str, list[str]]:
    """Replay fresh copies of ``projections`` into a scratch view, each up to its live
    tracked position, in one pass over the log; every difference from the live views, per
    projection (empty lists when they agree). The live views are read once, positions and
    rows in one snapshot: a runner elsewhere may move them on meanwhile."""
    refuse_other_versions(views, projections, "verify")
    stops, live = views.snapshot(projections)
    scratch = ViewStore(":memory:")
    try:
        fresh = {p.name: type(p)() for p in projections}
        for copy in fresh.values():
            scratch.ensure(copy)
        scratch.add_skips([row for p in projections for row in views.skips_of(p.name)])
        applier = BatchApplier(scratch, registry, lambda db: None, quiet=True)
        report: dict[str, list[str]] = {}

        live_faults = views.bookkeeping()[1]

        def compare(name: str) -> None:
            report[name] = differences(name, live[name], scratch.dump(fresh[name]))
            halt = scratch.bookkeeping()[1].get(name)
            if halt is not None and live_faults.get(name, (None,))[0] != halt[0]:
                # The live view went past an event the replay cannot process (a process that
                # reads it otherwise built it): said first, as what the differences follow from.
                report[name].insert(0, f"{REPLAY_HALTS} {halt[0]}: {halt[1]}")

        _replay_to_each(store, applier, fresh, stops, batch_size, compare, progress)
        return {p.name: report[p.name] for p in projections}
    finally:
        scratch.close()


def _replay_to_each(store: EventStore, applier: BatchApplier, fresh: dict[str, Projection],
                    stops: dict[str, int], batch_size: int, compare: Callable[[str], None],
                    progress: Progress | None) -> None:
    """One pass: replay to each projection's own position (``stops``) in turn, comparing the
    ones that stop there (``compare``) before the others go on."""
    head = max(stops.values(), default=0)

    def overall(position: int, _: int) -> None:
        if progress is not None:
            progress(position, head)

    reached = 0
    for stop in sorted(set(stops.values())):
        going = [fresh[name] for name, at in stops.items() if at >= stop]
        replay(store, applier, going, batch_size, after=reached, upto=stop, progress=overall)
        reached = stop
        for name in [n for n, at in stops.items() if at == stop]:
            compare(name)


def differences(name: str, live: dict[str, list[tuple[object, ...]]],
                rebuilt: dict[str, list[tuple[object, ...]]]) -> list[str]:
    out = []
    for table in sorted(set(live) | set(rebuilt)):
        if live.get(table, []) == rebuilt.get(table, []):
            continue  # the same rows in the same order (the usual case): nothing to list
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
