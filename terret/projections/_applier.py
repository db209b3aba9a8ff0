"""The batch applier: a page of the log into the projections, in one transaction of the view
store that also records each projection's tracked position (only ever forward) and the last
event applied.

A batch first goes through all at once: each record to the projections that want its wire
name, no bookkeeping per event. That is an optimisation of the one rule, event by event: a
projection processes each event after its tracked position, unless the event is one an operator
skipped or a newer version of a known event (no projection reads it); an event it cannot
process (it does not decode, or ``process`` raises) halts that projection there, with the fault
recorded, while the others carry on. All at once gives the same result whenever no projection
is inside the batch, none has a skip in it, and nothing fails; otherwise — known before the
batch starts, or when something raises, after rolling the transaction back and beginning it
again — the batch goes event by event, each event and projection in a savepoint. A failure
that is the view file's (a full disk, a damaged file) is no event's fault: it halts nothing and
ends the batch.
"""

from __future__ import annotations

import logging
import sqlite3
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from terret.domain.catalogue import EventCatalogue, OpaquePayload
from terret.domain.codec import RecordDecoder
from terret.domain.errors import CorruptRecord
from terret.domain.store import StoredRecord
from terret.projections.base import (
    PURGED,
    Projection,
    Target,
    TypedProjection,
    ViewStore,
    views_error,
)

if TYPE_CHECKING:
    from terret.domain.codec import RecordedEvent

log = logging.getLogger("terret.projections")

_NOWHERE: deque[Any] = deque(maxlen=0)
"""Where an event not kept goes: a deque that holds none drops it (in C, for the hot loop),
and the event is freed once applied."""

Guard = Callable[[sqlite3.Connection], None]
"""Called first in each batch's transaction; raises to refuse the batch (``LogCheck.guard``)."""


@dataclass
class _Batch:
    """What a batch's transaction read before it applies anything."""

    tracked: dict[str, int]
    halted: set[str]
    skips: set[tuple[str, int]]

    def __post_init__(self) -> None:
        self.before = dict(self.tracked)


