"""The runner: log order, listeners after projections, batching, read-your-writes, restarts,
appends from another process, unknown wire names."""

from __future__ import annotations

import math
import os
import queue
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from uuid import uuid4

import pytest

from terret import OpaquePayload, RecordedEvent, Session
from terret.domain.events import ToolCallData, UsageData
from terret.domain.store import EventStore, NewRecord, session_stream
from terret.projections import (
    ProjectionRunner,
    UsageTotals,
    Views,
    ViewStore,
    default_projections,
)
from tests.projections.conftest import OpenedStore
from tests.projections.logs import MODEL, Writer, positions

WAIT = 10.0


def _started(opened: OpenedStore, views: ViewStore, *, batch_size: int = 5000
             ) -> ProjectionRunner:
    runner = ProjectionRunner(opened.store, views, default_projections(), batch_size=batch_size)
    opened.runners.append(runner)
    return runner.start()


def test_a_listener_reads_views_that_include_its_event(
    writer: Writer, runner: ProjectionRunner, views: Views
) -> None:
    sid = writer.start()
    seen: queue.Queue[tuple[int, str | None, int, list[str]]] = queue.Queue()

    def on_event(event: RecordedEvent) -> None:
        seen.put((event.position, views.title(sid), views.usage(sid).steps,
                  [m.text for m in views.messages(sid)]))

    runner.add_listener(on_event, ["session/titled", "step/end", "user/message"])
    runner.start()
    asked = writer.do(sid, lambda s: s.start_turn(text="hello"))
    assert seen.get(timeout=WAIT) == (asked.position, None, 0, ["hello"])
    titled = writer.do(sid, lambda s: s.title("Greeting"))
    assert seen.get(timeout=WAIT) == (titled.position, "Greeting", 0, ["hello"])
    stepped = writer.step(sid, "hi", usage=UsageData(prompt_tokens=3, completion_tokens=1))
    assert seen.get(timeout=WAIT) == (stepped.position, "Greeting", 1, ["hello", "hi"])
    assert seen.empty()


def test_listeners_get_every_later_event_in_log_order_and_no_history(
    writer: Writer, runner: ProjectionRunner, store: EventStore
) -> None:
    before = writer.start()
    writer.turn(before, "history")
    started_at = store.head_position()
    got: list[int] = []
    last = threading.Event()
    runner.add_listener(lambda e: got.append(e.position))
    runner.add_listener(lambda e: last.set(), ["session/titled"])
    runner.start()
    a, b = writer.start(), writer.start()
    writer.turn(a, "one")
    writer.turn(b, "two")
    writer.turn(before, "three")
    writer.do(b, lambda s: s.title("last"))
    assert last.wait(WAIT)
    assert got == positions(store, after=started_at)


def test_a_failing_listener_does_not_stop_the_others_or_the_bus(
    writer: Writer, runner: ProjectionRunner, views: Views
) -> None:
    sid = writer.start()
    got: queue.Queue[str] = queue.Queue()

    def broken(event: RecordedEvent) -> None:
        raise RuntimeError("listener bug")

    runner.add_listener(broken)
    runner.add_listener(lambda e: got.put(e.wire_name), ["session/titled"])
    runner.start()
    writer.do(sid, lambda s: s.title("one"))
    assert got.get(timeout=WAIT) == "session/titled"
    position = writer.do(sid, lambda s: s.title("two")).position
    assert got.get(timeout=WAIT) == "session/titled"
    runner.wait_until(position)
    assert views.title(sid) == "two"


def test_a_removed_listener_is_not_called(writer: Writer, runner: ProjectionRunner) -> None:
    sid = writer.start()
    removed: list[int] = []
    kept: queue.Queue[int] = queue.Queue()
    handle = runner.add_listener(lambda e: removed.append(e.position))
    runner.add_listener(lambda e: kept.put(e.position), ["session/titled"])
    assert runner.listener_count == 2
    handle.remove()
    handle.remove()  # idempotent
    assert runner.listener_count == 1
    runner.start()
    position = writer.do(sid, lambda s: s.title("t")).position
    assert kept.get(timeout=WAIT) == position
    assert removed == []


def test_wait_until_gives_read_your_writes(writer: Writer, runner: ProjectionRunner,
                                           views: Views) -> None:
    runner.start()
    sid = writer.start()
    for i in range(20):
        position = writer.do(sid, lambda s, i=i: s.title(f"title {i}")).position  # type: ignore[misc]
        runner.wait_until(position, timeout=WAIT)
        assert views.title(sid) == f"title {i}"
    assert runner.position >= position


