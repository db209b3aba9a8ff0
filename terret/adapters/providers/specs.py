"""Model specs (``provider:model``) and the registry that turns them into providers.

Spec forms:
- ``<endpoint>:<model>`` — a named endpoint from :class:`ProvidersConfig` (``openrouter``,
  ``openai`` built in; ``vllm``, ``ollama``, ... when configured). The model is everything after
  the first colon, so ``ollama:llama3.1:8b`` and ``openrouter:meta-llama/x:free`` work.
- ``openai-compatible:<model>@<base_url>`` — an ad-hoc endpoint given inline, split at the
  last ``@http://`` or ``@https://``; no configuration needed.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from terret.adapters.providers.config import (
    AD_HOC_PROVIDER,
    PROVIDER_NAME,
    EndpointConfig,
    ProvidersConfig,
    check_base_url,
)
from terret.adapters.providers.openai_compat import OpenAICompatibleProvider
from terret.adapters.providers.secret import Secret, bearer_key
from terret.domain.errors import ConfigurationError
from terret.domain.events import URL_SECRETS_REFUSED, spec_holds_userinfo, url_holds_secrets
from terret.runtime.model import ModelProvider

#: Environment variable naming a ``.toml``/``.json`` providers file for :meth:`from_env`.
CONFIG_FILE_ENV = "TERRET_PROVIDERS_FILE"

RoleResolver = Callable[[str], tuple[ModelProvider, str]]


@dataclass(frozen=True)
class ModelSpec:
    """A parsed ``provider:model`` spec. ``str(spec)`` is its canonical form, the one
    recorded on ``step/start`` and ``model/set``."""

    provider: str
    model: str
    base_url: str | None = None

    @classmethod
    def parse(cls, text: str) -> ModelSpec:
        spec = text.strip()
        provider, sep, model = spec.partition(":")
        if not sep or not provider or not model:
            raise ConfigurationError(
                f"bad model spec {_quoted(text)}: expected 'provider:model', e.g. "
                f"'openrouter:anthropic/claude-sonnet-4' or 'openai-compatible:<model>@<base_url>'"
            )
        if any(ch.isspace() for ch in text):  # a trailing newline too: no whitespace at all
            raise ConfigurationError(f"bad model spec {_quoted(text)}: it contains whitespace")
        if not PROVIDER_NAME.match(provider):
            raise ConfigurationError(
                f"bad model spec {_quoted(text)}: provider {provider!r} must be a lowercase "
                "letter, then lowercase letters, digits, '_' or '-'"
            )
        if spec_holds_userinfo(spec):
            raise ConfigurationError(f"bad model spec {_quoted(text)}: {URL_SECRETS_REFUSED}")
        if provider != AD_HOC_PROVIDER:
            return cls(provider, model)
        cut = max(model.rfind("@http://"), model.rfind("@https://"))
        if cut <= 0:
            raise ConfigurationError(
                f"bad model spec {_quoted(text)}: '{AD_HOC_PROVIDER}' needs '<model>@<base_url>', "
                f"e.g. 'openai-compatible:qwen2.5@http://localhost:8000/v1'"
            )
        try:
            base_url = check_base_url(model[cut + 1 :])
        except ValueError as exc:  # the URL is not quoted: what is wrong in it may be a key
            raise ConfigurationError(
                f"bad model spec '{provider}:{model[:cut]}@…': {exc}") from None
        return cls(provider, model[:cut], base_url)

    def __str__(self) -> str:
        if self.base_url is not None:
            return f"{self.provider}:{self.model}@{self.base_url}"
        return f"{self.provider}:{self.model}"


def _quoted(text: str) -> str:
    """A bad spec as its error shows it: whole, unless it may hold a host's credentials
    (``admin:hunter2@gpu-box``; errors reach the log and the warnings): then its provider."""
    if url_holds_secrets(text) or spec_holds_userinfo(text):
        return repr(text.partition(":")[0] + ":…")
    return repr(text)


class ProviderRegistry:
    """Resolves specs to providers, building one provider (one connection pool) per endpoint
    on first use and sharing it between every session and role that names it.

    API keys are read from ``environ`` when a provider is first built; a missing key raises
    :class:`ConfigurationError` naming the variable, never a value.
    """

    def __init__(
        self,
        config: ProvidersConfig | None = None,
        *,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.config = config or ProvidersConfig()
        self._environ = os.environ if environ is None else environ
        self._providers: dict[str, ModelProvider] = {}
        self._registered: set[str] = set()
        self._lock = threading.Lock()

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str] | None = None,
        *,
        config: ProvidersConfig | None = None,
    ) -> ProviderRegistry:
        """The defaults (OpenRouter and OpenAI, keys from ``OPENROUTER_API_KEY`` and
        ``OPENAI_API_KEY``), or the file named by ``TERRET_PROVIDERS_FILE`` when it is set."""
        env = os.environ if environ is None else environ
        if config is None:
            path = env.get(CONFIG_FILE_ENV)
            config = ProvidersConfig.from_file(path) if path else ProvidersConfig()
        return cls(config, environ=env)

    def __repr__(self) -> str:
        names = sorted({*self.config.endpoints, *self._registered})
        return f"ProviderRegistry(providers={names})"

    def provider_names(self) -> frozenset[str]:
        """Every provider a spec may name here, built or not (a configured endpoint whose API
        key is missing included): the configured endpoints, the registered providers, and the
        ad-hoc ``openai-compatible`` endpoint a spec names itself."""
        return frozenset({*self.config.endpoints, *self._registered, AD_HOC_PROVIDER})

    # --- resolution ---------------------------------------------------------------------------

    def resolve(self, spec: str | ModelSpec) -> tuple[ModelProvider, str]:
        """The provider for ``spec`` and the model id to put in its requests."""
        parsed = spec if isinstance(spec, ModelSpec) else ModelSpec.parse(spec)
        if parsed.base_url is not None:
            return self._ad_hoc(parsed), parsed.model
        return self._named(parsed), parsed.model

    def resolve_role(
        self, role: str, roles: Mapping[str, str] | None = None
    ) -> tuple[ModelProvider, str]:
        """Resolves a model role through ``roles`` (default: the configured roles)."""
        table = self.config.roles if roles is None else roles
        spec = table.get(role)
        if not spec:
            raise ConfigurationError(
                f"model role {role!r} is not configured "
                f"(configured roles: {', '.join(sorted(table)) or 'none'})"
            )
        return self.resolve(spec)

    def role_resolver(self, roles: Mapping[str, str] | None = None) -> RoleResolver:
        """A ``resolve_role`` callable for :class:`RoleSummarizer` / :class:`RoleTitler`.

        Pass a live mapping (e.g. one the runtime updates on ``model/set``) and the resolver
        follows it; the default reads the configured roles.
        """
        return lambda role: self.resolve_role(role, roles)

    def register(self, name: str, provider: ModelProvider) -> None:
        """Adds a provider under ``name`` (a scripted provider for tests and demos, a custom
        adapter); ``name:<model>`` specs then resolve to it, ahead of configured endpoints."""
        if name == AD_HOC_PROVIDER or not PROVIDER_NAME.match(name):
            raise ConfigurationError(f"cannot register a provider as {name!r}")
        with self._lock:
            self._providers[name] = provider
            self._registered.add(name)

    def close(self) -> None:
        """Closes every provider this registry built (registered ones belong to the caller)."""
        with self._lock:
            built = [p for n, p in self._providers.items() if n not in self._registered]
            self._providers = {n: p for n, p in self._providers.items() if n in self._registered}
        for provider in built:
            close = getattr(provider, "close", None)
            if callable(close):
                close()

    # --- construction ---------------------------------------------------------------------------

    def _named(self, spec: ModelSpec) -> ModelProvider:
        with self._lock:
            cached = self._providers.get(spec.provider)
            if cached is not None:
                return cached
            endpoint = self.config.endpoints.get(spec.provider)
            if endpoint is None:
                known = sorted(self.provider_names())
                raise ConfigurationError(
                    f"model spec {str(spec)!r} names an unknown provider {spec.provider!r} "
                    f"(known: {', '.join(known)})"
                )
            provider = self._build(spec.provider, endpoint, spec)
            self._providers[spec.provider] = provider
            return provider

    def _ad_hoc(self, spec: ModelSpec) -> ModelProvider:
        assert spec.base_url is not None
        key = f"{AD_HOC_PROVIDER}@{spec.base_url}"
        with self._lock:
            cached = self._providers.get(key)
            if cached is not None:
                return cached
            endpoint = EndpointConfig(
                base_url=spec.base_url, api_key_env=self.config.openai_compatible_key_env
            )
            provider = self._build(AD_HOC_PROVIDER, endpoint, spec)
            self._providers[key] = provider
            return provider

    def _build(self, name: str, endpoint: EndpointConfig, spec: ModelSpec) -> ModelProvider:
        api_key: Secret | None = None
        if endpoint.api_key_env is not None:
            value = self._environ.get(endpoint.api_key_env) or None
            if value is None:
                raise ConfigurationError(
                    f"model spec {str(spec)!r}: provider {name!r} needs an API key in the "
                    f"environment variable {endpoint.api_key_env}, which is not set"
                )
            # A key no header can carry (a CRLF .env file's trailing "\r") is refused here,
            # naming the variable, before any request could quote it.
            try:
                api_key = bearer_key(
                    value,
                    source=f"model spec {str(spec)!r}: provider {name!r}: the API key in "
                    f"{endpoint.api_key_env}",
                )
            except ConfigurationError:
                del value  # a reporter that shows the traceback's locals would show it
                raise
        return OpenAICompatibleProvider.from_endpoint(
            name, endpoint, api_key=api_key, timeouts=self.config.timeouts, retry=self.config.retry
        )