class BatchApplier:
    def __init__(self, views: ViewStore, registry: EventCatalogue, guard: Guard, *,
                 quiet: bool = False) -> None:
        self.views = views
        self.registry = registry
        self.quiet = quiet
        """A scratch replay's (``verify``): its halts are in its report, not the log."""
        self._decode = RecordDecoder(registry)
        self._guard = guard
        self._warned: set[str] = set()

    def apply(self, records: Sequence[StoredRecord], upto: int,
              projections: Sequence[Projection], *, keep: bool = True) -> list[RecordedEvent]:
        """Apply ``records`` (in log order, none after ``upto``) and move every live
        projection's tracked position to ``upto``; the events decoded, for the listeners
        (none with ``keep=False``: a replay has no listeners, and holding a page of decoded
        events only to drop them cost a twentieth of a rebuild)."""
        if not records and not self._moves(upto, projections):
            return []  # nothing to apply, no position to move: no transaction
        with self.views.transaction() as db:
            batch = self._begin(db, projections)
            events = None
            live = self._all_at_once_takes(records, projections, batch)
            if live is not None:
                events = self._all_at_once(db, records, live, keep)
                if events is None:  # undone: start the transaction again, event by event
                    batch = self._begin(db, projections)
            if events is None:
                events = self._event_by_event(db, records, projections, batch, keep)
            for p in projections:
                if p.name not in batch.halted:
                    batch.tracked[p.name] = max(batch.tracked[p.name], upto)
            self._track(db, projections, batch, records)
        return events

    def apply_history(self, records: Sequence[StoredRecord], projections: Sequence[Projection]
                      ) -> None:
        """Apply ``records`` — the history of a stream a scoped runner starts to watch, from
        before the projections' tracked positions — to every live projection, moving no
        tracked position (the runner's per-stream marks say what each stream has had). The
        rules are ``apply``'s: skips honoured, a failing event halts its projection."""
        if not records:
            return
        with self.views.transaction() as db:
            batch = self._begin(db, projections, history=True)
            live = self._all_at_once_takes(records, projections, batch)
            if live is None or self._all_at_once(db, records, live, False) is None:
                if live is not None:  # undone: start again, event by event
                    batch = self._begin(db, projections, history=True)
                self._event_by_event(db, records, projections, batch, False)

    def forget(self, stream: str, projections: Sequence[Projection]) -> None:
        """Delete ``stream``'s rows from every live projection, in one transaction, as its
        purge does (``Projection.purge``): a scoped runner that stops following a session keeps
        no copy of it, which would grow with every session it ever served and go stale."""
        with self.views.transaction() as db:
            halted = self.views.halted(db) | self._superseded(db, projections)
            for p in projections:
                if p.name not in halted:
                    p.purge(db, stream)

    def _moves(self, upto: int, projections: Sequence[Projection]) -> bool:
        with self.views.reading() as db:
            tracked = self.views.positions(db, [p.name for p in projections])
            halted = self.views.halted(db) | self._superseded(db, projections)
        return any(tracked[p.name] < upto for p in projections if p.name not in halted)

    def _begin(self, db: sqlite3.Connection, projections: Sequence[Projection], *,
               history: bool = False) -> _Batch:
        """Inside the batch's transaction, before anything is applied: the guard, and what the
        views say now (another process sharing the file may have moved them). A history batch
        is behind every tracked position by design: it counts as before all of them."""
        self._guard(db)
        names = [p.name for p in projections]
        tracked = dict.fromkeys(names, -1) if history else self.views.positions(db, names)
        halted = self.views.halted(db) | self._superseded(db, projections)
        return _Batch(tracked, halted, self.views.skips(db))

    def _superseded(self, db: sqlite3.Connection, projections: Sequence[Projection]
                    ) -> set[str]:
        """The projections whose view another process sharing the file has re-versioned since
        this one opened it (a rolling deploy: the other release's ``ensure`` dropped and
        recreated it). This process leaves them alone — rows of its version in tables of
        another would be neither's view — and says so once; the process of the recorded
        version maintains them."""
        recorded = self.views.versions(db)
        # For good, once seen: when a process of this version re-ensures the view later, it
        # replays it from 0 itself — a batch from here would move its position past history.
        superseded = self._warned | {p.name for p in projections
                                     if recorded.get(p.name, p.version) != p.version}
        for p in projections:
            if p.name in superseded and p.name not in self._warned:
                self._warned.add(p.name)
                log.warning("projection %s: the views file holds version %d of it, this "
                            "process has version %d (another release opened the file): this "
                            "process no longer maintains it; restart it on the views' release",
                            p.name, recorded[p.name], p.version)
        return superseded

    @property
    def superseded(self) -> frozenset[str]:
        """The projections this process has stopped maintaining (``_superseded``)."""
        return frozenset(self._warned)

    def _track(self, db: sqlite3.Connection, projections: Sequence[Projection], batch: _Batch,
               records: Sequence[StoredRecord]) -> None:
        for p in projections:
            if batch.tracked[p.name] > batch.before[p.name]:
                self.views.track(db, p.name, batch.tracked[p.name])
        if records:
            self.views.note_applied(db, records[-1])

    # --- all at once ----------------------------------------------------------------------

    @staticmethod
    def _all_at_once_takes(records: Sequence[StoredRecord], projections: Sequence[Projection],
                           batch: _Batch) -> list[Projection] | None:
        """The projections a batch goes to all at once, or None when it cannot: a live
        projection is inside the batch, or has a skip in it. (Those already past the batch —
        the others replay behind a projection added or upgraded — sit it out.)"""
        live = [p for p in projections if p.name not in batch.halted]
        if not records:
            return live
        first, last = records[0].position, records[-1].position
        if any(first <= batch.tracked[p.name] < last for p in live):
            return None
        live = [p for p in live if batch.tracked[p.name] < first]
        names = {p.name for p in live}
        if any(name in names and first <= position <= last for name, position in batch.skips):
            return None
        return live

    def _all_at_once(self, db: sqlite3.Connection, records: Sequence[StoredRecord],
                     live: Sequence[Projection], keep: bool
                     ) -> list[RecordedEvent] | None:
        """The events, or None when something raised: what the batch wrote is then undone
        (the caller goes on in the same transaction, event by event)."""
        try:
            for p in live:
                p.begin()
            events = self._each_record(db, records, live, keep)
            for p in live:
                p.flush(db)
        except (Exception, SystemExit) as exc:  # a record or a projection failed (a
            # projection's sys.exit is its bug too: it halts, never ends the process)
            if _not_the_events_fault(db, exc):
                raise  # a full disk, a damaged file: nothing to halt on
            self.views.undo(db)
            return None
        return events

    def _each_record(self, db: sqlite3.Connection, records: Sequence[StoredRecord],
                     live: Sequence[Projection], keep: bool) -> list[RecordedEvent]:
        """Each record to what each projection that wants it calls for it (``_targets``, once
        per wire name). The rebuild's hot loop, kept in one function on purpose: a call per
        event costs a tenth of a rebuild."""
        events: list[RecordedEvent] = []
        append = events.append if keep else _NOWHERE.append
        decode = self._decode
        registry = self.registry
        wanting: dict[str, list[Target]] = {}
        newer: dict[str, list[Target]] = {}
        for record in records:
            targets = wanting.get(record.wire_name)
            if targets is None:
                targets = wanting[record.wire_name] = _targets(live, record.wire_name,
                                                               registry)
            try:
                event = decode(record)
            except CorruptRecord:
                if not targets:
                    continue  # wanted by none here; listeners get decoded events only
                counting = _unreadable_targets(live, record.wire_name, registry)
                if counting is None:
                    raise  # one reads its fields: event by event, it halts that one
                event = RecordDecoder.unreadable(record)
                for target in counting:
                    target(db, event, event.payload)
                continue
            append(event)
            payload = event.payload
            if targets and isinstance(payload, OpaquePayload) and record.wire_name in registry:
                # A newer version of a known event: only a handler of opaque payloads reads it.
                targets = newer.get(record.wire_name)
                if targets is None:
                    targets = newer[record.wire_name] = _opaque_targets(live, record.wire_name)
            for target in targets:
                target(db, event, payload)
        return events

    # --- event by event -------------------------------------------------------------------

    def _event_by_event(self, db: sqlite3.Connection, records: Sequence[StoredRecord],
                        projections: Sequence[Projection], batch: _Batch, keep: bool
                        ) -> list[RecordedEvent]:
        """One savepoint per event and projection, so that a failing projection halts at the
        failing event and the others carry on."""
        events: list[RecordedEvent] = []
        for p in projections:
            p.begin()
        for record in records:
            try:
                event: RecordedEvent | CorruptRecord = self._decode(record)
            except CorruptRecord as exc:
                event = exc
            newer = False  # a newer version of a known event: see _opaque_targets
            if not isinstance(event, CorruptRecord):
                if keep:
                    events.append(event)
                newer = event.is_opaque and record.wire_name in self.registry
            for p in projections:
                if p.name not in batch.halted and record.position > batch.tracked[p.name]:
                    self._one_into(db, p, record, event, newer, batch)
        return events

    def _one_into(self, db: sqlite3.Connection, p: Projection, record: StoredRecord,
                  event: RecordedEvent | CorruptRecord, newer: bool, batch: _Batch) -> None:
        """The event at ``record`` into ``p`` (live and behind it), if it wants it; the
        projection halts there if it fails, else moves past it. An event skipped before is
        passed over only while it still fails: once an upcaster reads it or the projection's
        fix processes it, a replay applies it and the skip is dropped (else a fixed reader
        would never put it back in this views file)."""
        if (not newer or _opaque_handler(p) is not None) and p.wants(record.wire_name):
            skipped = (p.name, record.position) in batch.skips
            if isinstance(event, CorruptRecord) and \
                    _reads_no_fields(p, record.wire_name, self.registry) is not None:
                event = RecordDecoder.unreadable(record)  # counted, as one it cannot read
            error = self._apply_one(db, p, event)
            if error is None and skipped:
                self.views.unskip(db, p.name, record.position)
                batch.skips.discard((p.name, record.position))
                log.info("projection %s: the event at %d it skipped now reads; applied, and "
                         "the skip dropped", p.name, record.position)
            elif error is not None and not skipped:
                self.views.record_fault(db, p.name, record.position, error)
                batch.halted.add(p.name)
                if not self.quiet:
                    log.error("projection %s halted at %d: %s", p.name, record.position, error)
                return
        batch.tracked[p.name] = record.position

    @staticmethod
    def _apply_one(db: sqlite3.Connection, p: Projection, event: RecordedEvent | CorruptRecord
                   ) -> str | None:
        """Apply one event to one projection in a savepoint; the error that halts it, if
        any."""
        if isinstance(event, CorruptRecord):
            return str(event)
        db.execute("SAVEPOINT event")
        try:
            p.apply(db, event)
            p.flush(db)
        except (Exception, SystemExit) as exc:
            if _not_the_events_fault(db, exc):
                raise  # a full disk, a damaged file: nothing to halt on
            db.execute("ROLLBACK TO event")
            db.execute("RELEASE event")
            p.begin()
            return f"{type(exc).__name__}: {exc}"
        db.execute("RELEASE event")
        return None


