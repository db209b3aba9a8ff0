"""Which log a view file was built from, checked against the store (``ProjectionRunner``).

The view store records the store's id and the last event the views applied (``LogMark``). Views
do not belong to the store's log when they were built from another store (its ``store_id``
differs), when the last event they applied lies past the store's head, or when the store holds
another event at that event's stream and seq (a store restored from an older copy, even one
written to since). Such views are emptied and replayed from position 0, with a warning.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Sequence

from terret.domain.errors import ViewsMismatch
from terret.domain.store import EventStore
from terret.projections.base import LogMark, Projection, ViewStore

log = logging.getLogger("terret.projections")


def mismatch(store: EventStore, mark: LogMark | None, tracked: int, store_id: str | None,
             head: int) -> str | None:
    """Why the views do not belong to this store's log, or None when they may. ``mark`` and
    ``tracked`` (the highest tracked position) must be read *before* ``head``: another
    process sharing the views may apply an event the store received after ``head`` was read."""
    if mark is None:  # written before views recorded their log: positions only
        if tracked > head:
            return f"they are at position {tracked}, past the log's head {head}"
        return None
    if mark.store_id is not None and store_id is not None and mark.store_id != store_id:
        return f"they were built from store {mark.store_id}; this is store {store_id}"
    if mark.position is None:
        return None  # nothing applied yet
    if mark.position > head:
        return (f"the last event they applied, at position {mark.position}, is past the log's "
                f"head {head}: was the store restored from an older copy?")
    return _last_applied_missing(store, mark)


def _last_applied_missing(store: EventStore, mark: LogMark) -> str | None:
    """Why the log does not hold the last event the views applied at its stream and seq, or
    None when it does (or its stream was purged or expired, or the mark does not say)."""
    if mark.stream is None or mark.seq is None:
        return None
    found = store.read_stream(mark.stream, from_seq=mark.seq, limit=1)
    if found and found[0].seq == mark.seq:
        if found[0].event_id != mark.event_id or found[0].position != mark.position:
            return (f"the log holds another event at {mark.stream}#{mark.seq} than the one "
                    "they applied")
    elif not found and 0 < store.stream_version(mark.stream) < mark.seq:
        return f"the log's {mark.stream} ends before #{mark.seq}, which they applied"
    return None


class LogCheck:
    """One runner's check of its views against its store. ``generation`` is the views'
    generation the last check accepted (None before the first check)."""

    def __init__(self, store: EventStore, views: ViewStore,
                 projections: Sequence[Projection] = ()) -> None:
        self.store = store
        self.views = views
        self.projections = [p for p in projections if type(p).create is Projection.create]
        """Whose tables a reset creates again in its own transaction (``ViewStore.reset``):
        those created from their ``schema``. A projection with a ``create`` of its own (which
        may commit, as ``executescript`` does) has them created after, by the runner."""
        self.generation: str | None = None

    def check(self) -> bool:
        """Accept the views (False), or empty them (True: the caller re-creates its tables
        and replays from position 0)."""
        store_id = self.store.store_id()
        for _ in range(5):
            mark = self.views.log_mark()
            tracked = self.views.max_tracked()
            head = self.store.head_position()  # after the views: see ``mismatch``
            reason = mismatch(self.store, mark, tracked, store_id, head)
            if reason is None:
                self.generation = self.views.adopt(store_id, tracked or None)
                return False
            generation = self.views.reset(store_id, mark.generation if mark else None,
                                          self.projections)
            if generation is None:
                continue  # another process reset or marked the views meanwhile: look again
            log.warning("the views in %s were not built from the log of %s (%s); rebuilding "
                        "them from position 0", self.views.path, self.store.describe(), reason)
            self.generation = generation
            return True
        raise ViewsMismatch(f"the views in {self.views.path} keep changing; not checked")

    def needed(self, head: int) -> bool:
        """Whether a runner that checked already must check again: never checked, another
        process reset the views, or the log seems behind them (one read of the views; the
        full check decides)."""
        if self.generation is None:
            return True
        mark = self.views.log_mark()
        return mark is None or mark.generation != self.generation or (
            mark.position is not None and mark.position > head)

    def guard(self, db: sqlite3.Connection) -> None:
        """Inside a batch's transaction: refuse to write views another process reset."""
        if self.generation is not None and self.views.generation_in(db) != self.generation:
            raise self.reset_elsewhere()

    def reset_elsewhere(self) -> ViewsMismatch:
        return ViewsMismatch(
            f"the views in {self.views.path} were reset by another process (built from "
            "another store, or from a restored copy of this one); this process stops using "
            "them: restart it")

    def kept(self) -> bool:
        """Whether the views are still the ones this runner checked (one read, outside any
        batch): a quiet store brings no batch to find out at."""
        if self.generation is None:
            return True
        mark = self.views.log_mark()
        return mark is None or mark.generation == self.generation
