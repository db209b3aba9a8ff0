"""The per-agent allow-list (R23): deny by default; the active patterns are the session's last
``policy/updated``, else the install-time floor; a session that cannot be read fails closed.
The active set is memoised per session. The ``policy/updated`` listener invalidates it, and so
does the agent before a step's calls when its session aggregate has seen a newer
``policy/updated`` than the memo (the listener runs behind the log), so an update takes effect
on the very next call. An unknown session is never cached, so its deny-all cannot harden into a
stale answer."""

from __future__ import annotations

import fnmatch
import logging
import threading
from collections.abc import Callable, Sequence
from uuid import UUID

from terret.domain.codec import RecordedEvent
from terret.runtime.tools import CallContext, Tool, Veto

log = logging.getLogger("terret.allowlist")

PolicyReader = Callable[[UUID], "list[str] | None"]
"""Returns the session's recorded patterns, None if it recorded none; raises if unreadable."""
SessionKnown = Callable[[UUID], bool]


class AllowList:
    def __init__(self, floor: Sequence[str], read_policy: PolicyReader,
                 known: SessionKnown) -> None:
        self.floor = list(floor)
        self._read = read_policy
        self._known = known
        self._cache: dict[UUID, list[str]] = {}
        self._lock = threading.Lock()

    def active(self, session_id: UUID) -> list[str] | None:
        """The active patterns, or None when the session cannot be read (deny all)."""
        with self._lock:
            cached = self._cache.get(session_id)
        if cached is not None:
            return cached
        try:
            if not self._known(session_id):
                return None
            recorded = self._read(session_id)
        except Exception:
            log.warning("allow-list: session %s cannot be read; denying every call",
                        session_id, exc_info=True)
            return None
        patterns = recorded if recorded is not None else self.floor
        with self._lock:
            self._cache[session_id] = patterns
        return patterns

    def __call__(self, tool: Tool, ctx: CallContext) -> Veto | None:
        patterns = self.active(ctx.session_id)
        if patterns is None:
            log.warning("allow-list: %s denied in unreadable session %s", tool.name,
                        ctx.session_id)
            return Veto(f"{tool.name} denied: the session's policy cannot be read")
        if any(fnmatch.fnmatchcase(tool.name, p) for p in patterns):
            return None
        return Veto(f"{tool.name} is not allowed by the session's policy")

    def forget(self, session_id: UUID) -> None:
        """Drop the memoised set: the next call reads the policy view again."""
        with self._lock:
            self._cache.pop(session_id, None)

    def on_policy_updated(self, event: RecordedEvent) -> None:
        # Invalidate rather than overwrite: listeners may run behind a fresher read of the
        # view, and an older event's patterns must never replace a newer policy.
        if event.session_id is not None:
            self.forget(event.session_id)