def _not_the_events_fault(db: sqlite3.Connection, exc: BaseException) -> bool:
    """Whether a failure while applying an event is the view file's (SQLite rolled the batch
    back, the disk is full, the file is damaged) rather than the event's or projection's."""
    return not db.in_transaction or (
        isinstance(exc, sqlite3.Error) and views_error(exc, "") is not None)


def _targets(projections: Sequence[Projection], wire_name: str, registry: EventCatalogue
             ) -> list[Target]:
    """What to call for each projection that wants an event of this wire name: a typed
    projection's handler of the wire name's class straight away (the one its ``process``
    would pick: a decoded event of a known wire name is of its class, or opaque and passed
    over); ``process`` when ``Projection.apply`` would only forward to it; else ``apply``."""
    cls = registry.payload_class(wire_name)
    out: list[Target] = []
    for p in projections:
        if not p.wants(wire_name):
            continue
        if wire_name in PURGED or type(p).apply is not Projection.apply:
            out.append(_ignoring_payload(p.apply))
        elif cls is not None and isinstance(p, TypedProjection) \
                and type(p).process is TypedProjection.process:
            out.append(p.handler_for(cls) or _nothing)  # wanted, so a corrupt one halts it
        else:
            out.append(_ignoring_payload(p.process))
    return out


