"""Provider configuration: named endpoints, timeouts, retries and default model roles.

Configuration names environment variables, never secrets: an API key is read from the
environment when a provider is built, so a config file can be committed, logged and shown.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from terret.domain.errors import ConfigurationError
from terret.domain.events import PROVIDER_NAME, URL_SECRETS_REFUSED, url_holds_secrets
from terret.domain.payloads import describe_validation

#: The spec prefix for an ad-hoc endpoint given inline: ``openai-compatible:<model>@<base_url>``.
AD_HOC_PROVIDER = "openai-compatible"

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class TimeoutConfig(BaseModel):
    """Seconds. ``read`` bounds the gap between two chunks of a stream, not the whole reply,
    so a long answer never times out while tokens keep arriving."""

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    connect: float = Field(default=10.0, gt=0)
    read: float = Field(default=120.0, gt=0)
    write: float = Field(default=30.0, gt=0)
    pool: float = Field(default=10.0, gt=0)


class RetryConfig(BaseModel):
    """Retries of a request that failed before its first token (429, 5xx, connection errors).

    The n-th retry waits ``min(backoff_cap, backoff_base * 2**n)``, scaled by a random factor
    in ``[1 - jitter, 1]`` so that many agents throttled together do not retry in lockstep.
    A server's ``Retry-After`` replaces that delay, capped at ``retry_after_cap``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    max_retries: int = Field(default=3, ge=0)
    backoff_base: float = Field(default=0.5, ge=0)
    backoff_cap: float = Field(default=8.0, ge=0)
    jitter: float = Field(default=0.5, ge=0, le=1)
    retry_after_cap: float = Field(default=30.0, ge=0)


class ModelPrice(BaseModel):
    """What a model costs, per million tokens, for an endpoint that reports no cost of its own
    (OpenAI, vLLM, Ollama): the provider prices each reply's usage with it, so the cost is
    recorded with the reply and spend budgets count it. A cost the server reports wins."""

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    prompt: float = Field(ge=0)
    completion: float = Field(ge=0)

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        return (prompt_tokens * self.prompt + completion_tokens * self.completion) / 1_000_000


class EndpointConfig(BaseModel):
    """One OpenAI-compatible chat-completions endpoint, addressed as ``<name>:<model>``."""

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    base_url: str
    #: Environment variable holding the bearer key; ``None`` for an endpoint without auth
    #: (a local vLLM or Ollama).
    api_key_env: str | None = None
    #: Extra request headers, e.g. OpenRouter's ``HTTP-Referer`` / ``X-Title`` attribution.
    #: Left out of the repr: a header may carry a credential.
    headers: dict[str, str] = Field(default_factory=dict, repr=False)
    #: Extra top-level body fields merged into every request (``temperature``, ``max_tokens``,
    #: OpenRouter's ``provider`` routing, ...).
    extra_body: dict[str, Any] = Field(default_factory=dict)
    #: Send ``stream_options: {include_usage: true}`` (OpenAI needs it for usage; OpenRouter,
    #: vLLM and Ollama accept it). Turn off only for a server that rejects the field.
    stream_usage: bool = True
    timeouts: TimeoutConfig | None = None
    retry: RetryConfig | None = None
    #: Prices by model name (``"*"``: any other model) for a server that reports no cost.
    prices: dict[str, ModelPrice] = Field(default_factory=dict)

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        return check_base_url(value)

    @field_validator("api_key_env")
    @classmethod
    def _variable_name(cls, value: str | None) -> str | None:
        return None if value is None else check_env_name(value)

    @field_validator("headers")
    @classmethod
    def _sendable_headers(cls, value: dict[str, str]) -> dict[str, str]:
        return check_headers(value)


def check_base_url(value: str) -> str:
    """A base URL must be absolute http(s); the trailing slash is dropped so paths join.

    The refusal does not quote the value: what is in a key's place is often the key."""
    text = value.strip().rstrip("/")
    scheme, sep, rest = text.partition("://")
    if not sep or scheme.lower() not in ("http", "https") or not rest or rest.startswith("/"):
        raise ValueError("a base URL must be an absolute http:// or https:// URL")
    if url_holds_secrets(text):  # the log's own rule for a spec's URL
        raise ValueError(URL_SECRETS_REFUSED)
    return text


