"""The Runtime's methods take a session as its id in any of the forms the views take."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Concatenate, ParamSpec, TypeVar
from uuid import UUID

from terret.domain.errors import RuntimeStopping, SessionNotFound
from terret.domain.store import as_session_id

P = ParamSpec("P")
T = TypeVar("T")
R = TypeVar("R")


def takes_session(method: Callable[Concatenate[R, UUID, P], T]
                  ) -> Callable[Concatenate[R, UUID | str, P], T]:
    """``method``'s session argument as a ``UUID``, given a ``UUID``, its string form or the
    stream name ``session-<uuid>`` (``SessionNotFound`` for anything else, before any read);
    on a closed runtime, ``RuntimeStopping`` (``require_open``)."""
    @functools.wraps(method)
    def with_session_id(self: R, session_id: UUID | str, *args: P.args,
                        **kwargs: P.kwargs) -> T:
        require_open(self)
        sid = as_session_id(session_id)
        try:
            return method(self, sid, *args, **kwargs)
        except SessionNotFound:
            # Purged by another process, say: an agent held for it here holds nothing.
            gone = getattr(self, "session_gone", None)
            if gone is not None:
                gone(sid)
            raise

    return with_session_id


def require_open(runtime: object) -> None:
    """``RuntimeStopping`` once the runtime is closed: its views are closed and its worker
    gone — a read failed with SQLite's own error, and a write went to the log from a runtime
    that no longer serves anything."""
    if getattr(runtime, "closed", False):
        raise RuntimeStopping("this runtime is closed; make a new one to go on")
