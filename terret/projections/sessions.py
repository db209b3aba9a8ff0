"""The operators' session index: id, agent, created, last activity, event count, closed, and how
its last turn ended (status, reason, who forced it, the full error, when) — joined at read time
with the title, status (its owner: the aggregate's state) and usage views."""

from __future__ import annotations

import itertools
import json
import sqlite3
import sys
import time
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, NoReturn

from terret.domain.errors import PurgeUnfinished, SessionExpiring
from terret.domain.money import cost_figure
from terret.domain.store import SESSION_PREFIX, EventStore
from terret.projections._typed import handler
from terret.projections.base import LiveWireNames, TypedProjection
from terret.projections.status import status_name
from terret.projections.usage import UsageTotals

if TYPE_CHECKING:  # importing the codec loads every payload class
    from terret.domain.catalogue import EventPayload, OpaquePayload
    from terret.domain.codec import RecordedEvent
    from terret.domain.events import SessionClosed, SessionPurged, SessionStarted, TurnEnded


@dataclass(frozen=True)
class SessionSummary:
    session: str
    agent: str
    title: str | None
    status: str
    created: float
    last_activity: float
    events: int
    usage: UsageTotals
    closed: bool
    last_turn: dict[str, Any] | None = None
    """How the last turn that ended ended: ``{turn, status, reason, by, error, ended}``."""
    owner: dict[str, Any] | None = None
    """The session's owner as its log records it (``agent/attached``): ``{agent_id, worker,
    host, pid, epoch}``; None when no worker owns it."""
    spent: float = 0.0
    """What the session cost: its steps' (``usage``) and its upkeep's model calls (the
    summarizer's, the titler's) — what its spend budget counts."""

    @property
    def id(self) -> str:
        return self.session.removeprefix(SESSION_PREFIX)

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id, "agent": self.agent, "title": self.title, "status": self.status,
            "created": self.created, "last_activity": self.last_activity,
            "events": self.events, "usage": self.usage.as_dict(), "closed": self.closed,
            "last_turn": self.last_turn, "owner": self.owner, "spent": self.spent,
        }


def _every_known_event() -> frozenset[str]:
    """Every wire name registered in the catalogue, extensions included (as they register)."""
    from terret.domain.catalogue import catalogue  # loads the payload classes: on first use

    return catalogue.wire_names()


class EveryWireName(LiveWireNames):
    """Every wire name, those this process cannot read included (a newer release's, an
    extension not installed here): the session index counts every event of a session's log.
    Iterating gives the catalogue's names (the ones a reader can name)."""

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str)


def workers_comings_and_goings() -> frozenset[str]:
    """Events that are not a session's activity: a worker taking it or letting it go, a deploy's
    new revision. A rolling deploy writes them to every session its workers held, idle ones too:
    counted, every session would look active at the deploy."""
    from terret.domain.events import AgentAttached, AgentDetached, AgentRevised

    return frozenset({AgentAttached.wire_name, AgentDetached.wire_name, AgentRevised.wire_name})


