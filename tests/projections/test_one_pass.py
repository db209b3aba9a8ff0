"""Rebuild, verify and doctor read the log once for all projections (issue 15), not once per
projection: counted as pages of ``read_all`` over the log, on every store, and through the CLI
on SQLite."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from terret.adapters.stores.sqlite import SQLiteStore
from terret.cli import cli
from terret.domain.events import UsageData
from terret.domain.store import EventStore, StoredRecord
from terret.projections import ProjectionRunner, Views, ViewStore, default_projections
from tests.projections.logs import Writer

BATCH = 50


class Pages:
    """Counts the pages a store's ``read_all`` hands out from position 0 on (each pass over the
    log starts there)."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    def wrap(self, read_all: Any) -> Any:
        def counted(**kwargs: Any) -> list[StoredRecord]:
            found: list[StoredRecord] = read_all(**kwargs)
            self.calls.append((kwargs.get("after", 0), len(found)))
            return found

        return counted

    @property
    def passes(self) -> int:
        return sum(1 for after, _ in self.calls if after == 0)


def _log(writer: Writer, turns: int = 40) -> int:
    sid = writer.start()
    other = writer.start()
    for i in range(turns):
        writer.turn(sid if i % 2 else other, f"q{i}", f"a{i}",
                    usage=UsageData(prompt_tokens=1, completion_tokens=1))
    writer.do(sid, lambda s: s.title("one pass"))
    return writer.store.head_position()


def _counted(store: EventStore, monkeypatch: pytest.MonkeyPatch) -> Pages:
    pages = Pages()
    monkeypatch.setattr(store, "read_all", pages.wrap(store.read_all))
    return pages


def test_rebuild_all_reads_the_log_once_for_every_projection(
    writer: Writer, store: EventStore, view_store: ViewStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    head = _log(writer)
    runner = ProjectionRunner(store, view_store, default_projections(), batch_size=BATCH)
    runner.catch_up()
    before = {p.name: p.dump(view_store.db) for p in runner.projections}
    pages = _counted(store, monkeypatch)
    progress: list[tuple[int, int]] = []
    assert runner.rebuild_all(progress=lambda at, of: progress.append((at, of))) == head
    assert pages.passes == 1
    records = sum(count for _, count in pages.calls)
    assert records <= head  # every event read once (positions may have gaps)
    assert len(pages.calls) <= math.ceil(records / runner.replay_batch_size) + 1
    assert progress[-1][0] <= head and all(of == head for _, of in progress)
    assert {p.name: p.dump(view_store.db) for p in runner.projections} == before
    assert all(s.position == head and s.fault is None for s in runner.states())


def test_verify_all_reads_the_log_once_and_finds_each_difference(
    writer: Writer, store: EventStore, view_store: ViewStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    _log(writer)
    runner = ProjectionRunner(store, view_store, default_projections(), batch_size=BATCH)
    runner.catch_up()
    with view_store.transaction() as db:
        db.execute("UPDATE titles SET title = 'tampered'")
    pages = _counted(store, monkeypatch)
    report = runner.verify_all()
    assert pages.passes == 1
    assert set(report) == {p.name for p in runner.projections}
    assert [name for name, diffs in report.items() if diffs] == ["title"]
    assert report["title"] == runner.verify("title")


def test_verify_all_stops_each_projection_at_its_own_position(
    writer: Writer, store: EventStore, view_store: ViewStore
) -> None:
    from terret.projections.title import TitleProjection

    sid = writer.start()
    writer.do(sid, lambda s: s.title("first"))
    early = ProjectionRunner(store, view_store, [TitleProjection()])
    early.catch_up()  # the title view stops here
    writer.do(sid, lambda s: s.title("second"))
    runner = ProjectionRunner(store, view_store, default_projections())
    for p in runner.projections:
        if p.name != "title":
            runner.rebuild(p.name)
    assert Views(view_store).title(sid) == "first"
    assert all(diffs == [] for diffs in runner.verify_all().values())


def test_the_cli_rebuilds_verifies_and_doctors_in_one_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "terret.db"
    store = SQLiteStore(path)
    head = _log(Writer(store))
    store.close()
    pages = Pages()
    real = SQLiteStore.read_all

    def counted(self: SQLiteStore, **kwargs: Any) -> list[StoredRecord]:
        return pages.wrap(lambda **kw: real(self, **kw))(**kwargs)  # type: ignore[no-any-return]

    monkeypatch.setattr(SQLiteStore, "read_all", counted)
    base = ["--store", str(path), "--views", str(tmp_path / "views.db")]
    for command in (["projections", "rebuild"], ["projections", "verify"], ["doctor"]):
        before = pages.passes
        done = CliRunner().invoke(cli, [*base, *command], catch_exceptions=False)
        assert done.exit_code == 0, done.output
        passes = pages.passes - before
        # rebuild: its own pass (the views were new: nothing else reads from 0); verify and
        # doctor: one pass each (their catch-up reads from the views' position on)
        assert passes == 1, (command, pages.calls)
    assert f"rebuilt up to {head}" in CliRunner().invoke(
        cli, [*base, "projections", "rebuild", "title"]).output


def test_a_rebuild_frees_each_decoded_event_once_applied(
    writer: Writer, store: EventStore, view_store: ViewStore
) -> None:
    """A replay has no listeners: a page's decoded events are not held until its end (holding
    them cost a twentieth of a rebuild), while the live runner keeps them for its listeners."""
    import gc

    from terret.domain.codec import RecordedEvent
    from terret.projections.title import TitleProjection

    alive: list[int] = []

    class Counting(TitleProjection):
        def flush(self, db: Any) -> None:
            alive.append(sum(1 for o in gc.get_objects() if type(o) is RecordedEvent))
            super().flush(db)

    _log(writer)
    events = len(store.read_all(after=0, limit=10_000))
    gc.collect()  # what earlier tests left as garbage is not what the rebuild holds
    runner = ProjectionRunner(store, view_store, [Counting()], batch_size=BATCH)
    assert runner.replay_batch_size >= events  # one page: the whole log
    runner.rebuild_all()
    assert max(alive) <= 2, alive
    alive.clear()
    runner.rebuild("title")
    assert max(alive) <= 2, alive
    alive.clear()
    live = ProjectionRunner(store, view_store, [Counting()], batch_size=events)
    writer.do(writer.start(), lambda s: s.title("later"))
    live.catch_up()
    assert max(alive) >= 2  # the live runner's batch keeps its events for the listeners
