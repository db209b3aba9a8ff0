"""Fixtures for the provider and summarizer tests: a real scripted HTTP server on loopback and
providers pointed at it, with tiny backoffs and timeouts so failure tests stay fast."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from terret.adapters.providers import OpenAICompatibleProvider, RetryConfig, TimeoutConfig
from tests.support.sse_server import ScriptedServer

#: A recognisable fake key: tests assert it never shows up where it must not.
API_KEY = "sk-test-SECRET-0123456789abcdef"
CHAT = "/api/v1/chat/completions"

FAST_RETRY = RetryConfig(
    max_retries=2, backoff_base=0.01, backoff_cap=0.02, jitter=0.5, retry_after_cap=0.3
)
FAST_TIMEOUTS = TimeoutConfig(connect=1.0, read=1.0, write=1.0, pool=1.0)

ProviderFactory = Callable[..., OpenAICompatibleProvider]


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with ScriptedServer() as scripted:
        yield scripted


@pytest.fixture
def make_provider(server: ScriptedServer) -> Iterator[ProviderFactory]:
    built: list[OpenAICompatibleProvider] = []

    def factory(**overrides: Any) -> OpenAICompatibleProvider:
        options: dict[str, Any] = {
            "api_key": API_KEY,
            "retry": FAST_RETRY,
            "timeouts": FAST_TIMEOUTS,
        }
        options.update(overrides)
        name = options.pop("name", "openrouter")
        base_url = options.pop("base_url", server.url + "/api/v1")
        provider = OpenAICompatibleProvider(name, base_url, **options)
        built.append(provider)
        return provider

    yield factory
    for provider in built:
        provider.close()


@pytest.fixture
def provider(make_provider: ProviderFactory) -> OpenAICompatibleProvider:
    return make_provider()
