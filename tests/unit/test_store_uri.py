"""Store URIs: one masker for credentials, one parser shared by ``open_store`` and the CLI, and
the EventStoreDB adapter's reading of deletion records."""

from __future__ import annotations

import json
import os
import traceback
from pathlib import Path
from uuid import uuid4

import pytest
from esdbclient import RecordedEvent

from terret.adapters.stores.eventstoredb import DELETIONS_STREAM, EventStoreDBStore
from terret.adapters.stores.memory import MemoryStore
from terret.adapters.stores.sqlite import SQLiteStore
from terret.adapters.stores.uri import (
    DEFAULT_SQLITE_PATH,
    mask_credentials,
    open_store,
    sqlite_path,
    store_kind,
)
from terret.domain.errors import InvalidStoreURI

# (uri, masked, fragments of the password that must never be shown)
LEAKY = [
    ("postgres://bob:s3cr/et@db:5432/x", "postgres://***@db:5432/x", ("s3cr", "/et", "et@")),
    ("esdb://admin:p@ss@host", "esdb://***@host", ("p@ss", "@ss", "ss@", "admin:p")),
    ("esdb:admin:s3cret@host", "esdb:***@host", ("s3cret", "admin")),  # "//" forgotten
]


def _chain_text(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc)) + repr(exc) + str(exc)


# --- masking ----------------------------------------------------------------------------------


@pytest.mark.parametrize("uri, masked, fragments", LEAKY)
def test_mask_credentials_hides_the_whole_password(
    uri: str, masked: str, fragments: tuple[str, ...]
) -> None:
    shown = mask_credentials(uri)
    assert shown == masked
    for fragment in fragments:
        assert fragment not in shown


@pytest.mark.parametrize("uri, masked, fragments", LEAKY)
def test_open_store_errors_hide_the_whole_password(
    uri: str, masked: str, fragments: tuple[str, ...]
) -> None:
    with pytest.raises(InvalidStoreURI) as caught:
        open_store(uri)
    text = _chain_text(caught.value)
    assert repr(masked) in str(caught.value)
    for fragment in fragments:
        assert fragment not in text, f"{fragment!r} leaked in {text!r}"


@pytest.mark.parametrize(
    "uri",
    ["terret.db", "/tmp/x.db", "sqlite:///tmp/x.db", "memory:", "esdb://localhost:2113"],
)
def test_mask_credentials_leaves_uris_without_credentials_alone(uri: str) -> None:
    assert mask_credentials(uri) == uri


# --- parsing ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "uri, kind, path",
    [
        ("sqlite://", "sqlite", DEFAULT_SQLITE_PATH),
        ("sqlite:///var/lib/terret.db", "sqlite", "/var/lib/terret.db"),
        ("sqlite://rel/t.db", "sqlite", "rel/t.db"),
        ("t.db", "sqlite", "t.db"),
        ("memory:", "memory", None),
        ("memory://", "memory", None),
        ("esdb://localhost:2113?Tls=false", "eventstoredb", None),
        ("esdb+discover://cluster.example", "eventstoredb", None),
    ],
)
def test_store_kind_and_sqlite_path(uri: str, kind: str, path: str | None) -> None:
    assert DEFAULT_SQLITE_PATH == "terret.db"
    assert store_kind(uri) == kind
    assert sqlite_path(uri) == path


@pytest.mark.parametrize(
    "uri", ["postgres://bob:s3cr/et@db:5432/x", "esdb:host:2113", "esdb+discover:cluster"]
)
def test_unsupported_uris_are_refused_by_every_parser(
    uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    for parse in (store_kind, sqlite_path, open_store):
        with pytest.raises(InvalidStoreURI, match="unsupported store URI"):
            parse(uri)
    assert os.listdir(tmp_path) == []  # "esdb+discover:cluster" is not a SQLite file


def test_bare_sqlite_uri_opens_the_default_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    store = open_store("sqlite://")
    try:
        assert isinstance(store, SQLiteStore)
    finally:
        store.close()
    assert (tmp_path / DEFAULT_SQLITE_PATH).exists()


def test_open_store_passes_retry_options_to_eventstoredb() -> None:
    store = open_store("esdb://localhost:2113?Tls=false", retry_timeout=0.3, call_timeout=0.2)
    try:
        assert isinstance(store, EventStoreDBStore)
        assert store.retry.timeout == 0.3
        assert store.retry.call_timeout == 0.2
    finally:
        store.close()
    default = open_store("esdb://localhost:2113?Tls=false")
    try:
        assert isinstance(default, EventStoreDBStore)
        assert (default.retry.timeout, default.retry.call_timeout) == (10.0, 5.0)
    finally:
        default.close()


def test_open_store_ignores_retry_options_for_embedded_stores() -> None:
    store = open_store("memory:", retry_timeout=0.3, call_timeout=0.2)
    try:
        assert isinstance(store, MemoryStore)
    finally:
        store.close()


# --- deletion records -------------------------------------------------------------------------


def _deletion(data: bytes, revision: int) -> RecordedEvent:
    return RecordedEvent(
        type="terret-stream-deleted",
        data=data,
        metadata=b"",
        content_type="application/json",
        id=uuid4(),
        stream_name=DELETIONS_STREAM,
        stream_position=revision,
        commit_position=100 + revision,
        prepare_position=100 + revision,
    )


@pytest.fixture
def esdb_store() -> EventStoreDBStore:
    return EventStoreDBStore("esdb://localhost:2113?Tls=false")  # no connection is made


def test_note_deletion_returns_the_stream_it_learnt(esdb_store: EventStoreDBStore) -> None:
    try:
        record = _deletion(json.dumps({"stream": "session-a", "at": 1.0}).encode(), 3)
        assert esdb_store.note_deletion(record) == "session-a"
        assert esdb_store.deleted_streams(refresh=False) == {"session-a"}
        assert esdb_store._deleted_revision == 3
    finally:
        esdb_store.close()


@pytest.mark.parametrize("data", [b"not json", b"[1, 2]", b'{"at": 1.0}'])
def test_note_deletion_ignores_a_malformed_record(
    esdb_store: EventStoreDBStore, data: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    try:
        assert esdb_store.note_deletion(_deletion(data, 4)) is None
        assert esdb_store.deleted_streams(refresh=False) == frozenset()
        assert esdb_store._deleted_revision == -1
        assert "malformed deletion record at 104" in caplog.text
    finally:
        esdb_store.close()
