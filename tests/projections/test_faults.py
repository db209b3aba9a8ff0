"""An event a projection cannot process halts that projection — recorded, never skipped
silently; the others carry on; an operator's skip is recorded, resumes the projection and is
honoured by rebuilds while the event still fails (one that now reads is applied, the skip
dropped)."""

from __future__ import annotations

import queue
import sqlite3
import threading
from uuid import UUID, uuid4

import pytest

from terret import RecordedEvent, Session
from terret.domain.errors import ProjectionHalted, ProjectionNotHalted
from terret.domain.events import ToolCallData
from terret.domain.store import EventStore, NewRecord, session_stream
from terret.projections import Projection, ProjectionRunner, Views, ViewStore, default_projections
from tests.projections.conftest import OpenedStore
from tests.projections.logs import MODEL, Writer, positions

WAIT = 10.0
HANDLING_REQUESTS = {"approvals", "status"}  # the projections reading approval/requested
# The session index reads no field of it: it counts a record that does not decode, as one of an
# event this process does not know, instead of halting (and the session's row stays current).


def _open_step_with_call(s: Session) -> None:
    s.start_turn(text="deploy")
    s.start_step(MODEL)
    s.record_assistant("", [ToolCallData(id="c1", name="deploy", args={"env": "prod"})])


def _append_corrupt_request(store: EventStore, sid: UUID) -> int:
    """An ``approval/requested`` whose data fails validation (empty call id)."""
    stream = session_stream(sid)
    record = NewRecord(uuid4(), "approval/requested",
                       b'{"call_id": "", "name": "deploy", "args": {}}',
                       b'{"schema_version": 1}')
    return store.append(stream, [record], store.stream_version(stream)).position


def _ask(writer: Writer, sid: UUID) -> int:
    def run(s: Session) -> None:
        _open_step_with_call(s)
        s.request_approval("c1", "deploy", {"env": "prod"})

    return writer.do(sid, run).position


def _faults(runner: ProjectionRunner) -> dict[str, tuple[int, str]]:
    return {s.name: s.fault for s in runner.states() if s.fault is not None}


def test_a_corrupt_payload_halts_the_projections_that_handle_it_and_only_them(
    writer: Writer, runner: ProjectionRunner, store: EventStore, views: Views
) -> None:
    broken = writer.start()
    writer.do(broken, _open_step_with_call)
    got: queue.Queue[int] = queue.Queue()
    runner.add_listener(lambda e: got.put(e.position), ["session/titled"])
    runner.start()
    bad = _append_corrupt_request(store, broken)

    other = writer.start()
    _ask(writer, other)
    titled = writer.do(other, lambda s: s.title("still served")).position
    runner.wait_until(titled, timeout=WAIT)
    assert got.get(timeout=WAIT) == titled  # listeners carry on too

    faults = _faults(runner)
    assert set(faults) == HANDLING_REQUESTS
    for position, error in faults.values():
        assert position == bad
        assert f"position {bad}" in error and "approval/requested" in error
        assert "call_id" in error  # names the offending field
    with pytest.raises(ProjectionHalted) as halted:
        runner.check_halted()
    assert halted.value.position == bad
    # Halted projections stopped before the bad event and applied nothing after it …
    states = {s.name: s for s in runner.states()}
    before_bad = max(p for p in positions(store) if p < bad)
    assert all(states[n].position == before_bad for n in HANDLING_REQUESTS)
    assert views.pending(other) == []
    summary = views.summary(broken)
    assert summary is not None and summary.events == len(store.read_stream(session_stream(broken)))
    # … while the others went on.
    assert views.title(other) == "still served"
    assert [m.text for m in views.messages(broken)] == ["deploy", ""]
    assert all(s.position == titled for s in states.values() if s.name not in HANDLING_REQUESTS)


def test_a_halted_projection_stays_halted_across_restarts(
    opened_store: OpenedStore, writer: Writer, view_store: ViewStore
) -> None:
    sid = writer.start()
    writer.do(sid, _open_step_with_call)
    bad = _append_corrupt_request(opened_store.store, sid)
    ProjectionRunner(opened_store.store, view_store, default_projections()).catch_up()
    other = writer.start()
    position = _ask(writer, other)

    again = ProjectionRunner(opened_store.store, view_store, default_projections())
    opened_store.runners.append(again)
    again.start().wait_until(position, timeout=WAIT)
    assert {n: f[0] for n, f in _faults(again).items()} == dict.fromkeys(HANDLING_REQUESTS, bad)
    assert Views(view_store).pending(other) == []


