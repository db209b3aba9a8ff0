"""API keys never appear in reprs, error messages, tracebacks or log records."""

from __future__ import annotations

import logging
import pickle
import traceback

import pytest

from terret.adapters.providers import OpenAICompatibleProvider, ProviderRegistry, ProvidersConfig
from terret.adapters.providers.secret import Secret
from terret.domain.errors import ConfigurationError, ProviderError
from terret.domain.messages import Message
from terret.runtime.model import ModelRequest
from tests.providers.conftest import API_KEY, CHAT, ProviderFactory
from tests.support.sse_server import Reply, ScriptedServer, free_port, text_stream

HELLO = ModelRequest(model="m", messages=(Message("user", "hi"),))


def _everything_printable(error: BaseException, *, frame_locals: bool = True) -> str:
    """The error, its chain, and the locals of every frame (what --showlocals, rich tracebacks
    and error trackers display)."""
    shown = traceback.TracebackException.from_exception(error, capture_locals=frame_locals)
    return "".join(shown.format()) + repr(error) + repr(error.args)


def test_the_repr_has_no_key(provider: OpenAICompatibleProvider) -> None:
    assert API_KEY not in repr(provider)
    assert API_KEY not in str(vars(provider))
    assert "auth=bearer" in repr(provider)


def _echoing_error_reply() -> Reply:
    message = f"Incorrect API key provided: {API_KEY}"
    return Reply.json({"error": {"message": message, "code": "invalid_api_key"}}, status=401)


def test_a_key_echoed_in_an_error_body_is_scrubbed(
    server: ScriptedServer, provider: OpenAICompatibleProvider
) -> None:
    # Built inline, not in a local: the check below reads the locals of every frame, this
    # test's own included.
    server.script(CHAT, _echoing_error_reply())

    with pytest.raises(ProviderError) as caught:
        provider.complete(HELLO)

    assert server.requests[0].headers["authorization"] == f"Bearer {API_KEY}"  # it was sent...
    assert "Incorrect API key provided: ***" in str(caught.value)
    assert API_KEY not in _everything_printable(caught.value)  # ...and never shown


def test_a_key_echoed_in_a_malformed_chunk_is_scrubbed(
    server: ScriptedServer, provider: OpenAICompatibleProvider
) -> None:
    server.script(CHAT, Reply.sse([f"data: oops {API_KEY}\n\n".encode()]))

    with pytest.raises(ProviderError) as caught:
        provider.complete(HELLO)

    # The frames that held the raw bytes the server sent are cleared on the way out, so even
    # a traceback that shows locals is clean.
    assert API_KEY not in _everything_printable(caught.value)
    assert caught.value.data is not None and API_KEY not in caught.value.data


def test_retry_logs_and_connection_errors_carry_no_key(
    make_provider: ProviderFactory, caplog: pytest.LogCaptureFixture
) -> None:
    provider = make_provider(base_url=f"http://127.0.0.1:{free_port()}/v1")
    caplog.set_level(logging.DEBUG)

    with pytest.raises(ProviderError) as caught:
        provider.complete(HELLO)

    assert any("retry 1 of 2" in record.getMessage() for record in caplog.records)
    assert API_KEY not in caplog.text
    assert API_KEY not in _everything_printable(caught.value)


def test_retried_http_errors_log_no_key(
    server: ScriptedServer, provider: OpenAICompatibleProvider, caplog: pytest.LogCaptureFixture
) -> None:
    server.script(
        CHAT,
        Reply.json({"error": {"message": f"busy, key {API_KEY}"}}, status=503),
        Reply.sse(text_stream(["ok"])),
    )
    caplog.set_level(logging.DEBUG)

    assert provider.complete(HELLO).text == "ok"
    assert "HTTP 503" in caplog.text and API_KEY not in caplog.text


def test_a_missing_key_names_the_variable_not_a_value() -> None:
    registry = ProviderRegistry(environ={"OPENAI_API_KEY": API_KEY})

    with pytest.raises(ConfigurationError, match="OPENROUTER_API_KEY") as caught:
        registry.resolve("openrouter:openai/gpt-4o")

    assert "openrouter:openai/gpt-4o" in str(caught.value)
    assert API_KEY not in str(caught.value)


def test_registry_and_config_reprs_hold_no_keys() -> None:
    registry = ProviderRegistry(ProvidersConfig(), environ={"OPENROUTER_API_KEY": API_KEY})
    provider, _ = registry.resolve("openrouter:x")
    try:
        assert API_KEY not in repr(registry) + repr(registry.config) + repr(provider)
    finally:
        registry.close()


def test_a_secret_neither_prints_nor_pickles() -> None:
    secret = Secret(API_KEY)
    assert API_KEY not in repr(secret) + str(secret) + f"{secret}"
    assert secret.reveal() == API_KEY
    with pytest.raises(TypeError):
        pickle.dumps(secret)
