"""Fixtures for the emulator's own tests.

The fixtures are imported explicitly so that these tests run before tests/conftest.py
registers `tests.support.esdb_fixtures` as a plugin; once it does, drop the import.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest
from esdbclient import EventStoreDBClient

from tests.support.esdb_fixtures import (  # noqa: F401
    esdb_emulator,
    esdb_faults,
    esdb_fresh_emulator,
    esdb_uri,
)


@pytest.fixture
def client(esdb_uri: str) -> Iterator[EventStoreDBClient]:  # noqa: F811
    esdb_client = EventStoreDBClient(esdb_uri)
    yield esdb_client
    esdb_client.close()


@pytest.fixture
def stream_name() -> str:
    return f"emulator-test-{uuid.uuid4()}"


@pytest.fixture
def unique_type() -> Callable[[str], str]:
    """Event types unique to one test, so $all filters see only that test's events."""
    prefix = f"T{uuid.uuid4().hex[:12]}"
    return lambda name: f"{prefix}{name}"
