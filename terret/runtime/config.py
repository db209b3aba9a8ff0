"""``RuntimeConfig``: the deployment settings of a ``Runtime`` (a module of its own: the runtime's
parts read their values from it without importing the runtime)."""

from __future__ import annotations

from dataclasses import dataclass, field

from terret.domain.session import MAX_STEPS


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