def test_wait_until_times_out_naming_the_position(runner: ProjectionRunner,
                                                  store: EventStore) -> None:
    runner.start()
    target = store.head_position() + 5
    with pytest.raises(TimeoutError, match=f"position {target}"):
        runner.wait_until(target, timeout=0.05)


def _transactions(statements: list[str]) -> list[list[str]]:
    """Group traced statements into BEGIN … COMMIT blocks."""
    out: list[list[str]] = []
    current: list[str] | None = None
    for sql in statements:
        word = sql.strip().split()[0].upper()
        if word == "BEGIN":
            current = []
        elif word == "COMMIT":
            assert current is not None
            out.append(current)
            current = None
        elif current is not None:
            current.append(sql)
    return out


def _write_turns(writer: Writer, turns: int) -> int:
    sid = writer.start()
    for i in range(turns):
        writer.turn(sid, f"q{i}", f"a{i}", usage=UsageData(prompt_tokens=1, completion_tokens=1))
    return writer.store.head_position()


def _check_batches(statements: list[str], events: int, batch: int, slack: int) -> None:
    transactions = _transactions(statements)
    writing = [t for t in transactions if any("messages" in s for s in t)]
    projections = len(default_projections())
    # Batches, not events: about events / batch transactions, each with many view writes.
    assert math.ceil(events / batch) <= len(transactions) <= math.ceil(events / batch) + slack
    assert sum(1 for t in writing for s in t if s.startswith("INSERT OR REPLACE INTO messages")
               ) == 2 * (events - 1) // 6  # one user and one assistant message per 6-event turn
    for t in transactions:
        # The tracked position is written in the same transaction as the view rows, once per
        # projection per batch.
        tracking = [s for s in t if "INTO tracking" in s]
        assert len(tracking) == projections


def test_catch_up_commits_in_batches_with_the_tracked_position(
    writer: Writer, store: EventStore, view_store: ViewStore
) -> None:
    head = _write_turns(writer, 100)
    runner = ProjectionRunner(store, view_store, default_projections(), batch_size=50)
    statements: list[str] = []
    view_store.db.set_trace_callback(statements.append)
    assert runner.catch_up() == head
    view_store.db.set_trace_callback(None)
    _check_batches(statements, len(positions(store)), 50, slack=1)


def test_the_background_runner_catches_up_in_batches(
    opened_store: OpenedStore, writer: Writer, view_store: ViewStore
) -> None:
    head = _write_turns(writer, 100)
    statements: list[str] = []
    view_store.db.set_trace_callback(statements.append)
    runner = _started(opened_store, view_store, batch_size=50)
    runner.wait_until(head, timeout=WAIT)
    runner.stop()
    view_store.db.set_trace_callback(None)
    _check_batches(statements, len(positions(opened_store.store)), 50, slack=2)


def test_live_events_are_committed_without_waiting_for_a_full_batch(
    opened_store: OpenedStore, writer: Writer, view_store: ViewStore, views: Views
) -> None:
    runner = _started(opened_store, view_store, batch_size=10_000)
    sid = writer.start()
    position = writer.do(sid, lambda s: s.title("now")).position
    runner.wait_until(position, timeout=WAIT)
    assert views.title(sid) == "now"


def test_a_new_runner_on_the_same_view_file_resumes_from_its_tracked_position(
    opened_store: OpenedStore, writer: Writer, tmp_path: Path
) -> None:
    path = str(tmp_path / "views.db")
    sid = writer.start()
    usage = UsageData(prompt_tokens=10, completion_tokens=1)
    writer.turn(sid, "one", usage=usage)
    first_views = ViewStore(path)
    first = _started(opened_store, first_views, batch_size=3)
    first.wait_until(writer.turn(sid, "two", usage=usage).position, timeout=WAIT)
    first.stop()
    stopped_at = first.position
    first_views.close()

    writer.turn(sid, "three", usage=usage)  # while no runner runs
    views_store = ViewStore(path)
    second = ProjectionRunner(opened_store.store, views_store, default_projections())
    assert {s.position for s in second.states()} == {stopped_at}
    statements: list[str] = []
    views_store.db.set_trace_callback(statements.append)
    second.catch_up()
    views_store.db.set_trace_callback(None)
    inserted = [s for s in statements if s.startswith("INSERT OR REPLACE INTO messages")]
    assert len(inserted) == 2  # only turn three's messages were processed again
    views = Views(views_store)
    assert views.usage(sid) == UsageTotals(30, 3, 0.0, 3)  # nothing applied twice
    assert [m.text for m in views.messages(sid)] == ["one", "ok", "two", "ok", "three", "ok"]
    views_store.close()


