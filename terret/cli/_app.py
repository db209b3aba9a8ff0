"""What a serving CLI process runs: agent definitions (tools are code), the model resolver,
runtime settings. ``--app module:function`` names a function returning an :class:`App`."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

from terret.domain.errors import ConfigurationError, TerretError
from terret.runtime.agent import AgentDefinition
from terret.runtime.maintenance import Titler
from terret.runtime.model import ModelResolver
from terret.runtime.runtime import RuntimeConfig
from terret.runtime.summarizer import Summarizer


@dataclass
class App:
    resolver: ModelResolver
    agents: list[AgentDefinition] = field(default_factory=list)
    config: RuntimeConfig = field(default_factory=RuntimeConfig)
    summarizer: Summarizer | None = None
    titler: Titler | None = None


def default_app() -> App:
    """Providers from the environment (OpenRouter, OpenAI, OpenAI-compatible endpoints), a
    ``default`` agent with no tools, roles from ``TERRET_MAIN_MODEL`` (default: the scripted
    echo model, so nothing is sent anywhere unless configured)."""
    from terret.adapters.providers import ProviderRegistry
    from terret.adapters.summarizers import MorphSummarizer
    from terret.runtime.scripted import Reply, ScriptedProvider

    registry = ProviderRegistry.from_env()
    registry.register("scripted", ScriptedProvider(
        name="scripted", default=lambda request: Reply(text=_echo(request))))
    roles = {"main": os.environ.get("TERRET_MAIN_MODEL", "scripted:echo")}
    for role in ("compactor", "titler"):
        spec = os.environ.get(f"TERRET_{role.upper()}_MODEL")
        if spec:
            roles[role] = spec
    budget = os.environ.get("TERRET_COMPACTION_BUDGET")
    config = RuntimeConfig(roles=roles, compaction_budget=int(budget) if budget else None)
    # Left unset, the runtime's defaults apply (R19, R20): the role summarizer and the role
    # titler on each session's own roles — so a `model set SID compactor …` is honoured — the
    # titler falling back to the first message when no titler role is configured.
    summarizer: Summarizer | None = None
    if os.environ.get("TERRET_SUMMARIZER") == "morph":
        summarizer = MorphSummarizer()
    return App(resolver=registry, agents=[AgentDefinition()], config=config,
               summarizer=summarizer)


def _echo(request: object) -> str:
    messages = getattr(request, "messages", [])
    last = next((m.text for m in reversed(messages) if m.role == "user"), "")
    return f"(echo) {last}"


def load_app(spec: str | None) -> App:
    if spec is None:
        try:
            return default_app()
        except (ValueError, TerretError) as exc:  # e.g. TERRET_COMPACTION_BUDGET=lots
            raise ConfigurationError(
                f"cannot build the default app from the environment: {exc}") from None
    module_name, _, attr = spec.partition(":")
    # The `terret` entry point's sys.path[0] is its bin directory, not the working directory:
    # put the latter first, so an app module next to where the command runs is found.
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
        factory: Callable[[], App] = getattr(module, attr or "app")
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(f"cannot load app {spec!r}: {exc}") from None
    if not callable(factory):
        raise ConfigurationError(f"cannot load app {spec!r}: {attr or 'app'} is not callable")
    try:
        app = factory()
    except Exception as exc:
        raise ConfigurationError(
            f"cannot load app {spec!r}: {type(exc).__name__}: {exc}") from None
    if not isinstance(app, App):
        raise ConfigurationError(f"{spec} did not return a terret.cli.App")
    return app
