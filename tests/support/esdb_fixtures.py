"""Pytest fixtures for EventStoreDB-backed tests.

Register with ``pytest_plugins = ["tests.support.esdb_fixtures"]`` in tests/conftest.py.

* ``esdb_emulator`` (session): the in-process wire emulator on a free loopback port.
* ``esdb_uri`` (session): ``$TERRET_ESDB_URI`` when set (a real server; the emulator is then
  never started), else the emulator's URI.
* ``esdb_faults`` (function): the emulator, for fault-injection tests; skipped against a
  real server; pending faults are reset after each test.
* ``esdb_fresh_emulator`` (function): a new, empty emulator of the test's own (e.g. for
  benchmarks that need a known $all); skipped against a real server.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.support.esdb_emulator import EsdbEmulator

REAL_SERVER_ENV = "TERRET_ESDB_URI"


def real_server_uri() -> str | None:
    return os.environ.get(REAL_SERVER_ENV) or None


@pytest.fixture(scope="session")
def esdb_emulator() -> Iterator[EsdbEmulator]:
    with EsdbEmulator().start(host="127.0.0.1", port=0) as emulator:
        yield emulator


@pytest.fixture(scope="session")
def esdb_uri(request: pytest.FixtureRequest) -> str:
    uri = real_server_uri()
    if uri is not None:
        return uri
    emulator: EsdbEmulator = request.getfixturevalue("esdb_emulator")
    return emulator.uri


@pytest.fixture
def esdb_faults(request: pytest.FixtureRequest) -> Iterator[EsdbEmulator]:
    if real_server_uri() is not None:
        pytest.skip(f"fault injection needs the emulator ({REAL_SERVER_ENV} is set)")
    emulator: EsdbEmulator = request.getfixturevalue("esdb_emulator")
    emulator.reset_faults()
    yield emulator
    emulator.reset_faults()


@pytest.fixture
def esdb_fresh_emulator() -> Iterator[EsdbEmulator]:
    if real_server_uri() is not None:
        pytest.skip(f"needs a private emulator ({REAL_SERVER_ENV} is set)")
    with EsdbEmulator().start(host="127.0.0.1", port=0) as emulator:
        yield emulator
