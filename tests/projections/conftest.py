"""Fixtures for the projection tests.

``store`` is the one place that says which event stores the projection suite runs on: add an
adapter to ``STORE_KINDS`` and ``_open`` and every test here runs against it too. Tests that need
another process to reach the same store ask for ``opened_store.uri`` (skipped when ``None``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from terret.adapters.stores import MemoryStore, SQLiteStore
from terret.domain.store import EventStore
from terret.projections import ProjectionRunner, Views, ViewStore, default_projections
from tests.projections.logs import Writer
from tests.support.esdb_emulator import EsdbEmulator

STORE_KINDS = ["memory", "sqlite", "esdb"]


@dataclass
class OpenedStore:
    kind: str
    store: EventStore
    uri: str | None
    """A URI another process can open with ``open_store``; None for a process-local store."""
    runners: list[ProjectionRunner] = field(default_factory=list)


def _open(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> OpenedStore:
    """Open a store of this kind (``request`` gives other fixtures, e.g. a server's URI)."""
    if kind == "memory":
        return OpenedStore(kind, MemoryStore(), None)
    if kind == "sqlite":
        path = tmp_path / "events.db"
        return OpenedStore(kind, SQLiteStore(path, synchronous="OFF"), str(path))
    if kind == "esdb":
        from terret.adapters.stores.eventstoredb import EventStoreDBStore

        # An emulator of the test's own, even when TERRET_ESDB_URI names a real server: these
        # tests replay the whole log from position 0 and count what they find, so they need a
        # log holding only their own events (the contract suite covers the real server).
        emulator = EsdbEmulator().start(host="127.0.0.1", port=0)
        request.addfinalizer(emulator.stop)
        return OpenedStore(kind, EventStoreDBStore(emulator.uri), emulator.uri)
    raise ValueError(kind)


@pytest.fixture(params=STORE_KINDS)
def opened_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[OpenedStore]:
    opened = _open(request.param, tmp_path, request)
    yield opened
    for runner in opened.runners:
        runner.stop()
    opened.store.close()


@pytest.fixture
def store(opened_store: OpenedStore) -> EventStore:
    return opened_store.store


@pytest.fixture
def writer(store: EventStore) -> Writer:
    return Writer(store)


@pytest.fixture
def view_store() -> Iterator[ViewStore]:
    views = ViewStore(":memory:")
    yield views
    views.close()


@pytest.fixture
def runner(opened_store: OpenedStore, view_store: ViewStore) -> ProjectionRunner:
    """A runner over the default projections, not started (tests call ``catch_up`` or
    ``start``; a started runner is stopped at teardown)."""
    built = ProjectionRunner(opened_store.store, view_store, default_projections())
    opened_store.runners.append(built)
    return built


@pytest.fixture
def views(view_store: ViewStore) -> Views:
    return Views(view_store)
