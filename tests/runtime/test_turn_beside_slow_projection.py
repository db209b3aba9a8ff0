"""A turn whose views wait on a slow projection (an application's own, or one added later
catching up over a long log). The turn reads its model context from the views, so it waits
for the runner — but a runner busy with a batch is progress, not a fault: ``wait_timeout``
counts only a runner that makes none. A slow custom projection once failed every turn
(``TimeoutError``, ``turn/end failed``). On SQLite and the EventStoreDB emulator."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator

import pytest

import terret
from terret import RecordedEvent, RuntimeConfig
from terret.projections import Projection
from terret.projections.registry import unregister_projection
from tests.runtime.conftest import MakeRuntime
from tests.runtime.kit import read_log

SECONDS = 2.5


class SlowProjection(Projection):
    """Takes ``SECONDS`` on each user message (an index rebuilt, a remote call)."""

    name = "acme.slow"
    handles = frozenset({"user/message"})
    tables = ("acme_slow",)
    schema = "CREATE TABLE IF NOT EXISTS acme_slow (session TEXT, seq INTEGER)"

    def process(self, db: sqlite3.Connection, event: RecordedEvent) -> None:
        time.sleep(SECONDS)
        db.execute("INSERT INTO acme_slow VALUES (?, ?)", (event.stream, event.seq))


@pytest.fixture
def slow() -> Iterator[None]:
    terret.register_projection(SlowProjection)
    yield
    unregister_projection(SlowProjection.name)


@pytest.mark.timeout(120)
def test_a_turn_waits_for_a_slow_projection_longer_than_wait_timeout(
        slow: None, make_runtime: MakeRuntime, store) -> None:
    rt = make_runtime(config=RuntimeConfig(wait_timeout=1.0))
    sid = rt.create_session()
    started = time.monotonic()
    assert rt.run_turn(sid, "hello").status == "completed"
    assert time.monotonic() - started >= SECONDS
    assert [e.data["status"] for e in read_log(store, sid) if e.name == "turn/end"] == [
        "completed"]
    with rt.view_store.reading() as db:
        assert db.execute("SELECT count(*) FROM acme_slow").fetchone()[0] == 1

