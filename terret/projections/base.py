"""Projections: a projection owns some tables in the view store (``ViewStore``, in
``terret.projections._view_store``), handles some wire names, and processes one event at a time
inside a transaction the runner opens; the runner records the projection's tracked position in
the same transaction.
"""

from __future__ import annotations

import sqlite3
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from collections.abc import Set as AbstractSet
from types import MethodType, ModuleType
from typing import TYPE_CHECKING, Any, ClassVar, cast
from uuid import UUID

from terret._sqlite_files import sql_statements
from terret.domain.store import SESSION_PREFIX
from terret.projections._typed import Dispatch, Handler, marked
from terret.projections._view_store import (
    BUSY_TIMEOUT_MS,
    LogMark,
    ViewStore,
    refuse_foreign_views,
    views_error,
)

if TYPE_CHECKING:  # importing the codec loads every payload class
    from terret.domain.codec import RecordedEvent

__all__ = ["BUSY_TIMEOUT_MS", "PURGED", "LiveWireNames", "LogMark", "Projection",
           "TypedProjection", "ViewStore", "WireNames", "refuse_foreign_views", "views_error"]

class LiveWireNames(AbstractSet[str]):
    """Wire names read from ``names()`` each time they are asked — a set that may grow, as the
    catalogue does when an extension registers — with the import it needs done on first use
    (``LiveWireNames(lambda: catalogue.wire_names())``)."""

    def __init__(self, names: Callable[[], AbstractSet[str]]) -> None:
        self._names = names

    def __contains__(self, name: object) -> bool:
        return name in self._names()

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())

    def __repr__(self) -> str:
        return f"{type(self).__name__}({sorted(self._names())})"


class WireNames(LiveWireNames):
    """The wire names of some event classes, named through the classes and resolved when first
    asked (``WireNames(lambda ev: (ev.TurnStarted, ev.TurnEnded))``, ``ev`` being
    ``terret.domain.events``): importing a projection does not load the payload classes."""

    def __init__(self, classes: Callable[[ModuleType], Iterable[type[Any]]]) -> None:
        super().__init__(self.resolved)
        self._classes = classes
        self._resolved: frozenset[str] | None = None

    def resolved(self) -> frozenset[str]:
        names = self._resolved
        if names is None:
            from terret.domain import events  # the payload classes: on first use

            names = self._resolved = frozenset(c.wire_name for c in self._classes(events))
        return names

    def __contains__(self, name: object) -> bool:
        # Asked per event and projection (``wants``, the purge check): one set lookup once
        # resolved, not three calls.
        names = self._resolved
        return name in (names if names is not None else self.resolved())


PURGED = WireNames(lambda ev: (ev.SessionPurged,))
"""``session/purged``: every projection forgets the session it names (R27)."""


Target = Callable[[sqlite3.Connection, "RecordedEvent", Any], None]
"""What the batch applier calls per event: ``(db, event, event.payload)``."""


