"""Replay: ``rebuild`` drops one view and its tracked position and replays from 0; ``verify``
rebuilds into a scratch view and lists every difference from the live one."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from terret import Actor, Session
from terret.domain.codec import RecordedEvent
from terret.domain.events import ToolCallData, UsageData
from terret.domain.store import EventStore
from terret.projections import ProjectionRunner, UsageTotals, Views, ViewStore, default_projections
from tests.projections.conftest import OpenedStore
from tests.projections.logs import MODEL, Writer

WAIT = 10.0
NAMES = [p.name for p in default_projections()]


def _history(writer: Writer) -> list[UUID]:
    """A few sessions touching every read model."""
    a, b = writer.start(agent="coder"), writer.start(agent="ops")
    writer.turn(a, "hello", usage=UsageData(prompt_tokens=10, completion_tokens=2, cost=0.1))
    writer.do(a, lambda s: s.title("Greeting", automatic=True))
    writer.do(a, lambda s: s.update_policy(["fs.*"]))
    writer.do(a, lambda s: s.set_model("compactor", MODEL))
    mark = writer.repo.get(a).version
    writer.do(a, lambda s: s.compact("they said hello", mark=mark))

    def park(s: Session) -> None:
        s.start_turn(text="deploy")
        s.start_step(MODEL)
        s.record_assistant("", [ToolCallData(id="c", name="deploy", args={"env": "prod"}),
                                ToolCallData(id="d", name="ls", args={})])
        s.record_tool_result("d", "ls", "a b")
        s.request_approval("c", "deploy", {"env": "prod"})

    writer.do(b, park)
    writer.do(b, lambda s: s.queue("when you can", wake=True))
    writer.do(a, lambda s: s.close(by=Actor(actor="user")))
    return [a, b]


@pytest.mark.parametrize("name", NAMES)
def test_a_rebuild_equals_the_live_view(name: str, writer: Writer, runner: ProjectionRunner,
                                        view_store: ViewStore) -> None:
    runner.start()
    _history(writer)
    runner.wait_until(writer.store.head_position(), timeout=WAIT)
    runner.stop()
    projection = runner.projection(name)
    live = projection.dump(view_store.db)
    assert any(live.values()), "the history should give every view some rows"
    assert runner.verify(name) == []
    assert runner.rebuild(name) == writer.store.head_position()
    assert projection.dump(view_store.db) == live
    assert view_store.tracked(name) == writer.store.head_position()


def test_verify_reports_a_tampered_row_and_rebuild_repairs_it(
    writer: Writer, runner: ProjectionRunner, view_store: ViewStore, views: Views
) -> None:
    a, _ = _history(writer)
    runner.catch_up()
    view_store.db.execute("UPDATE titles SET title = 'tampered'")
    view_store.db.execute("DELETE FROM usage_turns")
    assert views.title(a) == "tampered"

    title_diff = runner.verify("title")
    assert title_diff == [
        f"title.titles: live has ('session-{a}', 'tampered'), rebuild does not",
        f"title.titles: rebuild has ('session-{a}', 'Greeting'), live does not",
    ]
    usage_diff = runner.verify("usage")
    assert usage_diff and all(d.startswith("usage.usage_turns: rebuild has") for d in usage_diff)
    assert runner.verify("messages") == []

    progress: list[tuple[int, int]] = []
    runner.rebuild("title", progress=lambda done, total: progress.append((done, total)))
    head = writer.store.head_position()
    assert progress and progress[-1] == (head, head)
    assert views.title(a) == "Greeting"
    assert runner.verify("title") == []
    runner.rebuild("usage")
    assert views.usage(a) == UsageTotals(10, 2, 0.1, 1)


def test_verify_compares_at_the_live_views_own_position(
    writer: Writer, runner: ProjectionRunner, store: EventStore
) -> None:
    _, b = _history(writer)
    runner.catch_up()
    writer.do(b, lambda s: s.title("after the catch-up"))  # not processed yet
    assert runner.verify("title") == []
    assert runner.verify("sessions") == []


def test_a_rebuild_while_the_runner_runs_applies_nothing_twice(
    opened_store: OpenedStore, writer: Writer, runner: ProjectionRunner, views: Views
) -> None:
    sid = writer.start()
    usage = UsageData(prompt_tokens=10, completion_tokens=1)
    runner.start()
    for i in range(5):
        writer.turn(sid, f"q{i}", usage=usage)
    runner.wait_until(opened_store.store.head_position(), timeout=WAIT)
    runner.rebuild("usage")
    runner.rebuild("messages")
    last = writer.turn(sid, "after", usage=usage)
    runner.wait_until(last.position, timeout=WAIT)
    assert views.usage(sid) == UsageTotals(60, 6, 0.0, 6)
    assert len(views.messages(sid)) == 12
    assert all(runner.verify(name) == [] for name in NAMES)


def test_replay_of_an_unknown_projection_is_refused(runner: ProjectionRunner) -> None:
    with pytest.raises(KeyError, match="no projection named 'nope'"):
        runner.rebuild("nope")
    with pytest.raises(KeyError, match="known: messages, usage"):
        runner.verify("nope")


def test_a_fresh_view_store_replaying_everything_equals_the_live_one(
    writer: Writer, runner: ProjectionRunner, view_store: ViewStore, store: EventStore
) -> None:
    runner.start()
    _history(writer)
    runner.wait_until(store.head_position(), timeout=WAIT)
    fresh_views = ViewStore(":memory:")
    fresh = default_projections()
    ProjectionRunner(store, fresh_views, fresh, batch_size=7).catch_up()
    for live, rebuilt in zip(runner.projections, fresh, strict=True):
        assert live.dump(view_store.db) == rebuilt.dump(fresh_views.db), live.name
    fresh_views.close()


def test_a_view_written_by_another_version_of_its_projection_is_rebuilt_on_open(
        tmp_path: Path) -> None:
    """Views are a cache of the log: when a projection's layout changes (its ``version``), a
    view file written by the old one is dropped and replayed from position 0, not misread."""
    from terret.adapters.stores.memory import MemoryStore
    from terret.domain import SessionRepository
    from terret.projections.messages import MessagesProjection

    store = MemoryStore()
    session = Session.start()
    session.start_turn(text="hello")
    SessionRepository(store).save(session)
    path = str(tmp_path / "views.db")

    class OldMessages(MessagesProjection):
        version = 1

        def process(self, db: sqlite3.Connection, event: RecordedEvent) -> None:
            db.execute("INSERT INTO messages VALUES (?, ?, ?, ?)",
                       (event.stream, event.seq, "user/message", b"not the new layout"))

    old = ViewStore(path)
    ProjectionRunner(store, old, [OldMessages()]).catch_up()
    old.close()

    views = ViewStore(path)
    runner = ProjectionRunner(store, views, [MessagesProjection()])
    assert views.tracked("messages") == 0  # dropped: it replays from the start
    runner.catch_up()
    assert [m.text for m in Views(views).messages(session.id)] == ["hello"]
    views.close()


class _Said:
    """A custom projection of what users said; version 2 keeps it upper-cased."""

    @staticmethod
    def make(version: int) -> Any:
        from terret.projections import Projection

        class Said(Projection):
            name = "acme.said"
            handles = frozenset({"user/message"})
            tables = ("acme_said",)
            schema = ("CREATE TABLE IF NOT EXISTS acme_said (stream TEXT, seq INTEGER, "
                      "text TEXT, PRIMARY KEY (stream, seq))")

            def process(self, db: sqlite3.Connection, event: RecordedEvent) -> None:
                text = event.payload.text  # type: ignore[union-attr]
                db.execute("INSERT INTO acme_said VALUES (?, ?, ?)",
                           (event.stream, event.seq, text.upper() if version == 2 else text))

        Said.version = version
        return Said()


def test_a_process_on_another_version_of_a_projection_leaves_its_view_alone(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A rolling deploy: release 1 keeps running while release 2, which re-versioned the
    projection, opens the shared views file. Release 1 went on writing its rows into release
    2's view (`verify` then found rows of both meanings); now it leaves the view to release 2,
    saying so once, and the view is what a rebuild by release 2 gives."""
    from terret.adapters.stores.memory import MemoryStore
    from terret.domain import SessionRepository

    store = MemoryStore()
    repo = SessionRepository(store)

    def said(text: str) -> None:
        session = Session.start()
        session.start_turn(text=text)
        repo.save(session)

    path = str(tmp_path / "views.db")
    said("a")
    old_views = ViewStore(path)
    old = ProjectionRunner(store, old_views, [_Said.make(1)])
    old.catch_up()
    new_views = ViewStore(path)  # release 2 opens the file: its view replays from 0
    new = ProjectionRunner(store, new_views, [_Said.make(2)])
    said("b")
    with caplog.at_level("WARNING", logger="terret.projections"):
        old.catch_up()  # release 1 comes first to the new event
        old.catch_up()
    new.catch_up()

    rows = sorted(r[2] for r in new_views.db.execute("SELECT * FROM acme_said"))
    assert rows == ["A", "B"]
    assert new.verify("acme.said") == []
    warned = [r for r in caplog.records if "holds version 2" in r.getMessage()]
    assert len(warned) == 1
    old_views.close()
    new_views.close()


