"""Model specs, provider configuration and the registry."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from terret.adapters.providers import (
    EndpointConfig,
    ModelSpec,
    OpenAICompatibleProvider,
    ProviderRegistry,
    ProvidersConfig,
    RetryConfig,
)
from terret.domain.errors import ConfigurationError
from terret.domain.events import validate_model_spec
from terret.domain.messages import Message
from terret.runtime.model import ModelRequest
from terret.runtime.scripted import Reply as ScriptedReply
from terret.runtime.scripted import ScriptedProvider
from tests.support.sse_server import (
    Reply,
    ScriptedServer,
    openai_usage,
    openrouter_usage,
    text_stream,
)

KEYS = {"OPENROUTER_API_KEY": "or-key", "OPENAI_API_KEY": "oa-key"}


@pytest.mark.parametrize(
    ("text", "provider", "model", "base_url"),
    [
        ("openrouter:anthropic/claude-sonnet-4", "openrouter", "anthropic/claude-sonnet-4", None),
        (
            "openrouter:meta-llama/llama-3.1-8b-instruct:free",
            "openrouter",
            "meta-llama/llama-3.1-8b-instruct:free",
            None,
        ),
        ("openai:gpt-4o-mini", "openai", "gpt-4o-mini", None),
        ("ollama:llama3.1:8b", "ollama", "llama3.1:8b", None),
        (
            "openai-compatible:Qwen/Qwen2.5-7B@http://localhost:8000/v1",
            "openai-compatible",
            "Qwen/Qwen2.5-7B",
            "http://localhost:8000/v1",
        ),
        (
            "openai-compatible:me@work/model@https://llm.internal/v1/",
            "openai-compatible",
            "me@work/model",
            "https://llm.internal/v1",
        ),
    ],
)
def test_specs_parse_and_print_canonically(
    text: str, provider: str, model: str, base_url: str | None
) -> None:
    spec = ModelSpec.parse(text)
    assert (spec.provider, spec.model, spec.base_url) == (provider, model, base_url)
    assert ModelSpec.parse(str(spec)) == spec
    validate_model_spec(str(spec))  # what model/set and step/start accept


@pytest.mark.parametrize(
    "text",
    [
        "",
        "gpt-4o",
        ":gpt-4o",
        "openai:",
        "open ai:gpt",
        "OpenAI:gpt-4o",
        "openai:gpt 4o",
        "openai-compatible:qwen",
        "openai-compatible:qwen@localhost:8000",
        "openai-compatible:@http://localhost:8000/v1",
        "openai-compatible:qwen@ftp://host/v1",
    ],
)
def test_bad_specs_raise_configuration_errors_naming_them(text: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        ModelSpec.parse(text)
    assert repr(text) in str(caught.value)


def test_from_env_defaults() -> None:
    registry = ProviderRegistry.from_env(KEYS)
    try:
        openrouter, model = registry.resolve("openrouter:anthropic/claude-sonnet-4")
        assert model == "anthropic/claude-sonnet-4"
        assert isinstance(openrouter, OpenAICompatibleProvider)
        assert openrouter.name == "openrouter"
        assert openrouter.base_url == "https://openrouter.ai/api/v1"
        openai, model = registry.resolve("openai:gpt-4o")
        assert isinstance(openai, OpenAICompatibleProvider)
        assert (openai.base_url, model) == ("https://api.openai.com/v1", "gpt-4o")
        # One provider (one connection pool) per endpoint.
        assert registry.resolve("openrouter:other/model")[0] is openrouter
    finally:
        registry.close()


def test_from_env_reads_a_providers_file(tmp_path: Path) -> None:
    path = tmp_path / "providers.toml"
    path.write_text(
        """
        [endpoints.vllm]
        base_url = "http://gpu-box:8000/v1"

        [endpoints.ollama]
        base_url = "http://localhost:11434/v1"
        stream_usage = true

        [retry]
        max_retries = 5

        [roles]
        main = "openrouter:anthropic/claude-sonnet-4"
        compactor = "ollama:llama3.1:8b"
        """
    )
    registry = ProviderRegistry.from_env({**KEYS, "TERRET_PROVIDERS_FILE": str(path)})
    try:
        assert registry.config.retry.max_retries == 5
        assert set(registry.config.endpoints) == {"openrouter", "openai", "vllm", "ollama"}
        provider, model = registry.resolve_role("compactor")
        assert isinstance(provider, OpenAICompatibleProvider)
        assert (provider.name, provider.base_url, model) == (
            "ollama",
            "http://localhost:11434/v1",
            "llama3.1:8b",
        )
    finally:
        registry.close()


def test_prices_in_the_providers_file_cost_a_reply_the_server_did_not(
        tmp_path: Path) -> None:
    path = tmp_path / "providers.toml"
    with ScriptedServer() as server:
        path.write_text(f"""
            [endpoints.vllm]
            base_url = "{server.url}/v1"
            [endpoints.vllm.prices."acme/m"]
            prompt = 3.0
            completion = 15.0
            [endpoints.vllm.prices."*"]
            prompt = 0.0
            completion = 0.0
            """)
        chat = "/v1/chat/completions"
        server.script(chat,
                      Reply.sse(text_stream(["a"], style="openai", usage=openai_usage(1000, 200))),
                      Reply.sse(text_stream(["b"], usage=openrouter_usage(1000, 200, 0.5))),
                      Reply.sse(text_stream(["c"], style="openai", usage=openai_usage(1000, 200))))
        registry = ProviderRegistry.from_env({"TERRET_PROVIDERS_FILE": str(path)})
        try:
            costs = []
            for spec in ("vllm:acme/m", "vllm:acme/m", "vllm:other"):
                provider, model = registry.resolve(spec)
                usage = provider.complete(ModelRequest(model=model, messages=(
                    Message("user", "hi"),))).usage
                assert usage is not None
                costs.append(usage.cost)
        finally:
            registry.close()
    # Priced (1000 × 3 + 200 × 15 per million); the server's own cost wins; the "*" price.
    assert costs == [pytest.approx(0.006), 0.5, 0.0]
    path.write_text('[endpoints.vllm]\nbase_url = "http://h/v1"\n'
                    '[endpoints.vllm.prices.m]\nprompt = -1\ncompletion = 0\n')
    with pytest.raises(ConfigurationError, match="endpoints.vllm.prices.m.prompt"):
        ProvidersConfig.from_file(path)


def test_a_broken_providers_file_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "providers.json"
    path.write_text(json.dumps({"endpoints": {"vllm": {"base_url": "localhost:8000"}}}))
    with pytest.raises(ConfigurationError, match="providers.json"):
        ProvidersConfig.from_file(path)


@pytest.mark.parametrize(
    "endpoints",
    [
        {"openai-compatible": {"base_url": "http://x/v1"}},
        {"My Server": {"base_url": "http://x/v1"}},
        {"vllm": {"base_url": "not a url"}},
        {"vllm": {"base_url": "http://x/v1", "api_key": "inline keys are refused"}},
    ],
)
def test_invalid_configuration_is_refused(endpoints: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        ProvidersConfig.model_validate({"endpoints": endpoints})


def test_unknown_providers_and_unconfigured_roles_are_configuration_errors() -> None:
    registry = ProviderRegistry(environ=KEYS)
    with pytest.raises(
        ConfigurationError, match=r"'vllm:x'.*unknown provider 'vllm'.*openai-compatible"
    ):
        registry.resolve("vllm:x")
    with pytest.raises(ConfigurationError, match="model role 'compactor' is not configured"):
        registry.role_resolver({"main": "openai:gpt-4o"})("compactor")


def test_a_named_local_endpoint_without_auth_talks_to_the_server(server: ScriptedServer) -> None:
    config = ProvidersConfig(
        endpoints={
            "vllm": EndpointConfig(base_url=server.url + "/v1", extra_body={"temperature": 0})
        },
        retry=RetryConfig(max_retries=0),
    )
    server.script("/v1/chat/completions", Reply.sse(text_stream(["local"], style="openai")))
    registry = ProviderRegistry(config, environ={})
    try:
        provider, model = registry.resolve("vllm:Qwen/Qwen2.5-7B-Instruct")
        reply = provider.complete(ModelRequest(model=model, messages=(Message("user", "hi"),)))
    finally:
        registry.close()

    assert reply.text == "local"
    body = server.requests[0].json()
    assert body["model"] == "Qwen/Qwen2.5-7B-Instruct" and body["temperature"] == 0
    assert "authorization" not in server.requests[0].headers


def test_an_inline_openai_compatible_spec_talks_to_the_server(server: ScriptedServer) -> None:
    server.script("/v1/chat/completions", Reply.sse(text_stream(["inline"])))
    config = ProvidersConfig(openai_compatible_key_env="LOCAL_KEY")
    registry = ProviderRegistry(config, environ={"LOCAL_KEY": "local-secret"})
    try:
        provider, model = registry.resolve(f"openai-compatible:tiny@{server.url}/v1")
        reply = provider.complete(ModelRequest(model=model, messages=(Message("user", "hi"),)))
        assert registry.resolve(f"openai-compatible:other@{server.url}/v1")[0] is provider
    finally:
        registry.close()

    assert reply.text == "inline"
    assert server.requests[0].headers["authorization"] == "Bearer local-secret"


def test_registered_providers_resolve_by_name() -> None:
    scripted = ScriptedProvider([ScriptedReply(text="scripted!")])
    registry = ProviderRegistry(environ={})
    registry.register("scripted", scripted)

    provider, model = registry.resolve("scripted:any-model")

    assert provider is scripted and model == "any-model"
    with pytest.raises(ConfigurationError):
        registry.register("openai-compatible", scripted)


def test_a_scripted_reply_that_is_not_a_reply_is_refused_when_scripted() -> None:
    for build in (lambda: ScriptedProvider(["hi"]),  # type: ignore[list-item]
                  lambda: ScriptedProvider(default="hi"),  # type: ignore[arg-type]
                  lambda: ScriptedProvider().script("hi")):  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="a scripted reply is a terret.Reply"):
            build()
    assert ScriptedProvider([ScriptedReply(text="ok")]).remaining == 1


@pytest.mark.parametrize("text", [
    "openai-compatible:m@http://bob:sk-live-SECRET99@127.0.0.1:1/v1",
    "openai-compatible:m@https://h.example/v1?api_key=sk-live-SECRET99",
    "openai-compatible:m@http://h.example/v1#sk-live-SECRET99",
])
def test_a_spec_whose_url_holds_credentials_is_refused_without_quoting_them(text: str) -> None:
    """A spec is written to the log (model/set, step/start): a key in its base URL would be
    there for good. Refused by the provider's parser and by the log's own check, unquoted."""
    with pytest.raises(ConfigurationError) as parsed:
        ModelSpec.parse(text)
    with pytest.raises(ValueError) as checked:
        validate_model_spec(text)
    for caught in (parsed, checked):
        assert "SECRET99" not in str(caught.value) and "credentials" in str(caught.value)


def test_a_spec_with_a_trailing_newline_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="whitespace"):
        ModelSpec.parse("openai:gpt\n")


def test_an_endpoint_url_with_credentials_is_refused_and_headers_are_not_shown() -> None:
    with pytest.raises(ValueError) as caught:
        ProvidersConfig.model_validate(
            {"endpoints": {"vllm": {"base_url": "http://u:sk-live-SECRET99@h/v1"}}})
    assert "SECRET99" not in str(caught.value)
    config = ProvidersConfig.model_validate({"endpoints": {"vllm": {
        "base_url": "http://h/v1", "headers": {"Authorization": "Bearer sk-live-SECRET99"}}}})
    assert "SECRET99" not in repr(config) and "SECRET99" not in str(config)


@pytest.mark.parametrize("text", [
    "openai-compatible:admin:hunter2SECRET@gpu-box",
    "openai-compatible:admin:hunter2SECRET@gpu-box:8000/v1",
    "openrouter:bob:hunter2SECRET@host",
])
def test_a_spec_holding_user_and_password_without_a_scheme_is_refused_unquoted(
        text: str) -> None:
    """``url_holds_secrets`` looks past a ``://``: ``user:password@host`` with no scheme
    passed the log's check, was recorded, and the parser's refusal then quoted it into the
    turn's error (the log) and serve's warnings."""
    with pytest.raises(ValueError) as checked:
        validate_model_spec(text)
    with pytest.raises(ConfigurationError) as parsed:
        ModelSpec.parse(text)
    for caught in (checked, parsed):
        assert "SECRET" not in str(caught.value)
    assert "credentials" in str(checked.value)


@pytest.mark.parametrize("text", [
    "ollama:llama3.1:8b", "vertex:claude-3-5-sonnet-v2@20241022",
    "openai-compatible:qwen2.5:7b@http://localhost:8000/v1",
    "openrouter:meta-llama/llama-3.1-8b:free",
])
def test_model_names_with_colons_or_an_at_sign_are_not_taken_for_credentials(text: str) -> None:
    assert validate_model_spec(text) == text
