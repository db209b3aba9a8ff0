"""Connecting the EventStoreDB adapter: URIs (single node, several hosts, discovery, TLS
options), credentials that never leak into descriptions, logs or errors, and the idle
checkpoint that must never pass an event still on its way."""

from __future__ import annotations

import logging
import pickle
import socket
import threading
import time
import traceback
from collections.abc import Iterator

import pytest

from terret.adapters.stores.eventstoredb import EventStoreDBStore
from terret.adapters.stores.uri import mask_credentials, open_store
from terret.domain.errors import InvalidStoreURI, StoreUnavailable
from terret.domain.store import Checkpoint, StoredRecord, StreamState
from terret.testing.store_contract import NOISE, SIGNAL, Collector, new_stream, record, records
from tests.support.esdb_emulator import EsdbEmulator
from tests.support.esdb_fixtures import real_server_uri

USER = "terret-admin"
PASSWORD = "s3cr3t-pass:word"  # ":" inside: the password is everything after the first ":"
SECRETS = (USER, PASSWORD, "s3cr3t", "pass:word")


def _assert_no_secret(text: str) -> None:
    for secret in SECRETS:
        assert secret not in text, f"{secret!r} leaked in {text!r}"


def _chain_text(exc: BaseException) -> str:
    """Everything a logger or a traceback would show of ``exc``, chained exceptions included."""
    return "".join(traceback.format_exception(exc)) + repr(exc)


@pytest.fixture
def dead_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def emulator(request: pytest.FixtureRequest) -> EsdbEmulator:
    """The emulator, for cases that need its cluster and discovery URIs."""
    if real_server_uri() is not None:
        pytest.skip("needs the emulator's cluster URIs (TERRET_ESDB_URI is set)")
    emulator: EsdbEmulator = request.getfixturevalue("esdb_emulator")
    return emulator


# --- URIs ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "uri, shown",
    [
        ("esdb://localhost:2113?Tls=false", "esdb://localhost:2113?Tls=false"),
        (
            "esdb://admin:changeit@db.example:2113?Tls=true",
            "esdb://***@db.example:2113?Tls=true",
        ),
        (
            "esdb+discover://admin:changeit@cluster.example?Tls=true",
            "esdb+discover://***@cluster.example?Tls=true",
        ),
        (
            "esdb://u:pass-word@a:2113,b:2113,c:2113?Tls=true",
            "esdb://***@a:2113,b:2113,c:2113?Tls=true",
        ),
    ],
)
def test_describe_and_repr_mask_credentials(uri: str, shown: str) -> None:
    assert mask_credentials(uri) == shown
    store = EventStoreDBStore(uri)  # no connection is made before the first call
    try:
        assert store.describe() == f"eventstoredb {shown}"
        assert repr(store) == f"EventStoreDBStore({shown!r})"
        assert "changeit" not in repr(vars(store))
    finally:
        store.close()


@pytest.mark.parametrize(
    "uri, shown",
    [
        ("esdb://u:a/b?c@host:2113?Tls=true", "esdb://***@host:2113?Tls=true"),
        ("esdb://u:p@ss@a:2113,b:2113?Tls=true", "esdb://***@a:2113,b:2113?Tls=true"),
        (
            "esdb://u:pw@host?Tls=true&TlsCaFile=/certs/a@b.pem",
            "esdb://***@host?Tls=true&TlsCaFile=/certs/a@b.pem",
        ),
        (
            "esdb://host?Tls=false&TlsCaFile=/certs/a@b.pem",
            "esdb://host?Tls=false&TlsCaFile=/certs/a@b.pem",
        ),
    ],
)
def test_masking_survives_unencoded_characters(uri: str, shown: str) -> None:
    assert mask_credentials(uri) == shown


@pytest.mark.parametrize(
    "uri, reason",
    [
        (f"http://{USER}:{PASSWORD}@localhost:2113", "scheme"),
        (f"esdb+discover://{USER}:{PASSWORD}@a:2113,b:2113?Tls=true", "More than one target"),
        (f"esdb://{USER}:{PASSWORD}@localhost:2113?Tls=true&Bogus=1", "Unknown field"),
        ("esdb://localhost:2113?Tls=true", "Username and password are required"),
        (f"esdb://{USER}:s3cr3t@pass:word@localhost:2113?Tls=false", "contains '@'"),
        (f"esdb://{USER}:s3cr3t/pass:word@localhost:2113?Tls=true", "contains '/'"),
        (
            f"esdb://{USER}:{PASSWORD}@localhost:2113?Tls=true&TlsCaFile=/no/such/ca.pem",
            "TlsCaFile",
        ),
    ],
)
def test_invalid_uris_are_refused_at_once_without_credentials(uri: str, reason: str) -> None:
    with pytest.raises(InvalidStoreURI) as info:
        EventStoreDBStore(uri)
    assert reason in str(info.value)
    _assert_no_secret(_chain_text(info.value))


def test_open_store_accepts_both_schemes(emulator: EsdbEmulator) -> None:
    for uri in (emulator.uri, emulator.discover_uri, emulator.cluster_uri):
        store = open_store(uri)
        try:
            stream = new_stream()
            assert store.append(stream, records(1), StreamState.NO_STREAM).version == 1
            assert [r.seq for r in store.read_stream(stream)] == [1]
        finally:
            store.close()


