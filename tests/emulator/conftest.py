"""Fixtures for the emulator's own tests.

`esdb_uri`, `esdb_faults` and `esdb_fresh_emulator` come from `tests.support.esdb_fixtures`,
registered as a plugin by tests/conftest.py.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest
from esdbclient import EventStoreDBClient


@pytest.fixture
def client(esdb_uri: str) -> Iterator[EventStoreDBClient]:
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
