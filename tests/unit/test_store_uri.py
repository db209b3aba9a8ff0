"""Store URIs: one masker for credentials (which shows no part of the user-info, also of a URI
it cannot parse), one parser shared by ``open_store`` and the CLI (a bad port refused when the
URI is parsed), and the EventStoreDB adapter's reading of deletion records."""

from __future__ import annotations

import json
import os
import re
import time
import traceback
from pathlib import Path
from uuid import uuid4

import pytest
from esdbclient import RecordedEvent
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from terret.adapters.stores.eventstoredb import DELETIONS_STREAM, EventStoreDBStore
from terret.adapters.stores.memory import MemoryStore
from terret.adapters.stores.sqlite import SQLiteStore
from terret.adapters.stores.uri import (
    DEFAULT_SQLITE_PATH,
    check_esdb_uri,
    mask_credentials,
    open_store,
    secret_uri,
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
        assert esdb_store.log.note_deletion(record) == "session-a"
        assert esdb_store.deleted_streams(refresh=False) == {"session-a"}
        assert esdb_store.log._deleted_revision == 3
    finally:
        esdb_store.close()


@pytest.mark.parametrize("data", [b"not json", b"[1, 2]", b'{"at": 1.0}'])
def test_note_deletion_ignores_a_malformed_record(
    esdb_store: EventStoreDBStore, data: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    try:
        assert esdb_store.log.note_deletion(_deletion(data, 4)) is None
        assert esdb_store.deleted_streams(refresh=False) == frozenset()
        assert esdb_store.log._deleted_revision == -1
        assert "malformed deletion record at 104" in caplog.text
    finally:
        esdb_store.close()


# --- no part of the user-info, whatever the URI -----------------------------------------------

# Passwords written without percent-encoding, holding each character that ends a part of a URI
# or starts one: the masker cannot know where they end, so it must hide as much as they might.
PASSWORDS = [
    "hunter2?x=SECRET",
    "hunter2?Tls=SECRET",
    "SECRET?",
    "SEC?RET=x",
    "SECRET#frag",
    "SEC#RET?x=y",
    "SEC/RET",
    "SEC/RET?x=y",
    "SEC@RET",
    "SEC@RET?x=y",
    "SEC:RET",
    "SEC=RET",
    "SEC=RET&x=y",
    "123?x=SECRET",
    "2113/SECRET",
    "2113#SECRET",
    "a?b@c/d#e=SECRET:f",
]
SHAPES = [
    "esdb://admin:{pw}@host:2113?Tls=false",
    "esdb://admin:{pw}@host:2113",
    "esdb://admin:{pw}@host",
    "esdb+discover://admin:{pw}@cluster.example:2113?Tls=true",
    "esdb://admin:{pw}@a:2113,b:2113,c:2113?Tls=true",
    "esdb://admin:{pw}@host:2113?Tls=true&TlsCaFile=/certs/ca@2024.pem",
    "esdb://admin:{pw}@host:2113/?Tls=false",
    "esdb:admin:{pw}@host:2113?Tls=false",
    "postgres://admin:{pw}@db:5432/x?sslmode=require",
]
MALFORMED = [(shape.format(pw=pw), pw) for shape in SHAPES for pw in PASSWORDS]


def _fragments(uri: str, password: str) -> list[str]:
    """The words of the user-info ("admin", "hunter2", "SECRET", "RET", ...) that the rest of
    the URI does not hold as well."""
    rest = uri.replace(f"admin:{password}", "")
    return [w for w in re.findall(r"[A-Za-z0-9]{3,}", f"admin:{password}") if w not in rest]


def _shown_by_every_reader(uri: str) -> str:
    """What each parser and adapter shows of ``uri``: the masked URI, the refusal (and its
    chain), or the store's description and repr."""
    shown = [mask_credentials(uri), repr(secret_uri(uri)), secret_uri(uri).scrub(f"at {uri}: x")]
    for parse in (store_kind, sqlite_path):
        try:
            parse(uri)
        except InvalidStoreURI as exc:
            shown.append(_chain_text(exc))
    try:
        store = open_store(uri)  # nothing connects before the first call
    except InvalidStoreURI as exc:
        shown.append(_chain_text(exc))
    else:
        try:
            shown += [store.describe(), repr(store)]
        finally:
            store.close()
    return "\n".join(shown)


def test_the_reported_uri_shows_no_part_of_its_password() -> None:
    uri = "esdb://admin:hunter2?x=SECRET@host:2113?Tls=false"
    assert mask_credentials(uri) == "esdb://***@host:2113?Tls=false"
    with pytest.raises(InvalidStoreURI) as caught:
        open_store(uri)
    assert str(caught.value) == (
        "invalid EventStoreDB URI 'esdb://***@host:2113?Tls=false': the user name or password "
        "contains '?', which esdbclient cannot parse; choose credentials without '@', '/', '?' "
        "or '#'"
    )


@pytest.mark.parametrize("uri, password", MALFORMED)
def test_no_reader_shows_any_part_of_a_malformed_user_info(uri: str, password: str) -> None:
    shown = _shown_by_every_reader(uri)
    assert "***@" in mask_credentials(uri)
    for word in _fragments(uri, password):
        assert word not in shown, f"{word!r} of {uri!r} shown in {shown!r}"


# Marker letters appear nowhere else in the generated URIs, nor in any message: one showing is
# a piece of the user-info showing.
MARKERS = "XZJKVWY"
_PIECES = ["Z", "JK", "VW", "XY", "2113", "7", "?", "@", "/", "#", "=", ":", "&", "%40", "+",
           "?X=", "?tls=", "=Z@", "/certs/", "host", ".", "-", "~"]
_CREDENTIAL = st.lists(st.sampled_from(_PIECES), min_size=1, max_size=8).map("".join) | st.text(
    alphabet=MARKERS + "0123456789?@/#=:&%+-._~", min_size=1, max_size=16
)
_HOSTS = st.sampled_from(["host", "host:2113", "a:2113,b:2113", "db.example.com:1113"])
_TAILS = st.sampled_from(
    ["", "/", "?tls=false", "?tls=true&tlsCaFile=/certs/a@b.pem", "/?tls=false", "#frag",
     "?connectionName=ops@team", "?tls=false&bogus=1"]
)


@settings(max_examples=300, deadline=None)
@given(
    scheme=st.sampled_from(["esdb://", "esdb+discover://", "esdb:", "postgres://"]),
    user=_CREDENTIAL,
    password=st.none() | _CREDENTIAL,
    hosts=_HOSTS,
    tail=_TAILS,
)
def test_no_reader_shows_a_marker_of_the_user_info(
    scheme: str, user: str, password: str | None, hosts: str, tail: str
) -> None:
    userinfo = user if password is None else f"{user}:{password}"
    assume(any(ch in MARKERS for ch in userinfo))
    uri = f"{scheme}{userinfo}@{hosts}{tail}"
    shown = _shown_by_every_reader(uri)
    assert not any(ch in MARKERS for ch in shown), (uri, shown)


@pytest.mark.parametrize(
    "uri, shown",
    [
        ("esdb://u:pw@host?Tls=true&TlsCaFile=/certs/a@b.pem",
         "esdb://***@host?Tls=true&TlsCaFile=/certs/a@b.pem"),
        ("esdb://host?Tls=false&TlsCaFile=/certs/a@b.pem",
         "esdb://host?Tls=false&TlsCaFile=/certs/a@b.pem"),
        ("esdb://host?Tls=false&x=a@b", "esdb://***@b"),  # an "@" no option explains
        ("esdb://u:1/x@host", "esdb://***@host"),
        ("esdb://host:notaport", "esdb://host:***"),  # a password, its "@host" forgotten?
        ("esdb://a:2113,b:99999?Tls=false", "esdb://a:2113,b:99999?Tls=false"),  # a number: shown
    ],
)
def test_what_the_masker_keeps(uri: str, shown: str) -> None:
    assert mask_credentials(uri) == shown


# --- ports ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "uri, host",
    [
        ("esdb://host:notaport?Tls=false", "host"),
        ("esdb://host:0?Tls=false", "host"),
        ("esdb://host:65536?Tls=false", "host"),
        ("esdb://host:-1?Tls=false", "host"),
        ("esdb://host:２１１３?Tls=false", "host"),  # digits, but not ASCII ones
        ("esdb://admin:changeit@host:21x3?Tls=true", "host"),
        ("esdb://a:2113,b:x,c:2113?Tls=false", "b"),
        ("esdb+discover://cluster:port?Tls=false", "cluster"),
    ],
)
def test_a_bad_port_is_refused_when_the_uri_is_parsed(uri: str, host: str) -> None:
    started = time.monotonic()
    for parse in (open_store, EventStoreDBStore, check_esdb_uri):
        with pytest.raises(InvalidStoreURI, match=f"the port of host '{host}' is not a number"):
            parse(uri)
    assert time.monotonic() - started < 2.0  # refused, not retried as an unreachable server


FORGOTTEN_HOST = "esdb://admin:hunter2?Tls=false"


def test_a_bad_port_without_credentials_is_not_shown() -> None:
    with pytest.raises(InvalidStoreURI) as caught:
        open_store(FORGOTTEN_HOST)
    assert "hunter2" not in _chain_text(caught.value)
    assert "esdb://admin:***?Tls=false" in str(caught.value)


@pytest.mark.parametrize(
    "uri", ["esdb://host:2113?Tls=false", "esdb://host:?Tls=false", "esdb://host?Tls=false",
            "esdb://a:1,b:65535?Tls=false", "esdb://u:p@host:2113?Tls=true"]
)
def test_good_ports_pass(uri: str) -> None:
    check_esdb_uri(uri)