def test_skip_is_recorded_and_the_projection_resumes_without_losing_later_events(
    writer: Writer, runner: ProjectionRunner, store: EventStore, views: Views,
    view_store: ViewStore
) -> None:
    broken = writer.start()
    writer.do(broken, _open_step_with_call)
    runner.start()
    bad = _append_corrupt_request(store, broken)
    other = writer.start()
    runner.wait_until(_ask(writer, other), timeout=WAIT)  # lands while approvals is halted
    assert views.pending(other) == []

    assert runner.skip("approvals", by="ops@example") == bad
    recorded = view_store.db.execute(
        "SELECT projection, position, error, by FROM projection_skips").fetchall()
    assert [(r[0], r[1], r[3]) for r in recorded] == [("approvals", bad, "ops@example")]
    assert "call_id" in recorded[0][2]  # the skip keeps the error it skipped
    assert set(_faults(runner)) == {"status"}
    # The events after the skipped one were not lost, and new ones keep coming.
    assert [p.call_id for p in views.pending(other)] == ["c1"]
    third = writer.start()
    runner.wait_until(_ask(writer, third), timeout=WAIT)
    assert [p.call_id for p in views.pending(third)] == ["c1"]
    assert view_store.tracked("approvals") == store.head_position()

    with pytest.raises(ProjectionNotHalted, match="not halted"):
        runner.skip("approvals")
    with pytest.raises(KeyError, match="no projection"):
        runner.skip("nonesuch")


def test_skip_on_a_runner_that_is_not_running_resumes_at_the_next_catch_up(
    writer: Writer, runner: ProjectionRunner, store: EventStore, views: Views
) -> None:
    broken = writer.start()
    writer.do(broken, _open_step_with_call)
    _append_corrupt_request(store, broken)
    other = writer.start()
    _ask(writer, other)
    runner.catch_up()
    assert views.pending(other) == []
    runner.skip("approvals")
    runner.catch_up()
    assert [p.call_id for p in views.pending(other)] == ["c1"]


def test_a_rebuild_honours_the_recorded_skip_and_halts_again_where_none_was_made(
    writer: Writer, runner: ProjectionRunner, store: EventStore, views: Views
) -> None:
    broken = writer.start()
    writer.do(broken, _open_step_with_call)
    bad = _append_corrupt_request(store, broken)
    other = writer.start()
    _ask(writer, other)
    runner.catch_up()
    runner.skip("approvals")
    runner.catch_up()
    before = views.pending()

    assert runner.rebuild("approvals") == store.head_position()
    assert "approvals" not in _faults(runner)
    assert views.pending() == before
    assert runner.verify("approvals") == []

    runner.rebuild("status")  # never skipped: the replay stops at the same event again
    assert _faults(runner)["status"][0] == bad


class Fragile(Projection):
    """A projection with a bug: it raises on the title "boom"."""

    name = "fragile"
    handles = frozenset({"session/titled"})
    tables = ("fragile_titles",)
    schema = "CREATE TABLE IF NOT EXISTS fragile_titles (seq INTEGER PRIMARY KEY, title TEXT);"

    def process(self, db: sqlite3.Connection, event: RecordedEvent) -> None:
        title = event.payload.title  # type: ignore[union-attr]
        db.execute("INSERT INTO fragile_titles VALUES (?, ?)", (event.seq, title))
        if title == "boom":
            raise ValueError("cannot handle boom")


def test_a_projection_that_raises_halts_at_that_event_and_keeps_what_came_before(
    writer: Writer, store: EventStore, view_store: ViewStore
) -> None:
    sid = writer.start()
    for title in ("first", "boom", "third"):
        writer.do(sid, lambda s, t=title: s.title(t))  # type: ignore[misc]
    runner = ProjectionRunner(store, view_store, [*default_projections(), Fragile()])
    runner.catch_up()  # one batch holds all three titles
    boom = store.read_stream(session_stream(sid))[2]
    assert boom.wire_name == "session/titled"
    faults = _faults(runner)
    assert faults == {"fragile": (boom.position, "ValueError: cannot handle boom")}
    assert view_store.db.execute("SELECT title FROM fragile_titles").fetchall() == [("first",)]
    assert Views(view_store).title(sid) == "third"


class Exiting(Fragile):
    """A projection whose bug is a ``sys.exit``: the command ended silently, exit 3, the
    projection not halted."""

    name = "exiting"
    tables = ("exiting_titles",)
    schema = "CREATE TABLE IF NOT EXISTS exiting_titles (seq INTEGER PRIMARY KEY, title TEXT);"

    def process(self, db: sqlite3.Connection, event: RecordedEvent) -> None:
        if event.payload.title == "boom":  # type: ignore[union-attr]
            raise SystemExit(3)
        db.execute("INSERT INTO exiting_titles VALUES (?, ?)",
                   (event.seq, event.payload.title))  # type: ignore[union-attr]


