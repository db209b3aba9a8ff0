"""The per-agent allow-list (R23): deny by default; the active patterns are the session's last
``policy/updated`` (unless a ``policy/reset`` withdrew it), else the floor of this process's agent
definition (the serving release's, R32); a session that cannot be read fails closed.

The patterns are read from the session aggregate as the store holds it at the moment of the call
(``SessionWriter.load`` folds the stream's tail into this process's copy, R30), not from a view:
a view may run behind the log, or — restored from another store — ahead of it, and either would
let a call run that the recorded policy denies. The writer's cached aggregate is the memo; the
read per call is the tail of one stream, so an update from any process takes effect on the very
next call."""

from __future__ import annotations

import fnmatch
import logging
from collections.abc import Callable, Sequence
from uuid import UUID

from terret.runtime.tools import CallContext, Tool, Veto

log = logging.getLogger("terret.allowlist")

PolicyReader = Callable[[UUID], "list[str] | None"]
"""Returns the session's recorded patterns as the log holds them now, None if it recorded none;
raises if the session cannot be read."""


class AllowList:
    def __init__(self, floor: Sequence[str], read_policy: PolicyReader) -> None:
        self.floor = list(floor)
        self._read = read_policy

    def active(self, session_id: UUID) -> list[str] | None:
        """The active patterns, or None when the session cannot be read (deny all)."""
        try:
            recorded = self._read(session_id)
        except Exception:
            log.warning("allow-list: session %s cannot be read; denying every call",
                        session_id, exc_info=True)
            return None
        return recorded if recorded is not None else self.floor

    def __call__(self, tool: Tool, ctx: CallContext) -> Veto | None:
        patterns = self.active(ctx.session_id)
        if patterns is None:
            return Veto(f"{tool.name} denied: the session's policy cannot be read")
        if any(fnmatch.fnmatchcase(tool.name, p) for p in patterns):
            return None
        return Veto(f"{tool.name} is not allowed by the session's policy")
