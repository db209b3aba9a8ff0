"""Typed handlers (``TypedProjection``, ``@handler``): one method per payload class, the wire
names it handles named through the classes."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from uuid import uuid4

import pytest

from terret.adapters.stores import MemoryStore
from terret.domain import events as ev
from terret.domain.catalogue import EventPayload, catalogue
from terret.domain.codec import RecordedEvent, decode, encode
from terret.domain.session import EVOLVING
from terret.domain.store import NewRecord, StoredRecord, StreamState, session_stream
from terret.projections import ProjectionRunner, ViewStore
from terret.projections._typed import handler
from terret.projections.base import TypedProjection
from terret.projections.views import default_projections

USER = ev.Actor(actor="user")


def _event(payload: EventPayload, seq: int = 1) -> RecordedEvent:
    new = encode(payload)
    return decode(StoredRecord("session-x", seq, seq, new.event_id, new.wire_name, new.data,
                               new.metadata, 0.0))


def test_the_default_projections_handle_what_they_handled() -> None:
    handles = {p.name: set(p.handles) for p in default_projections()}
    assert handles["messages"] == {ev.UserMessage.wire_name, ev.ContextInjected.wire_name,
                                   ev.AssistantMessage.wire_name, ev.ToolResult.wire_name,
                                   ev.SessionCompacted.wire_name}
    assert handles["usage"] == {ev.StepStarted.wire_name, ev.AssistantMessage.wire_name,
                                ev.StepEnded.wire_name, ev.UsageRecorded.wire_name}
    assert handles["title"] == {ev.SessionTitled.wire_name}
    assert handles["policy"] == {ev.PolicyUpdated.wire_name, ev.PolicyReset.wire_name}
    assert handles["models"] == {ev.SessionStarted.wire_name, ev.ModelSet.wire_name}
    assert handles["approvals"] == {ev.TurnStarted.wire_name, ev.TurnEnded.wire_name,
                                    ev.ApprovalRequested.wire_name,
                                    ev.ApprovalResolved.wire_name}
    assert handles["status"] == set(EVOLVING)
    assert ev.TurnStarted.wire_name in EVOLVING and ev.UserMessage.wire_name in EVOLVING
    # The session index counts every event of a log: each catalogued wire name, and those this
    # process has never heard of (what `wants` asks).
    sessions = next(p for p in default_projections() if p.name == "sessions")
    assert all(sessions.wants(name) for name in catalogue.wire_names())
    assert sessions.wants("acme.unknown/x")
    assert not next(p for p in default_projections() if p.name == "title").wants(
        "acme.unknown/x")


class _Seen(TypedProjection):
    name = "seen"
    tables = ()
    schema = ""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    @handler
    def _turn(self, db: sqlite3.Connection, event: RecordedEvent,
              p: ev.TurnStarted | ev.TurnEnded) -> None:
        self.seen.append(("turn", type(p).__name__))

    @handler
    def _title(self, db: sqlite3.Connection, event: RecordedEvent, p: ev.SessionTitled) -> None:
        self.seen.append(("title", p.title))


class _Everything(_Seen):
    name = "everything"
    handles = frozenset(catalogue.wire_names())

    @handler
    def _any(self, db: sqlite3.Connection, event: RecordedEvent, p: EventPayload) -> None:
        self.seen.append(("any", type(p).__name__))

    @handler
    def _title(self, db: sqlite3.Connection, event: RecordedEvent, p: ev.SessionTitled) -> None:
        self.seen.append(("own title", p.title))


def test_a_handler_per_class_a_union_registers_each() -> None:
    seen = _Seen()
    assert set(seen.handles) == {ev.TurnStarted.wire_name, ev.TurnEnded.wire_name,
                                 ev.SessionTitled.wire_name}
    db = sqlite3.connect(":memory:")
    for payload in (ev.TurnStarted(turn=1), ev.SessionTitled(title="Hi"),
                    ev.TurnEnded(turn=1, status="completed"), ev.SessionClosed(by=USER)):
        seen.process(db, _event(payload))
    assert seen.seen == [("turn", "TurnStarted"), ("title", "Hi"), ("turn", "TurnEnded")]


def test_a_base_class_handler_takes_the_rest_and_a_subclass_overrides() -> None:
    everything = _Everything()
    db = sqlite3.connect(":memory:")
    for payload in (ev.TurnStarted(turn=1), ev.SessionTitled(title="Hi"),
                    ev.SessionClosed(by=USER)):
        everything.process(db, _event(payload))
    assert everything.seen == [("turn", "TurnStarted"), ("own title", "Hi"),
                               ("any", "SessionClosed")]


def test_two_handlers_for_one_class_are_refused() -> None:
    class Twice(TypedProjection):
        name = "twice"
        tables = ()
        schema = ""

        @handler
        def _a(self, db: sqlite3.Connection, event: RecordedEvent, p: ev.TurnStarted) -> None:
            pass

        @handler
        def _b(self, db: sqlite3.Connection, event: RecordedEvent,
               p: ev.TurnStarted | ev.TurnEnded) -> None:
            pass

    with pytest.raises(TypeError, match="two handlers for TurnStarted"):
        Twice().process(sqlite3.connect(":memory:"), _event(ev.TurnStarted(turn=1)))


def test_importing_the_projections_loads_no_payload_class() -> None:
    code = ("import sys; import terret.projections.views; "
            "print('terret.domain.events' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "False"


class _Titles(TypedProjection):
    """A typed projection with rows, run by a runner (its handlers taken once per wire name)."""

    name = "typed.titles"
    handles = frozenset({ev.SessionTitled.wire_name, ev.SessionClosed.wire_name})
    tables = ("typed_titles",)
    schema = "CREATE TABLE IF NOT EXISTS typed_titles (session TEXT, seq INTEGER, title TEXT);"

    @handler
    def _title(self, db: sqlite3.Connection, event: RecordedEvent, p: ev.SessionTitled) -> None:
        db.execute("INSERT INTO typed_titles VALUES (?, ?, ?)", (event.stream, event.seq, p.title))


def test_a_runner_applies_typed_handlers_and_halts_on_a_corrupt_record_they_want() -> None:
    store = MemoryStore()
    stream = session_stream(uuid4())
    titles = [encode(ev.SessionTitled(title=t)) for t in ("One", "Two")]
    store.append(stream, titles, StreamState.NO_STREAM)
    views = ViewStore(":memory:")
    runner = ProjectionRunner(store, views, [_Titles()])
    runner.catch_up()
    with views.reading() as db:
        assert db.execute("SELECT title FROM typed_titles ORDER BY seq").fetchall() == [
            ("One",), ("Two",)]
    assert runner.verify("typed.titles") == []
    # session/closed is handled (named in handles) though no handler takes it: a record of it
    # that cannot be decoded halts the projection, as a process() that does nothing would.
    bad = NewRecord(uuid4(), ev.SessionClosed.wire_name, b'{"by": 5}', b'{"schema_version": 1}')
    position = store.append(stream, [bad], 2).position
    runner.catch_up()
    (state,) = runner.states()
    assert state.fault is not None and state.fault[0] == position