def _opaque_handler(p: Projection) -> Target | None:
    """A typed projection's handler of events this process cannot read (``OpaquePayload``)."""
    return p.handler_for(OpaquePayload) if isinstance(p, TypedProjection) else None


def _opaque_targets(projections: Sequence[Projection], wire_name: str) -> list[Target]:
    """What reads a newer version of a known event: only a typed projection's handler of
    opaque payloads (the session index counts it); the others would read fields it may not
    have, so they pass over it."""
    return [h for p in projections if p.wants(wire_name)
            and (h := _opaque_handler(p)) is not None]


def _reads_no_fields(p: Projection, wire_name: str, registry: EventCatalogue
                     ) -> Target | None:
    """``p``'s handler of events it cannot read, when that is also what it calls for this wire
    name (the session index counts every event, reading the fields of three): an event of the
    wire name that does not decode here (an extension's upcaster fails, its data is damaged)
    is then counted as an unreadable one instead of halting ``p``. None when ``p`` reads the
    event's fields: it halts there, as the rule is."""
    opaque = _opaque_handler(p)
    if opaque is None or not isinstance(p, TypedProjection) or wire_name in PURGED \
            or type(p).apply is not Projection.apply \
            or type(p).process is not TypedProjection.process:
        return None
    cls = registry.payload_class(wire_name)
    own = opaque if cls is None else p.handler_for(cls)
    same = own is not None and getattr(own, "__func__", own) is getattr(opaque, "__func__",
                                                                       opaque)
    return opaque if same else None


def _unreadable_targets(projections: Sequence[Projection], wire_name: str,
                        registry: EventCatalogue) -> list[Target] | None:
    """What to call for a record of ``wire_name`` that does not decode, when every projection
    that wants it reads no fields of it (``_reads_no_fields``); else None."""
    out = []
    for p in projections:
        if p.wants(wire_name):
            target = _reads_no_fields(p, wire_name, registry)
            if target is None:
                return None
            out.append(target)
    return out


def _nothing(db: sqlite3.Connection, event: RecordedEvent, payload: Any) -> None:
    """What a typed projection does with an event it handles but has no handler for."""


def _ignoring_payload(fn: Callable[[sqlite3.Connection, RecordedEvent], None]) -> Target:
    def call(db: sqlite3.Connection, event: RecordedEvent, payload: Any) -> None:
        fn(db, event)

    return call
