"""The CLI parses store URIs as ``open_store`` does: a bare ``sqlite://`` is ``terret.db``, the
store timeout reaches EventStoreDB through ``open_store``, passwords never show."""

from __future__ import annotations

import os
from pathlib import Path
from uuid import uuid4

import pytest

from terret.adapters.stores.eventstoredb import EventStoreDBStore
from terret.adapters.stores.uri import open_store
from terret.cli._context import CliContext, default_views_path
from terret.domain.errors import SessionNotFound, StoreUnavailable
from terret.domain.repository import SessionRepository
from terret.domain.session import Session
from terret.runtime.writer import SessionWriter
from tests.cli.conftest import invoke_cli, one_line_error


def test_bare_sqlite_uri_is_the_default_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    result = invoke_cli("--store", "sqlite://", "sessions", "list")
    assert result.exit_code == 1, result.stderr
    line = one_line_error(result.stderr)
    assert "no store at terret.db " in line
    assert os.listdir(tmp_path) == []

    store = open_store("terret.db")
    try:
        session = Session.start(agent="demo", roles={"main": "demo:ops-model-1"})
        SessionWriter(SessionRepository(store)).create(session)
    finally:
        store.close()
    result = invoke_cli("--store", "sqlite://", "--json", "sessions", "list")
    assert result.exit_code == 0, result.stderr
    assert str(session.id) in result.stdout
    assert (tmp_path / "terret.views.db").exists()


@pytest.mark.parametrize(
    "uri, views",
    [
        ("sqlite://", "terret.views.db"),
        ("sqlite:///srv/t.db", "/srv/t.views.db"),
        ("t.db", "t.views.db"),
        ("memory:", ":memory:"),
        ("esdb://localhost:2113?Tls=false", "terret-views.db"),
    ],
)
def test_default_views_path(uri: str, views: str) -> None:
    assert default_views_path(uri) == views


def test_store_timeout_reaches_eventstoredb() -> None:
    ctx = CliContext("esdb://localhost:2113?Tls=false", None, False, store_timeout=2.0)
    try:
        store = ctx.store()
        assert isinstance(store, EventStoreDBStore)
        assert (store.retry.timeout, store.retry.call_timeout) == (2.0, 2.0)
    finally:
        ctx.close()
    ctx = CliContext("esdb://localhost:2113?Tls=false", None, False, store_timeout=30.0)
    try:
        store = ctx.store()
        assert isinstance(store, EventStoreDBStore)
        assert (store.retry.timeout, store.retry.call_timeout) == (30.0, 5.0)
    finally:
        ctx.close()


def test_missing_file_is_reported_before_opening(tmp_path: Path) -> None:
    ctx = CliContext(f"sqlite://{tmp_path}/gone.db", None, False)
    try:
        with pytest.raises(StoreUnavailable, match=f"no store at {tmp_path}/gone.db "):
            ctx.store()
    finally:
        ctx.close()
    assert os.listdir(tmp_path) == []


def test_require_session(tmp_path: Path) -> None:
    ctx = CliContext(str(tmp_path / "t.db"), None, False)
    try:
        session_id = ctx.commands(create=True).create(agent="demo",
                                                      roles={"main": "demo:ops-model-1"})
        ctx.require_session(session_id)
        missing = uuid4()
        with pytest.raises(SessionNotFound, match=f"no session {missing} in "):
            ctx.require_session(missing)
    finally:
        ctx.close()


@pytest.mark.parametrize(
    "uri, masked, fragments",
    [
        ("postgres://bob:s3cr/et@db:5432/x", "postgres://***@db:5432/x", ("s3cr", "/et", "et@")),
        ("esdb://admin:p@ss@host", "esdb://***@host", ("p@ss", "@ss", "ss@", "admin:p")),
    ],
)
def test_passwords_never_shown(uri: str, masked: str, fragments: tuple[str, ...]) -> None:
    result = invoke_cli("--store", uri, "sessions", "list")
    assert result.exit_code == 2, result.stderr
    line = one_line_error(result.stderr)
    assert "--store" in line and masked in line
    assert CliContext(uri, None, False).masked_uri == masked
    for fragment in fragments:
        assert fragment not in result.stdout + result.stderr
