"""Nothing secret is ever written into an event, end to end: turns run through the public
``terret.Runtime`` with the OpenAI-compatible provider against a real local server that echoes
the API key in every error path (an HTTP error body, an SSE ``error`` chunk, a chunk of the
wrong shape, tool arguments that are not an object, ...), and with a key that a CRLF ``.env``
file left a ``\\r`` on. Each turn fails and records its error in ``turn/end``; then every byte
of the store (the SQLite files; every event the EventStoreDB emulator hands back, system
events included), the views, the captured logs and stdout/stderr are searched for the key in
every spelling."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from esdbclient import EventStoreDBClient

import terret
from terret.adapters.providers import (
    EndpointConfig,
    ProviderRegistry,
    ProvidersConfig,
    RetryConfig,
)
from terret.domain.errors import ConfigurationError, ProviderError
from terret.domain.store import session_stream
from tests.providers.conftest import API_KEY, CHAT, FAST_TIMEOUTS
from tests.providers.test_secret_paths import ODD_KEY, PATHS, fragments, reply_for
from tests.runtime.conftest import OpenedStore
from tests.support.sse_server import ScriptedServer

RETRY = RetryConfig(max_retries=1, backoff_base=0.005, backoff_cap=0.01, retry_after_cap=0.05)
#: A third key, only ever sent with the CRLF a Windows .env file leaves on it.
CRLF_KEY = "sk-crlf-SECRET-fedcba9876543210"
KEYS = {"plain": API_KEY, "odd": ODD_KEY, "crlf": CRLF_KEY}
ODD_PATHS = ["error chunk", "wrong shape (decoder)", "tool args not JSON",
             "HTTP 400 text, escaped key", "HTTP 503 JSON (retried)"]


def _found(blob: bytes, where: str) -> list[str]:
    return [
        f"{name} key ({fragment!r}) in {where}"
        for name, key in KEYS.items()
        for fragment in sorted(fragments(key))
        if fragment.encode() in blob
    ]


def _every_event(opened: OpenedStore) -> bytes:
    """Every event the store hands back, in every field; on EventStoreDB also every event of
    ``$all`` read with the server's own client (system and Terret-internal ones included)."""
    parts: list[bytes] = []
    after = 0
    while batch := opened.store.read_all(after=after, limit=500):
        for record in batch:
            parts += [record.stream.encode(), record.wire_name.encode(), record.data,
                      record.metadata]
            snapshot = opened.store.read_snapshot(record.stream)
            if snapshot is not None:
                parts.append(snapshot[1])
        after = batch[-1].position
    if opened.kind == "esdb":
        client = EventStoreDBClient(uri=opened.uri)
        try:
            for event in client.read_all():
                parts += [event.stream_name.encode(), event.type.encode(), event.data,
                          event.metadata]
        finally:
            client.close()
    return b"\n".join(parts)


def _files(directory: Path) -> bytes:
    return b"\n".join(path.read_bytes() for path in sorted(directory.rglob("*")) if path.is_file())


def test_no_key_reaches_the_log_or_any_output(
    opened: OpenedStore,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level(logging.DEBUG)
    with ScriptedServer() as server:
        base = server.url + "/api/v1"
        config = ProvidersConfig(
            endpoints={
                "openrouter": EndpointConfig(base_url=base, api_key_env="OPENROUTER_API_KEY"),
                "odd": EndpointConfig(base_url=base, api_key_env="ODD_API_KEY"),
                "crlf": EndpointConfig(base_url=base, api_key_env="CRLF_API_KEY"),
            },
            retry=RETRY, timeouts=FAST_TIMEOUTS,
        )
        environ = {"OPENROUTER_API_KEY": API_KEY, "ODD_API_KEY": ODD_KEY,
                   "CRLF_API_KEY": CRLF_KEY + "\r\n"}
        registry = ProviderRegistry(config, environ=environ)
        views = tmp_path / "views" / "terret.views.db"
        views.parent.mkdir()
        runtime = terret.Runtime(
            opened.store, resolver=registry, views=str(views),
            config=terret.RuntimeConfig(roles={"main": "openrouter:acme/m"}),
            agents=[terret.AgentDefinition(tools=[], allow=["*"])],
        ).start()
        sessions = []
        try:
            turns = [("openrouter", path) for path in PATHS]
            turns += [("odd", path) for path in ODD_PATHS]
            for endpoint, path in turns:
                key = API_KEY if endpoint == "openrouter" else ODD_KEY
                server.repeat(CHAT, reply_for(path, key))
                sid = runtime.create_session(roles={"main": f"{endpoint}:acme/m"})
                sessions.append(sid)
                with pytest.raises(ProviderError):
                    runtime.run_turn(sid, f"hello over {path}")
            crlf = runtime.create_session(roles={"main": "crlf:acme/m"})
            sessions.append(crlf)
            with pytest.raises(Exception) as refused:  # noqa: PT011 - checked below
                runtime.run_turn(crlf, "hello with a CRLF key")
            runtime.catch_up_views()
        finally:
            runtime.close()
            registry.close()
        # Every key was really sent (the CRLF one never was: refused before any request).
        sent = {r.headers["authorization"] for r in server.requests}
        assert sent == {f"Bearer {API_KEY}", f"Bearer {ODD_KEY}"}

    # Each turn failed and recorded why.
    errors = []
    for sid in sessions:
        ends = [json.loads(r.data) for r in opened.store.read_stream(session_stream(sid))
                if r.wire_name == "turn/end"]
        assert [end["status"] for end in ends] == ["failed"], ends
        errors.append(ends[0]["error"])

    captured = capfd.readouterr()
    leaks = _found(_every_event(opened), "the events")
    leaks += _found(_files(tmp_path), "the files under tmp_path (SQLite store, views)")
    leaks += _found(caplog.text.encode(), "the captured log")
    leaks += _found("\n".join(r.getMessage() for r in caplog.records).encode(), "log records")
    leaks += _found((captured.out + captured.err).encode(), "stdout/stderr")
    leaks += _found("\n".join(errors).encode(), "turn/end errors")
    assert leaks == []
    assert sum("***" in error for error in errors) >= len(PATHS)  # masked, and still said
    # The search looks at real data: the store holds the sessions' events.
    assert b"hello over error chunk" in _every_event(opened)
    # The CRLF key was refused at configuration, naming the variable and not the key.
    assert refused.type is ConfigurationError
    assert "CRLF_API_KEY ends with a carriage return" in str(refused.value)
    assert "ConfigurationError" in errors[-1] and "CRLF_API_KEY" in errors[-1]