_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+\Z")


def check_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """Extra request headers a request can carry: token names, values of printable ASCII
    (no line break: the ``\r`` a ``.env`` file's CRLF leaves behind). Refused here rather than
    in a turn's error, which would quote the value into the log — a header may hold a key
    (``api-key``, ``x-api-key``): values are never repeated."""
    for name, value in headers.items():
        if not isinstance(name, str) or not _HEADER_NAME.match(name):
            raise ValueError(f"a header name is a token of letters, digits and !#$%&'*+.^_`|~-, "
                             f"not {str(name)[:40]!r}")
        if not isinstance(value, str) or not (value.isascii() and value.isprintable()):
            raise ValueError(f"the value of header {name!r} must be printable ASCII with no "
                             "line break or control character (a CRLF .env file leaves a "
                             "\r); the value is not repeated here")
    return dict(headers)


def check_env_name(value: str) -> str:
    """The name of an environment variable (letters, digits, ``_``, not starting with a digit).

    A key pasted where its variable's name belongs would be quoted by every error that names
    the variable — into a turn's recorded error, the log — so it is refused here, unquoted."""
    if not _ENV_NAME.fullmatch(value):
        raise ValueError(
            "must name an environment variable (letters, digits and '_', not starting with a "
            "digit), not hold a key: the value is not repeated here"
        )
    return value


def builtin_endpoints() -> dict[str, EndpointConfig]:
    """The endpoints every configuration has unless it overrides them by name."""
    return {
        "openrouter": EndpointConfig(
            base_url="https://openrouter.ai/api/v1", api_key_env="OPENROUTER_API_KEY"
        ),
        "openai": EndpointConfig(
            base_url="https://api.openai.com/v1", api_key_env="OPENAI_API_KEY"
        ),
    }


class ProvidersConfig(BaseModel):
    """Everything :class:`~terret.adapters.providers.specs.ProviderRegistry` needs.

    ``endpoints`` are merged over :func:`builtin_endpoints`, so a config that only adds
    ``vllm`` still resolves ``openrouter:`` and ``openai:`` specs. ``roles`` are the default
    model roles (``main``, ``compactor``, ``titler``, user-defined) as ``provider:model`` specs;
    a running session changes them with durable ``model/set`` events.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    endpoints: dict[str, EndpointConfig] = Field(default_factory=builtin_endpoints)
    #: Key variable for ad-hoc ``openai-compatible:<model>@<base_url>`` specs (``None``: no auth).
    openai_compatible_key_env: str | None = None
    timeouts: TimeoutConfig = Field(default_factory=TimeoutConfig)
    retry: RetryConfig = Field(default_factory=RetryConfig)
    roles: dict[str, str] = Field(default_factory=dict)

    @field_validator("endpoints")
    @classmethod
    def _merge_builtins(cls, value: dict[str, EndpointConfig]) -> dict[str, EndpointConfig]:
        for name in value:
            if name == AD_HOC_PROVIDER:
                raise ValueError(f"endpoint name {AD_HOC_PROVIDER!r} is reserved for inline specs")
            if not PROVIDER_NAME.match(name):
                raise ValueError(
                    f"endpoint name {name!r} must be a lowercase letter, then lowercase "
                    f"letters, digits, '_' or '-'"
                )
        return {**builtin_endpoints(), **value}

    @field_validator("openai_compatible_key_env")
    @classmethod
    def _variable_name(cls, value: str | None) -> str | None:
        return None if value is None else check_env_name(value)

    @classmethod
    def from_file(cls, path: str | Path) -> ProvidersConfig:
        """Load from a ``.toml`` or ``.json`` file; errors name the file."""
        file = Path(path)
        try:
            raw = file.read_bytes()
            data: Any = tomllib.loads(raw.decode()) if file.suffix == ".toml" else json.loads(raw)
            return cls.model_validate(data)
        except ValidationError as exc:
            problems = describe_validation(exc, "<config>")
            raise ConfigurationError(f"provider configuration {str(file)!r}: {problems}") from None
        except (OSError, ValueError) as exc:
            raise ConfigurationError(f"provider configuration {str(file)!r}: {exc}") from exc