def test_a_projection_added_later_catches_up_from_the_start(
    opened_store: OpenedStore, writer: Writer, view_store: ViewStore, views: Views
) -> None:
    sid = writer.start()
    writer.do(sid, lambda s: s.title("old title"))
    writer.turn(sid, "one", usage=UsageData(prompt_tokens=10, completion_tokens=1))
    writer.do(sid, lambda s: s.start_turn(text="two"))
    last = writer.step(sid, "b", usage=UsageData(prompt_tokens=20, completion_tokens=2))
    without_title = [p for p in default_projections() if p.name != "title"]
    ProjectionRunner(opened_store.store, view_store, without_title).catch_up()
    assert view_store.tracked("title") == 0
    assert view_store.tracked("usage") == last.position  # a step/end, the last event

    runner = _started(opened_store, view_store)
    runner.wait_until(opened_store.store.head_position(), timeout=WAIT)
    assert views.title(sid) == "old title"
    # The others did not re-apply anything, not even the event at their tracked position.
    assert views.usage(sid) == UsageTotals(30, 3, 0.0, 2)


def test_states_report_position_and_lag(writer: Writer, runner: ProjectionRunner,
                                        store: EventStore) -> None:
    sid = writer.start()
    writer.turn(sid, "one")
    runner.catch_up()
    head = store.head_position()
    later = writer.do(sid, lambda s: s.title("later")).position
    states = runner.states()
    assert [s.name for s in states] == [p.name for p in default_projections()]
    assert all((s.position, s.lag, s.fault) == (head, later - head, None) for s in states)


def test_projection_names_must_be_unique(store: EventStore, view_store: ViewStore) -> None:
    projections = default_projections()
    with pytest.raises(ValueError, match="unique"):
        ProjectionRunner(store, view_store, [*projections, projections[0]])


def test_unknown_wire_names_are_ignored_by_projections_and_passed_to_listeners(
    writer: Writer, runner: ProjectionRunner, store: EventStore, views: Views
) -> None:
    sid = writer.start()
    writer.turn(sid, "before")
    got: queue.Queue[RecordedEvent] = queue.Queue()
    runner.add_listener(got.put, ["x/unknown"])
    runner.start()
    stream = session_stream(sid)
    appended = store.append(stream, [NewRecord(uuid4(), "x/unknown", b'{"anything": [1, 2]}',
                                               b'{"schema_version": 3}')],
                            store.stream_version(stream))
    event = got.get(timeout=WAIT)
    assert event.position == appended.position
    assert isinstance(event.payload, OpaquePayload)
    assert event.payload == OpaquePayload("x/unknown", 3, {"anything": [1, 2]})

    after = writer.turn(sid, "after")  # the session still loads and writes
    runner.wait_until(after.position, timeout=WAIT)
    assert all(s.fault is None and s.lag == 0 for s in runner.states())
    assert [m.text for m in views.messages(sid)] == ["before", "ok", "after", "ok"]


_RESOLVE = textwrap.dedent("""
    import os, sys
    from uuid import UUID
    from terret import Actor, SessionRepository
    from terret.adapters.stores import open_store

    store = open_store(sys.argv[1])
    repo = SessionRepository(store)
    session = repo.get(UUID(sys.argv[2]))
    session.resolve_approval("c1", "approved", by=Actor(actor="operator", id=str(os.getpid())),
                             name="deploy", args={"env": "prod"})
    print(repo.save(session).position)
    store.close()
""")


