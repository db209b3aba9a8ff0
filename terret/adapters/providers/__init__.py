"""Model providers over httpx: an OpenAI-compatible streaming chat provider, model specs and
the registry that resolves them from configuration. See ``docs/providers.md``."""

from terret.adapters.providers.config import (
    EndpointConfig,
    ModelPrice,
    ProvidersConfig,
    RetryConfig,
    TimeoutConfig,
)
from terret.adapters.providers.errors import ProviderHTTPError, StreamBroken, UpstreamError
from terret.adapters.providers.openai_compat import OpenAICompatibleProvider
from terret.adapters.providers.specs import ModelSpec, ProviderRegistry, RoleResolver

__all__ = [
    "EndpointConfig",
    "ModelPrice",
    "ModelSpec",
    "OpenAICompatibleProvider",
    "ProviderHTTPError",
    "ProviderRegistry",
    "ProvidersConfig",
    "RetryConfig",
    "RoleResolver",
    "StreamBroken",
    "TimeoutConfig",
    "UpstreamError",
]