class Projection(ABC):
    """A read model. Subclasses declare ``name``, ``handles`` (wire names), ``tables`` and
    ``schema`` (CREATE statements), and implement ``process`` — or subclass
    ``TypedProjection`` and write one typed handler per payload class instead."""

    name: ClassVar[str]
    handles: ClassVar[AbstractSet[str]]
    tables: ClassVar[tuple[str, ...]]
    schema: ClassVar[str]
    version: ClassVar[int] = 1
    """Bump it when the tables' layout or meaning changes: a view file written by another
    version of the projection is then dropped and rebuilt from the log on open."""

    @abstractmethod
    def process(self, db: sqlite3.Connection, event: RecordedEvent) -> None:
        """Apply one event to this projection's tables (inside the runner's transaction)."""

    def begin(self) -> None:  # noqa: B027 - an optional hook
        """Called when the runner opens a transaction (a batch), and again when it rolls one
        back: a projection that keeps state in memory during a batch resets it here."""

    def flush(self, db: sqlite3.Connection) -> None:  # noqa: B027 - an optional hook
        """Called before the runner records the tracked position (and after each event on its
        careful path): write what the batch kept in memory, in the same transaction."""

    def wants(self, wire_name: str) -> bool:
        """Whether the runner feeds this projection the event: what it handles, and the purge
        of a session (R27), which every projection applies by forgetting the session."""
        return wire_name in self.handles or wire_name in PURGED

    def apply(self, db: sqlite3.Connection, event: RecordedEvent) -> None:
        if event.wire_name in PURGED:
            session_id = getattr(event.payload, "session_id", None)
            if session_id:
                self.flush(db)  # what the batch holds in memory goes first
                self.purge(db, f"{SESSION_PREFIX}{session_id}")
        if event.wire_name in self.handles:
            self.process(db, event)

    def purge(self, db: sqlite3.Connection, stream: str) -> None:
        """Forget a purged session: delete its rows from every table with a ``session``
        column, whichever form of its id the column holds (the stream name ``session-<uuid>``,
        the UUID's text or hex, its 16 bytes). Override when a projection keys sessions
        differently."""
        forms = _id_forms(stream)
        marks = ", ".join("?" * len(forms))
        for table in self.tables:
            columns = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
            if "session" in columns:
                db.execute(f"DELETE FROM {table} WHERE session IN ({marks})", forms)

    def create(self, db: sqlite3.Connection) -> None:
        """Create the tables of ``schema``, statement by statement: inside the caller's
        transaction, where there is one (a reset of the views creates them in its own)."""
        for statement in sql_statements(self.schema):
            db.execute(statement)

    def drop(self, db: sqlite3.Connection) -> None:
        for table in self.tables:
            db.execute(f"DROP TABLE IF EXISTS {table}")

    def dump(self, db: sqlite3.Connection) -> dict[str, list[tuple[object, ...]]]:
        """Every row of every table, sorted — what ``verify`` compares."""
        return {
            table: sorted(db.execute(f"SELECT * FROM {table}").fetchall(), key=repr)
            for table in self.tables
        }


class TypedProjection(Projection):
    """A projection written as one typed handler per payload class (``@handler``, from
    ``terret.projections._typed``: ``def _ended(self, db, event, p: TurnEnded)``): ``process``
    dispatches on the payload's class, and ``handles`` is the wire names of the handlers'
    classes unless the class says otherwise (a handler for a base class, such as one for every
    ``EventPayload``, needs it said)."""

    _dispatch: ClassVar[Dispatch]
    _by_class: ClassVar[dict[type[Any], Handler | None]]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        dispatch = cls._dispatch = Dispatch(
            found for c in reversed(cls.__mro__) if (found := marked(vars(c))))
        cls._by_class = dispatch.by_class
        if marked(vars(cls)) and "handles" not in vars(cls):
            cls.handles = WireNames(lambda _: dispatch.named_classes())

    def handler_for(self, cls: type[Any]) -> Target | None:
        """The handler ``process`` calls for a payload of class ``cls``, bound (None when it
        has none): the batch applier takes it once per wire name and calls it directly."""
        fn = self._by_class[cls] if cls in self._by_class else self._dispatch.resolve(cls)
        return None if fn is None else cast(Target, MethodType(fn, self))

    def process(self, db: sqlite3.Connection, event: RecordedEvent) -> None:
        """The handler of the payload's class, if it has one: one dictionary lookup."""
        payload = event.payload
        try:
            fn = self._by_class[type(payload)]
        except KeyError:
            fn = self._dispatch.resolve(type(payload))
        if fn is not None:
            fn(self, db, event, payload)


def _id_forms(stream: str) -> tuple[object, ...]:
    """The forms a session's id may be stored in, given its stream name."""
    try:
        sid = UUID(stream.removeprefix("session-"))
    except ValueError:
        return (stream,)
    return stream, str(sid), sid.hex, sid.bytes