def test_an_old_release_opening_the_file_never_downgrades_a_newer_view(tmp_path: Path) -> None:
    """A command of the old release (`doctor`, `verify`) opened beside the new workers: it
    re-versioned the view back, the new workers stopped maintaining it, and the old ones had
    stopped already — nobody did. Now the newer view stays as it is, and the old release's
    rebuild or verify of it is refused rather than empty it and replay nothing."""
    from terret.adapters.stores.memory import MemoryStore
    from terret.domain import SessionRepository
    from terret.domain.errors import ViewsMismatch

    store = MemoryStore()
    repo = SessionRepository(store)

    def said(text: str) -> None:
        session = Session.start()
        session.start_turn(text=text)
        repo.save(session)

    path = str(tmp_path / "views.db")
    said("a")
    new_views = ViewStore(path)
    new = ProjectionRunner(store, new_views, [_Said.make(2)])
    new.catch_up()
    old_views = ViewStore(path)  # the old release's command opens the file
    old = ProjectionRunner(store, old_views, [_Said.make(1)])
    with pytest.raises(ViewsMismatch, match="holds version 2"):
        old.rebuild("acme.said")
    with pytest.raises(ViewsMismatch, match="holds version 2"):
        old.verify("acme.said")
    said("b")
    old.catch_up()
    new.catch_up()
    rows = sorted(r[2] for r in new_views.db.execute("SELECT * FROM acme_said"))
    assert rows == ["A", "B"]
    assert new.verify("acme.said") == []
    old_views.close()
    new_views.close()
