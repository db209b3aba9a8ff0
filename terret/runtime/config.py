"""``RuntimeConfig``: the deployment settings of a ``Runtime`` (a module of its own: the runtime's
parts read their values from it without importing the runtime)."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field

from terret.domain.errors import ConfigurationError, shown
from terret.domain.events import validate_model_spec, validate_role
from terret.domain.keys import KEY_REFUSED, looks_like_key
from terret.domain.session import MAX_STEPS

_WHOLE = ("max_steps", "max_agents")
_OPTIONAL_WHOLE = ("compaction_budget",)
LEAST_LEASE_TTL = 0.5
"""The shortest lease a worker can keep: it beats every fifth of it, and a beat later than
that (a busy host, a slow store) would end the lease under a live worker."""

_SECONDS = ("wait_timeout", "lease_ttl")
_MOST_SECONDS = 366 * 86400.0
"""The longest ``wait_timeout`` and ``lease_ttl``: each becomes a clock time (a lease's end in
the log, a thread's wait), which past a few centuries Python cannot represent; neither has a
meaning for no limit."""
_OPTIONAL_SECONDS = ("approval_max_wait", "tool_timeout", "upkeep_timeout")


@dataclass
class RuntimeConfig:
    """Deployment settings. ``roles`` maps model roles to ``provider:model`` specs; sessions
    record their own at start and ``model/set`` changes them."""

    roles: dict[str, str] = field(default_factory=lambda: {"main": "scripted:default"})
    max_steps: int = MAX_STEPS
    max_agents: int = 128
    compaction_budget: int | None = None
    approval_max_wait: float | None = None
    spend_cap: float | None = None
    """The default spend budget (lifetime cost) of every session: a turn whose next step would
    pass it parks until a budget covers it (``set_budget``, ``terret budget set``)."""
    wait_timeout: float = 30.0
    lease_ttl: float = 15.0
    """Seconds a worker's ownership of a session outlives its last heartbeat (R28, R29): after
    a crash another worker takes the open turn over this long after the last beat."""
    tool_timeout: float | None = None
    """Seconds a tool's handler may run, for tools without their own ``timeout``; None: no
    limit."""
    upkeep_timeout: float | None = 300.0
    """Seconds the between-turn upkeep waits for a summarizer's summary or a titler's title
    before it gives up on it (a compaction declined, the first message as the title): a hung
    one held one of the few upkeep threads for good. None: no limit."""

    def __post_init__(self) -> None:
        """Each value checked when the config is made (``ConfigurationError`` naming the
        field): a negative cap, a zero timeout or a NaN budget failed every turn later, or
        switched a limit off silently."""
        if not isinstance(self.roles, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in self.roles.items()):
            raise ConfigurationError("RuntimeConfig.roles maps role names to 'provider:model' "
                                     f"specs, not a {type(self.roles).__name__} of others")
        for role, spec in self.roles.items():
            try:  # here, not at the first create_session: a spec is recorded in the log
                validate_role(role)
                validate_model_spec(spec)
                if looks_like_key(spec):
                    raise ValueError(KEY_REFUSED)
            except ValueError as exc:  # its message never quotes a spec (it may hold a key)
                raise ConfigurationError(f"RuntimeConfig.roles: role {role[:40]!r}: {exc}") \
                    from None
        self._check_numbers()

    def _check_numbers(self) -> None:
        for name in (*_WHOLE, *_OPTIONAL_WHOLE):
            value = getattr(self, name)
            if value is None and name in _OPTIONAL_WHOLE:
                continue
            if type(value) is not int or value < 1:
                raise ConfigurationError(f"RuntimeConfig.{name} is a whole number from 1, "
                                         f"not {value!r}")
        for name in (*_SECONDS, *_OPTIONAL_SECONDS, "spend_cap"):
            value = getattr(self, name)
            if value is None and name not in _SECONDS:
                continue
            finite = name == "spend_cap"
            if (isinstance(value, bool) or not isinstance(value, int | float)
                    # an int past a float's range (10**400) failed every clock sum later
                    or (isinstance(value, int) and abs(value) > sys.float_info.max)
                    or math.isnan(value) or value < 0
                    or (value == 0 and not finite) or (finite and math.isinf(value))):
                what = "a finite amount from 0" if finite else "a number of seconds above 0"
                raise ConfigurationError(f"RuntimeConfig.{name} is {what}, not "
                                         f"{shown(value)}")
            if name == "lease_ttl" and value < LEAST_LEASE_TTL:
                # Beaten every fifth of it: a beat late by a scheduler's hiccup lost the
                # lease, and the worker its own session (LostOwnership) — refused, not slow.
                raise ConfigurationError(f"RuntimeConfig.lease_ttl is at least "
                                         f"{LEAST_LEASE_TTL:g} seconds, not {shown(value)}")
            if name in _SECONDS and value > _MOST_SECONDS:
                raise ConfigurationError(f"RuntimeConfig.{name} is at most 366 days "
                                         f"({_MOST_SECONDS:.0f} seconds), not {value!r}")