class SessionsProjection(TypedProjection):
    name = "sessions"
    version = 6  # 2: how the last turn ended (last_turn); 3: unreadable events counted too;
    # 4: records that do not decode counted too (they halted it); 5: a worker's comings and
    # goings are not activity; 6: the purges recorded (sessions_purged)
    handles = EveryWireName(_every_known_event)
    tables = ("sessions", "sessions_purged")
    # sessions_purged keys its rows by `purged`, not `session`: a purge forgets the session's
    # rows in every table with a `session` column, and this one is the purge's own record.
    schema = """
    CREATE TABLE IF NOT EXISTS sessions (
        session TEXT PRIMARY KEY, agent TEXT NOT NULL, created REAL NOT NULL,
        last_activity REAL NOT NULL, events INTEGER NOT NULL, closed INTEGER NOT NULL,
        last_turn TEXT
    );
    CREATE TABLE IF NOT EXISTS sessions_purged (
        purged TEXT PRIMARY KEY, position INTEGER NOT NULL, at REAL NOT NULL,
        max_age INTEGER, by TEXT
    );
    """

    def __init__(self) -> None:
        # Within a batch only each session's last event matters (its time is the last
        # activity, its seq the event count), besides the start and a close: processing an
        # event is remembering it, and ``flush`` reads and writes each touched row once.
        self._last: dict[str, RecordedEvent] = {}
        self._active: dict[str, float] = {}  # the time of the last event that is activity
        self._started: dict[str, RecordedEvent] = {}
        self._closed: set[str] = set()
        self._ended: dict[str, RecordedEvent] = {}

    @cached_property
    def _not_activity(self) -> frozenset[str]:
        # Read when the first event is: the payload classes are loaded by then, and a read of
        # the views that processes none (a command's start-up) does not load them.
        return workers_comings_and_goings()

    def begin(self) -> None:
        self._last, self._active, self._started, self._closed, self._ended = \
            {}, {}, {}, set(), {}

    @handler
    def _on_any(self, db: sqlite3.Connection, event: RecordedEvent,
                p: EventPayload | OpaquePayload) -> None:
        self._last[event.stream] = event
        if event.wire_name not in self._not_activity:
            self._active[event.stream] = event.recorded_at

    @handler
    def _on_started(self, db: sqlite3.Connection, event: RecordedEvent, p: SessionStarted
                    ) -> None:
        self._last[event.stream] = self._started[event.stream] = event
        self._active[event.stream] = event.recorded_at

    @handler
    def _on_closed(self, db: sqlite3.Connection, event: RecordedEvent, p: SessionClosed) -> None:
        self._last[event.stream] = event
        self._active[event.stream] = event.recorded_at
        self._closed.add(event.stream)

    @handler
    def _on_turn_ended(self, db: sqlite3.Connection, event: RecordedEvent, p: TurnEnded) -> None:
        self._last[event.stream] = self._ended[event.stream] = event
        self._active[event.stream] = event.recorded_at

    @handler
    def _on_purged(self, db: sqlite3.Connection, event: RecordedEvent, p: SessionPurged
                   ) -> None:
        r = PurgeRecord.of(event, p)
        db.execute("INSERT OR REPLACE INTO sessions_purged VALUES (?, ?, ?, ?, ?)",
                   (r.session, r.position, r.at, r.max_age,
                    json.dumps(r.by, sort_keys=True) if r.by is not None else None))

    def flush(self, db: sqlite3.Connection) -> None:
        rows = [row for stream, last in self._last.items()
                if stream.startswith(SESSION_PREFIX) and (row := self._row(db, stream, last))]
        if rows:
            db.executemany("INSERT OR REPLACE INTO sessions VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
        self.begin()

    def _row(self, db: sqlite3.Connection, stream: str, last: RecordedEvent
             ) -> tuple[Any, ...] | None:
        """The session's row after the batch; None for a stream with no ``session/started``."""
        started = self._started.get(stream)
        if started is not None:
            p: Any = started.payload
            row = [p.agent, started.recorded_at, 0.0, 0, 0, None]
        else:
            found = db.execute("SELECT agent, created, last_activity, events, closed,"
                               " last_turn FROM sessions WHERE session = ?", (stream,)).fetchone()
            if found is None:
                return None
            row = list(found)
        row[2] = self._active.get(stream, row[2])
        row[3] = max(row[3], last.seq)
        if stream in self._closed:
            row[4] = 1
        ended = self._ended.get(stream)
        if ended is not None:
            row[5] = _last_turn(ended)
        return (stream, *row)


def _last_turn(event: RecordedEvent) -> str:
    p: Any = event.payload
    by = p.by.model_dump(exclude_none=True) if getattr(p, "by", None) is not None else None
    return json.dumps({"turn": p.turn, "status": p.status, "reason": p.reason, "by": by,
                       "error": p.error, "ended": event.recorded_at}, sort_keys=True)


_FILTERS = (
    ("stream", "s.session = ?"),
    ("agent", "s.agent = ?"),
    # A part of it in any case, any script's letters (SQLite's lower() knows only ASCII's).
    ("title", "instr(terret_casefold(t.title), terret_casefold(?)) > 0"),
    ("since", "s.last_activity >= ?"),
    ("until", "s.last_activity <= ?"),
)
"""Each filter of ``list_sessions`` and its clause, in the order the clauses are written."""

_LIST = """
    SELECT s.session, s.agent, t.title, s.created, s.last_activity, s.events, s.closed,
           st.turn_open, st.waiting, u.p, u.c, u.cost, u.steps,
           s.last_turn, json_extract(st.state, '$.owner'), k.cost
    FROM sessions s
    LEFT JOIN titles t ON t.session = s.session
    LEFT JOIN status st ON st.session = s.session
    LEFT JOIN (SELECT session, sum(prompt_tokens) p, sum(completion_tokens) c,
                      sum(cost) cost, sum(steps) steps
               FROM usage_turns {usage_where} GROUP BY session) u ON u.session = s.session
    LEFT JOIN (SELECT session, sum(cost) cost
               FROM usage_upkeep {usage_where} GROUP BY session) k ON k.session = s.session
    {where}
    ORDER BY s.last_activity DESC, s.session
"""


def _casefold(text: str | None) -> str | None:
    return None if text is None else text.casefold()


def list_sessions(db: sqlite3.Connection, *, status: str | None = None,
                  limit: int | None = None, stream: str | None = None,
                  agent: str | None = None, title: str | None = None,
                  since: float | None = None, until: float | None = None,
                  offset: int = 0) -> list[SessionSummary]:
    """Sessions, most recently active first: of one ``stream``, or filtered by ``status``,
    ``agent``, ``title`` (a case-insensitive part of it) and last activity (``since`` ≤ it ≤
    ``until``), the ``offset`` first left out and at most ``limit`` of the rest."""
    given = {"stream": stream or None, "agent": agent, "title": title, "since": since,
             "until": until}
    clauses = [(clause, given[name]) for name, clause in _FILTERS if given[name] is not None]
    if title is not None:
        db.create_function("terret_casefold", 1, _casefold, deterministic=True)
    where = f"WHERE {' AND '.join(c for c, _ in clauses)}" if clauses else ""
    # One session's summary sums that session's usage only, not every session's.
    usage_where, usage_params = ("WHERE session = ?", [stream]) if stream else ("", [])
    rows = db.execute(_LIST.format(usage_where=usage_where, where=where),
                      2 * usage_params + [value for _, value in clauses]).fetchall()
    kept = (r for r in rows if status is None or _status(r) == status)
    # (Each within sys.maxsize as the options allow, their sum may not be: past it is the end.)
    end = None if limit is None else min(offset + limit, sys.maxsize)
    page = itertools.islice(kept, min(offset, sys.maxsize), end)
    return [_summary(r) for r in page]


def _status(r: tuple[Any, ...]) -> str:
    """The status of a row of ``_LIST``."""
    return status_name(bool(r[7]), r[8], bool(r[6]))


def _summary(r: tuple[Any, ...]) -> SessionSummary:
    """A row of ``_LIST`` as a summary."""
    usage = UsageTotals(r[9] or 0, r[10] or 0, r[11] or 0.0, r[12] or 0)
    return SessionSummary(r[0], r[1], r[2], _status(r), r[3], r[4], r[5], usage, bool(r[6]),
                          json.loads(r[13]) if r[13] else None,
                          json.loads(r[14]) if r[14] else None,
                          cost_figure(usage.cost + (r[15] or 0.0)))


def get_summary(db: sqlite3.Connection, stream: str) -> SessionSummary | None:
    found = list_sessions(db, stream=stream)
    return found[0] if found else None


@dataclass(frozen=True)
class PurgeRecord:
    """A session's purge as the retention stream recorded it (``session/purged``)."""

    session: str
    position: int
    at: float
    max_age: int | None
    by: dict[str, Any] | None

    @property
    def id(self) -> str:
        return self.session.removeprefix(SESSION_PREFIX)

    @classmethod
    def of(cls, event: RecordedEvent, p: SessionPurged) -> PurgeRecord:
        by = p.by.model_dump(exclude_none=True) if p.by is not None else None
        return cls(f"{SESSION_PREFIX}{p.session_id}", event.position, event.recorded_at,
                   p.max_age_seconds, by)

    def refuse(self, store: EventStore) -> NoReturn:
        """``PurgeUnfinished`` when the log is still in the store (its purge's process
        stopped between recording it and carrying it out): read as it is, it would be shown
        empty (the views forgot it) or whole. One purged to expire is ``SessionExpiring``, as
        its reads are once its events start to go — if the store was given its expiry: a
        purge stopped before that is unfinished too."""
        if self.max_age is not None and store.max_age(self.session) == self.max_age:
            raise SessionExpiring(f"session {self.id} was purged to expire after "
                                  f"{self.max_age}s: the views have forgotten it")
        by = self.by or {}
        who = f" by {by.get('actor')}" + (f" ({by['id']})" if by.get("id") else "") if by else ""
        at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.at))
        undone, again = "deleting the log", f"`terret sessions purge {self.id} --yes`"
        if self.max_age is not None:
            undone = "giving the log its expiry"
            again = f"`terret sessions purge {self.id} --max-age {self.max_age} --yes`"
        raise PurgeUnfinished(
            f"session {self.id} was purged{who} at {at}, but its log is still in the store: "
            f"the purge did not finish (its process stopped between recording it and {undone})"
            f"; {again} (or runtime.purge) finishes it")


def purges(db: sqlite3.Connection, stream: str | None = None) -> list[PurgeRecord]:
    """The purges recorded (of one session's ``stream``), in the order they were."""
    where, params = ("WHERE purged = ?", (stream,)) if stream else ("", ())
    return [PurgeRecord(r[0], r[1], r[2], r[3], json.loads(r[4]) if r[4] else None)
            for r in db.execute("SELECT purged, position, at, max_age, by FROM sessions_purged"
                                f" {where} ORDER BY position", params)]
