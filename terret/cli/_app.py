"""What a serving CLI process runs: agent definitions (tools are code), the model resolver,
runtime settings. ``--app module:function`` names a function returning an :class:`App`."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

import click

from terret._text import one_line
from terret.cli._extensions import import_from_cwd
from terret.cli._format import NOT_SHOWN, may_hold_secret, scrubbed
from terret.domain.errors import ConfigurationError, TerretError, shown
from terret.domain.keys import KEY_REFUSED, looks_like_key
from terret.runtime.definition import AgentDefinition
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
    echo model, so nothing is sent anywhere unless configured).

    Every ``TERRET_*`` value is checked here, when the app is built: one it cannot use (a spec
    that is not ``provider:model`` or names a provider it does not have, a budget that is not a
    whole number, a summarizer it does not know) is a ``ConfigurationError`` naming the
    variable — before a command acts, not at a session's first step."""
    from terret.adapters.providers import ProviderRegistry
    from terret.runtime.scripted import Reply, ScriptedProvider

    registry = ProviderRegistry.from_env()
    registry.register("scripted", ScriptedProvider(  # served for weeks: keeps no requests
        name="scripted", default=lambda request: Reply(text=_echo(request)), keep=0))
    roles = {"main": "scripted:echo"}
    for role in ("main", "compactor", "titler"):
        variable = f"TERRET_{role.upper()}_MODEL"
        spec = os.environ.get(variable)
        if spec:
            roles[role] = _env_spec(registry, variable, spec)
    config = RuntimeConfig(roles=roles, compaction_budget=_env_budget())
    # Left unset, the runtime's defaults apply (R19, R20): the role summarizer and the role
    # titler on each session's own roles — so a `model set SID compactor …` is honoured — the
    # titler falling back to the first message when no titler role is configured.
    return App(resolver=registry, agents=[AgentDefinition()], config=config,
               summarizer=_env_summarizer())


def _env_spec(resolver: ModelResolver, variable: str, spec: str) -> str:
    """``spec`` from ``variable``, if it is a spec whose provider ``resolver`` has (one it has
    but cannot build here, say without its API key, is left to the first step: the key may be
    where the session is served)."""
    from terret.domain.events import validate_model_spec

    try:
        validate_model_spec(spec)
    except ValueError as exc:
        raise ConfigurationError(f"{_env_value(variable, spec)}: {scrubbed(str(exc), spec)}"
                                 ) from None
    if looks_like_key(spec):  # every session created here would record it
        raise ConfigurationError(f"{_env_value(variable, spec)}: {KEY_REFUSED}")
    problem = resolve_problem(resolver, spec)
    if problem is not None and not problem[1]:
        raise ConfigurationError(f"{_env_value(variable, spec)}: {scrubbed(problem[0], spec)}")
    return spec


def _env_value(variable: str, value: str) -> str:
    """``VARIABLE='value'`` for an error, or the variable alone when its value may be a
    credential (a URL's, a key pasted in the wrong variable): errors reach screens and logs."""
    if may_hold_secret(value):
        return f"{variable} (its value {NOT_SHOWN.strip('()')})"
    return f"{variable}={shown(value)}"


def _env_budget() -> int | None:
    text = os.environ.get("TERRET_COMPACTION_BUDGET", "").strip()
    if not text:
        return None
    if not text.isdigit() or int(text) <= 0:
        raise ConfigurationError(f"{_env_value('TERRET_COMPACTION_BUDGET', text)}: not a number of "
                                 "prompt tokens (a whole number above 0)")
    return int(text)


def _env_summarizer() -> Summarizer | None:
    name = os.environ.get("TERRET_SUMMARIZER", "").strip()
    if not name:
        return None
    if name != "morph":
        raise ConfigurationError(
            f"{_env_value('TERRET_SUMMARIZER', name)}: the one summarizer it names is 'morph' (the "
            "Morph Compact API); unset, compaction uses the compactor role")
    from terret.adapters.summarizers import MorphSummarizer

    return MorphSummarizer()


def resolve_problem(resolver: ModelResolver, spec: str) -> tuple[str, bool] | None:
    """Why ``resolver`` cannot resolve ``spec`` (on one line), and whether it has the provider
    all the same (it cannot build it here: its API key is not in this environment); None when
    it resolves."""
    try:
        resolver.resolve(spec)
    except Exception as exc:  # noqa: BLE001 - any failure to resolve, typed or not
        return " ".join(str(exc).split()), knows_provider(resolver, spec.partition(":")[0])
    return None


def check_resolves(resolver: ModelResolver, spec: str, *, param_hint: str = "'SPEC'",
                   served_here: bool = False) -> None:
    """A spec naming a provider the app does not have would fail the session's next step:
    a usage error on ``param_hint``. A provider it has but cannot build here (its API key is
    not in this shell's environment) is accepted with a warning, since the serving process may
    have what it needs — unless this process is the one to serve it (``served_here``: ``chat``),
    where the first step would fail."""
    from terret.cli._context import note

    problem = resolve_problem(resolver, spec)
    if problem is None:
        return
    message, known = problem
    message, quoted = scrubbed(message, spec), (NOT_SHOWN if may_hold_secret(spec)
                                                else shown(spec))
    if known and not served_here:
        # Cut: not an error line (whose quoted values the CLI cuts), and the resolver's
        # message may quote the spec, thousands of characters.
        note(f"warning: {quoted} cannot be used from here ({one_line(message, 300)}); "
             "recorded: the process serving the session needs it configured")
        return
    hint = "" if served_here else " (check the provider's name, or record it anyway with --force)"
    raise click.BadParameter(f"the app cannot resolve {quoted}: {message}{hint}",
                             param_hint=param_hint)


def knows_provider(resolver: object, name: str) -> bool:
    """Whether the resolver has a provider of that name (configured or registered), built or
    not. A resolver of another kind does not say: then only resolving counts."""
    names = getattr(resolver, "provider_names", None)  # ProviderRegistry's
    return callable(names) and name in names()


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
    try:
        module = import_from_cwd(module_name)
    except (ImportError, ValueError, TypeError) as exc:
        # ValueError: an empty module name; TypeError: a relative one ('..:x')
        raise ConfigurationError(f"cannot load app {shown(spec)}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - the module's own code failed (a SyntaxError)
        raise ConfigurationError(
            f"cannot load app {shown(spec)}: {type(exc).__name__}: {exc}") from None
    try:
        factory: Callable[[], App] = getattr(module, attr or "app")
    except AttributeError as exc:
        raise ConfigurationError(f"cannot load app {shown(spec)}: {exc}") from None
    if not callable(factory):
        raise ConfigurationError(f"cannot load app {shown(spec)}: {attr or 'app'} is not callable")
    try:
        app = factory()
    except SystemExit as exc:
        raise ConfigurationError(
            f"cannot load app {shown(spec)}: it called sys.exit({exc.code!r})") from None
    except Exception as exc:
        raise ConfigurationError(
            f"cannot load app {shown(spec)}: {type(exc).__name__}: {exc}") from None
    if not isinstance(app, App):
        raise ConfigurationError(f"{spec} did not return a terret.cli.App")
    return app