def test_an_approval_appended_by_another_process_reaches_a_running_runners_listener(
    opened_store: OpenedStore, writer: Writer, runner: ProjectionRunner, views: Views
) -> None:
    if opened_store.uri is None:
        pytest.skip("this store cannot be opened by another process")
    sid = writer.start()

    def ask(s: Session) -> None:
        s.start_turn(text="deploy")
        s.start_step(MODEL)
        s.record_assistant("", [ToolCallData(id="c1", name="deploy",
                                             args={"env": "prod"})])
        s.request_approval("c1", "deploy", {"env": "prod"})

    runner.start()
    runner.wait_until(writer.do(sid, ask).position, timeout=WAIT)
    parked = views.status(sid)
    assert parked is not None and parked.status == "waiting_approval"

    got: queue.Queue[tuple[int, object, object, str]] = queue.Queue()

    def on_verdict(event: RecordedEvent) -> None:
        recorded = views.verdict_for(event.stream, "c1", "deploy", {"env": "prod"})
        state = views.status(event.stream)
        got.put((event.position, recorded and recorded.verdict, recorded and recorded.by,
                 state.status if state else "?"))

    runner.add_listener(on_verdict, ["approval/resolved"])
    thread = runner._thread
    done = subprocess.run([sys.executable, "-c", _RESOLVE, opened_store.uri, str(sid)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    position, verdict, by, state = got.get(timeout=WAIT)
    assert position == int(done.stdout.strip())
    assert verdict == "approved" and state == "running"
    assert isinstance(by, dict) and by == {"actor": "operator", "id": by["id"]}
    assert by["id"] != str(os.getpid())  # written by the other process
    assert runner._thread is thread  # the same runner, never restarted


def test_two_runners_sharing_one_view_file_apply_each_event_once(
    opened_store: OpenedStore, writer: Writer, tmp_path: Path
) -> None:
    """What two processes on one view file do: each batch re-reads the tracked positions in its
    write transaction and skips what the other already applied."""
    path = str(tmp_path / "shared-views.db")
    first_views, second_views = ViewStore(path), ViewStore(path)
    first = _started(opened_store, first_views, batch_size=4)
    second = _started(opened_store, second_views, batch_size=3)
    sid = writer.start()
    usage = UsageData(prompt_tokens=10, completion_tokens=1)
    for i in range(15):
        writer.turn(sid, f"q{i}", usage=usage)
    head = opened_store.store.head_position()
    first.wait_until(head, timeout=WAIT)
    second.wait_until(head, timeout=WAIT)
    for view_store in (first_views, second_views):
        views = Views(view_store)
        assert views.usage(sid) == UsageTotals(150, 15, 0.0, 15)
        assert len(views.messages(sid)) == 30
    assert all(first.verify(name) == [] for name in (p.name for p in first.projections))
    first.stop()
    second.stop()
    first_views.close()
    second_views.close()


@pytest.mark.parametrize("enabled", [True, False])
def test_the_collector_is_paused_per_batch_and_left_as_the_application_had_it(
    writer: Writer, store: EventStore, view_store: ViewStore, enabled: bool
) -> None:
    import gc

    head = _write_turns(writer, 20)
    runner = ProjectionRunner(store, view_store, default_projections(), batch_size=25)
    seen: list[bool] = []
    runner.add_listener(lambda event: seen.append(gc.isenabled()))
    was = gc.isenabled()
    try:
        gc.enable() if enabled else gc.disable()
        assert runner.catch_up() == head
        assert gc.isenabled() is enabled
    finally:
        gc.enable() if was else gc.disable()
    assert len(seen) == len(positions(store)) and not any(seen)  # inside a batch


def test_a_projection_added_later_replays_in_batches_while_the_others_sit_it_out(
    writer: Writer, store: EventStore, view_store: ViewStore
) -> None:
    sid = writer.start()
    for i in range(100):
        writer.turn(sid, f"q{i}", f"a{i}", usage=UsageData(prompt_tokens=2, completion_tokens=1))
    head = store.head_position()
    others = [p for p in default_projections() if p.name != "usage"]
    ProjectionRunner(store, view_store, others).catch_up()
    runner = ProjectionRunner(store, view_store, default_projections(), batch_size=50)
    statements: list[str] = []
    view_store.db.set_trace_callback(statements.append)
    assert runner.catch_up() == head
    view_store.db.set_trace_callback(None)
    assert not [s for s in statements if s.startswith("SAVEPOINT")]  # not the careful path
    writes = [s for s in statements if s.startswith("INSERT") and "tracking" not in s]
    assert writes and all("usage_" in s for s in writes)  # only the newcomer wrote rows
    assert {s.position for s in runner.states()} == {head}
    assert Views(view_store).usage(sid) == UsageTotals(200, 100, 0.0, 100)


def test_overlapping_pauses_of_the_collector_leave_it_as_it_was() -> None:
    import gc

    from terret.projections._collector import collector_paused

    was, interval = gc.isenabled(), sys.getswitchinterval()
    gc.enable()
    sys.setswitchinterval(1e-6)  # threads switch often: pauses overlap in every way
    try:
        start = threading.Barrier(4)

        def pause_often() -> None:
            start.wait()
            deadline = time.monotonic() + 0.5
            while time.monotonic() < deadline:
                with collector_paused():
                    sum(range(50))

        threads = [threading.Thread(target=pause_often) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert gc.isenabled()
        with collector_paused():
            with collector_paused():
                assert not gc.isenabled()
            assert not gc.isenabled()  # the outer pause still holds it
        assert gc.isenabled()
    finally:
        sys.setswitchinterval(interval)
        gc.enable() if was else gc.disable()