def test_a_projection_that_exits_halts_as_one_that_raises(
    writer: Writer, store: EventStore, view_store: ViewStore
) -> None:
    sid = writer.start()
    for title in ("first", "boom", "third"):
        writer.do(sid, lambda s, t=title: s.title(t))  # type: ignore[misc]
    runner = ProjectionRunner(store, view_store, [*default_projections(), Exiting()])
    runner.catch_up()
    boom = store.read_stream(session_stream(sid))[2]
    assert _faults(runner) == {"exiting": (boom.position, "SystemExit: 3")}
    assert view_store.db.execute("SELECT title FROM exiting_titles").fetchall() == [("first",)]


def test_skip_while_listeners_run_resumes_from_what_was_applied(
    writer: Writer, runner: ProjectionRunner, store: EventStore, views: Views
) -> None:
    """Listeners run after a batch is committed and before its position is published; a skip in
    that window must still replay the batch into the resumed projection."""
    broken = writer.start()
    writer.do(broken, _open_step_with_call)
    entered, release = threading.Event(), threading.Event()

    def slow(event: RecordedEvent) -> None:
        entered.set()
        release.wait(WAIT)

    runner.add_listener(slow, ["session/titled"])
    runner.start()
    runner.wait_until(_append_corrupt_request(store, broken), timeout=WAIT)
    other = writer.start()

    def ask_and_title(s: Session) -> None:
        _open_step_with_call(s)
        s.request_approval("c1", "deploy", {"env": "prod"})
        s.title("one batch")

    last = writer.do(other, ask_and_title).position  # one append: one batch
    assert entered.wait(WAIT)
    try:
        runner.skip("approvals")
    finally:
        release.set()
    runner.wait_until(last, timeout=WAIT)
    assert [p.call_id for p in views.pending(other)] == ["c1"]
    assert runner.verify("approvals") == []


def test_a_corrupt_record_no_projection_wants_halts_none_and_keeps_the_fast_path(
    writer: Writer, store: EventStore, view_store: ViewStore
) -> None:
    from terret.projections.title import TitleProjection

    sid = writer.start()
    writer.do(sid, _open_step_with_call)
    _append_corrupt_request(store, sid)
    other = writer.start()
    head = writer.do(other, lambda s: s.title("after the bad record")).position
    runner = ProjectionRunner(store, view_store, [TitleProjection()])
    statements: list[str] = []
    view_store.db.set_trace_callback(statements.append)
    assert runner.catch_up() == head
    view_store.db.set_trace_callback(None)
    assert not [s for s in statements if s.startswith("SAVEPOINT")]
    assert _faults(runner) == {}
    assert Views(view_store).title(other) == "after the bad record"


class Mended(Fragile):
    """``Fragile`` once its bug is fixed: same name, same tables."""

    def process(self, db: sqlite3.Connection, event: RecordedEvent) -> None:
        db.execute("INSERT INTO fragile_titles VALUES (?, ?)",
                   (event.seq, event.payload.title))  # type: ignore[union-attr]


def test_a_skipped_event_that_now_reads_is_applied_by_the_next_rebuild_and_the_skip_dropped(
    writer: Writer, store: EventStore, view_store: ViewStore
) -> None:
    sid = writer.start()
    for title in ("first", "boom", "third"):
        writer.do(sid, lambda s, t=title: s.title(t))  # type: ignore[misc]
    runner = ProjectionRunner(store, view_store, [*default_projections(), Fragile()])
    runner.catch_up()
    runner.skip("fragile")
    runner.catch_up()
    rows = "SELECT title FROM fragile_titles ORDER BY seq"
    assert view_store.db.execute(rows).fetchall() == [("first",), ("third",)]
    runner.rebuild("fragile")  # still failing: passed over again, the skip kept
    assert view_store.db.execute(rows).fetchall() == [("first",), ("third",)]
    assert len(view_store.skips_of("fragile")) == 1 and "fragile" not in _faults(runner)

    mended = ProjectionRunner(store, view_store, [*default_projections(), Mended()])
    assert [d for d in mended.verify("fragile")]  # the live view lacks what now reads
    mended.rebuild("fragile")
    assert view_store.db.execute(rows).fetchall() == [("first",), ("boom",), ("third",)]
    assert view_store.skips_of("fragile") == [] and "fragile" not in _faults(mended)
    assert mended.verify("fragile") == []
