"""Fixtures for the runtime suite: every test runs on the SQLite store and on the EventStoreDB
adapter. With ``TERRET_ESDB_URI`` set that is the real server (``esdb_uri`` from
``tests/support/esdb_fixtures.py``, registered by the root conftest); otherwise each test gets a
wire emulator of its own (it starts in ~25 ms), so that a runtime's subscription does not catch
up on every earlier test's events and ``serve_start`` finds only this test's sessions.

``opened.uri`` is what another process opens (``tests.runtime.kit.other_process``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from terret import (
    AgentDefinition,
    Reply,
    Runtime,
    RuntimeConfig,
    ScriptedProvider,
    StaticResolver,
    Tool,
)
from terret.adapters.stores import SQLiteStore
from terret.domain.store import EventStore
from tests.runtime.kit import Kit
from tests.support.esdb_emulator import EsdbEmulator
from tests.support.esdb_fixtures import real_server_uri

STORE_KINDS = ["sqlite", "esdb"]


@dataclass
class OpenedStore:
    kind: str
    uri: str
    store: EventStore


def _esdb_store(uri: str) -> EventStore:
    try:
        from terret.adapters.stores.eventstoredb import EventStoreDBStore
    except ImportError as exc:  # the adapter is optional until it lands
        pytest.skip(f"the EventStoreDB adapter cannot be imported: {exc}")
    return EventStoreDBStore(uri)


@pytest.fixture(params=STORE_KINDS)
def opened(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[OpenedStore]:
    if request.param == "sqlite":
        path = str(tmp_path / "events.db")
        result = OpenedStore("sqlite", path, SQLiteStore(path))
    elif real_server_uri() is not None:
        uri = request.getfixturevalue("esdb_uri")
        result = OpenedStore("esdb", uri, _esdb_store(uri))
    else:
        emulator = EsdbEmulator().start(host="127.0.0.1", port=0)
        request.addfinalizer(emulator.stop)
        result = OpenedStore("esdb", emulator.uri, _esdb_store(emulator.uri))
    yield result
    result.store.close()


@pytest.fixture
def store(opened: OpenedStore) -> EventStore:
    return opened.store


@pytest.fixture
def other_store(opened: OpenedStore) -> Iterator[EventStore]:
    """A second connection to the store under test (another process's, as it were). Request it
    before ``make_runtime`` so that the runtimes on it are closed before it is."""
    from terret.adapters.stores.uri import open_store

    second = open_store(opened.uri)
    yield second
    second.close()


@pytest.fixture
def kit() -> Kit:
    return Kit()


MakeRuntime = Callable[..., Runtime]


@pytest.fixture
def gates() -> Iterator[Callable[[], threading.Event]]:
    """Events that gate scripted replies; all released at teardown so nothing blocks."""
    made: list[threading.Event] = []

    def gate() -> threading.Event:
        event = threading.Event()
        made.append(event)
        return event

    yield gate
    for event in made:
        event.set()


@pytest.fixture
def make_runtime(store: EventStore, kit: Kit) -> Iterator[MakeRuntime]:
    """``make_runtime(provider_or_replies, tools=..., allow=..., config=..., start=True, **kw)``
    builds a started runtime on the store under test with one agent definition ("default");
    every runtime is closed at teardown."""
    made: list[Runtime] = []

    def make(
        provider: ScriptedProvider | Sequence[Reply] | None = None,
        *,
        tools: Sequence[Tool] | None = None,
        allow: Sequence[str] = ("*",),
        config: RuntimeConfig | None = None,
        definition: AgentDefinition | None = None,
        start: bool = True,
        on_store: EventStore | None = None,
        **kwargs: Any,
    ) -> Runtime:
        if provider is None:
            provider = ScriptedProvider(default=Reply(text="ok"))
        elif not isinstance(provider, ScriptedProvider):
            provider = ScriptedProvider(list(provider))
        definition = definition or AgentDefinition(
            tools=kit.tools if tools is None else tools, allow=allow)
        rt = Runtime(on_store or store, resolver=StaticResolver({"scripted": provider}),
                     agents=[definition], config=config, **kwargs)
        made.append(rt)
        return rt.start() if start else rt

    yield make
    kit.release.set()
    for rt in reversed(made):
        rt.close(grace=5.0)