def test_tls_uri_with_a_ca_file_is_accepted(tmp_path: object) -> None:
    from pathlib import Path

    ca = Path(str(tmp_path)) / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n")
    store = EventStoreDBStore(f"esdb://{USER}:{PASSWORD}@localhost:2113?Tls=true&TlsCaFile={ca}")
    try:
        assert store.describe() == f"eventstoredb esdb://***@localhost:2113?Tls=true&TlsCaFile={ca}"
    finally:
        store.close()


def test_the_store_can_be_opened_in_another_process_by_a_picklable_opener(
    esdb_uri: str,
) -> None:
    import functools

    opener = pickle.loads(pickle.dumps(functools.partial(EventStoreDBStore, esdb_uri)))
    store = opener()
    try:
        assert store.stream_version(new_stream()) == 0
    finally:
        store.close()


# --- credentials in failures -----------------------------------------------------------------


def test_credentials_never_appear_in_errors_or_logs(
    dead_port: int, caplog: pytest.LogCaptureFixture
) -> None:
    uri = f"esdb://{USER}:{PASSWORD}@127.0.0.1:{dead_port}?Tls=false"
    caplog.set_level(logging.DEBUG)
    store = EventStoreDBStore(uri, retry_timeout=0.5, call_timeout=0.3)
    try:
        failures: list[BaseException] = []
        for operation in (
            lambda: store.append(new_stream(), records(1), StreamState.NO_STREAM),
            lambda: store.read_stream(new_stream()),
            store.head_position,
            lambda: store.read_all(),
            lambda: store.write_snapshot(new_stream(), 1, b"s"),
            lambda: store.delete_stream(new_stream()),
        ):
            with pytest.raises(StoreUnavailable) as info:
                operation()
            failures.append(info.value)
        sub = store.subscribe(after=0)
        with pytest.raises(StoreUnavailable) as info:
            next(sub)
        failures.append(info.value)
        for failure in failures:
            text = _chain_text(failure)
            _assert_no_secret(text)
            assert "***@127.0.0.1" in str(failure)
            assert failure.__cause__ is None and failure.__context__ is None
        assert caplog.records, "retries are logged"
        for entry in caplog.records:
            _assert_no_secret(entry.getMessage())
    finally:
        store.close()


def test_credentials_never_appear_for_a_cluster_uri(
    dead_port: int, caplog: pytest.LogCaptureFixture
) -> None:
    uri = (
        f"esdb://{USER}:{PASSWORD}@127.0.0.1:{dead_port},127.0.0.1:{dead_port}"
        "?Tls=false&GossipTimeout=1"
    )
    caplog.set_level(logging.DEBUG)
    store = EventStoreDBStore(uri, retry_timeout=0.5, call_timeout=0.3)
    try:
        with pytest.raises(StoreUnavailable) as info:
            store.stream_version(new_stream())
        assert "DiscoveryFailed" in str(info.value)
        _assert_no_secret(_chain_text(info.value))
        for entry in caplog.records:
            _assert_no_secret(entry.getMessage())
    finally:
        store.close()


# --- the idle checkpoint races a writer ------------------------------------------------------


@pytest.fixture
def store(esdb_uri: str) -> Iterator[EventStoreDBStore]:
    store = EventStoreDBStore(esdb_uri, idle_checkpoint_after=0.02)
    yield store
    store.close()


def test_an_event_landing_right_after_each_head_read_is_never_skipped(
    store: EventStoreDBStore,
) -> None:
    """Whenever the idle probe reads the head, another writer commits right after the read
    (two filtered-out events, then a delivered one, and again). The probe's checkpoints may
    pass the filtered-out ones, never a delivered one."""
    stream = new_stream()
    collector = Collector(store.subscribe(after=store.head_position(), wire_names=[SIGNAL]))
    real = store.log.read_head
    lock = threading.Lock()
    written: list[int] = []
    injected = 40

    def hostile(client: object, timeout: float) -> int:
        head = real(client, timeout)  # type: ignore[arg-type]
        with lock:
            if len(written) < injected:
                version = len(written)
                wire = SIGNAL if version % 3 == 2 else NOISE
                result = store.append(
                    stream, [record(wire, version)], version or StreamState.NO_STREAM
                )
                written.append(result.position)
        return head

    try:
        collector.wait_caught_up()
        store.log.read_head = hostile  # type: ignore[method-assign]
        deadline = time.monotonic() + 20
        while len(written) < injected and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(written) == injected
        expected = [r for r in store.read_stream(stream) if r.wire_name == SIGNAL]
        got = collector.wait_records([stream], len(expected))
        assert got == expected
        checkpoints = [i for i in collector.snapshot() if isinstance(i, Checkpoint)]
        assert checkpoints, "the idle probe checkpointed"
    finally:
        del store.log.read_head
        collector.stop()
    last = 0
    for item in collector.snapshot():
        if isinstance(item, StoredRecord):
            assert item.position > last
            last = item.position
        else:
            assert item.position >= last
            last = item.position
