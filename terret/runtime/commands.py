"""The command service: every domain command on a session, in one place.

``SessionCommands`` is what the runtime (``Runtime.inject``, ``approve``, …), the ``terret``
command line and any future HTTP API call to change a session. Each command loads the session
caught up with the store (R30), lets the ``Session`` aggregate check its rules, and appends what
it recorded through the ``SessionWriter`` (expected versions, R5). Nothing here knows which
process runs the session's turn: a command's effect reaches that process through the log (the
store is the bus). What only the calling process can do besides — wake its own parked turn,
dispose its own idle agent — the runtime does after the command returns.

The commands that need more than the log — a turn (``run_turn``, ``resume_turn``), a
compaction (a summarizer), a title from a model — are the runtime's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any
from uuid import UUID

from terret.domain.errors import SessionNotFound

if TYPE_CHECKING:
    from terret.domain.events import Actor
    from terret.domain.repository import SessionRepository
    from terret.domain.session import Session
    from terret.domain.store import AppendResult, EventStore
    from terret.runtime.writer import SessionWriter

VERDICTS = ("approved", "denied")
DOUBT_VERDICTS = ("rerun", "skipped")


class SessionCommands:
    """Domain commands on sessions, through one ``SessionWriter``."""

    def __init__(self, writer: SessionWriter) -> None:
        self.writer = writer

    @classmethod
    def on(cls, store: EventStore) -> SessionCommands:
        """Commands on ``store`` with a writer of their own (a one-shot process: the CLI)."""
        from terret.domain.repository import SessionRepository
        from terret.runtime.writer import SessionWriter

        return cls(SessionWriter(SessionRepository(store)))

    @property
    def repository(self) -> SessionRepository:
        return self.writer.repository

    def exists(self, session_id: UUID) -> bool:
        return self.repository.exists(session_id)

    def require(self, session_id: UUID) -> None:
        if not self.exists(session_id):
            raise SessionNotFound(f"no session {session_id}")

    # --- creation and end -----------------------------------------------------------------

    def create(self, *, agent: str = "default", roles: dict[str, str] | None = None,
               policy_floor: Sequence[str] | None = None, agent_revision: int = 1,
               session_id: UUID | None = None) -> UUID:
        """Record ``session/started``: the agent definition that serves the session, its model
        roles and, when known, its allow-list floor."""
        from terret.domain.session import Session

        session = Session.start(session_id, agent=agent, agent_revision=agent_revision,
                                roles=dict(roles or {}), policy_floor=policy_floor)
        self.writer.create(session)
        return session.id

    def close(self, session_id: UUID, *, by: Actor, reason: str | None = None) -> None:
        """Record ``session/closed``; refused while a turn is open (cancel it first)."""
        self._run(session_id, lambda s: s.close(by=by, reason=reason))

    def purge(self, session_id: UUID, *, by: Actor, reason: str | None = None,
              max_age: int | None = None) -> None:
        """Retention (R27): delete a closed session's stream (or expire it after ``max_age``
        seconds where the store can); the deletion is recorded first."""
        from terret.runtime.retention import purge_session

        purge_session(self.repository, session_id, by=by, reason=reason, max_age=max_age)
        self.writer.forget(session_id)

    # --- what rides the log into the running turn (commutative, R5) ------------------------

    def inject(self, session_id: UUID, text: str, *, wake: bool = False) -> str:
        """Queue ``text`` in the durable inbox (R24); returns its inbox id."""
        inbox_id, _ = self.writer.execute(session_id, lambda s: s.queue(text, wake=wake))
        return str(inbox_id)

    def cancel(self, session_id: UUID, *, by: Actor, reason: str | None = None) -> bool:
        """Record ``turn/cancel_requested`` (R13); the turn's owner honours it. False, with
        nothing written, when the turn's cancel is recorded already."""
        recorded, _ = self.writer.execute(
            session_id, lambda s: s.request_cancel(by=by, reason=reason))
        return recorded

    def approve(self, session_id: UUID, call_id: str, *, by: Actor,
                reason: str | None = None) -> None:
        self.resolve(session_id, call_id, "approved", by=by, reason=reason)

    def deny(self, session_id: UUID, call_id: str, *, by: Actor, reason: str) -> None:
        self.resolve(session_id, call_id, "denied", by=by, reason=reason)

    def resolve(self, session_id: UUID, call_id: str, verdict: str, *, by: Actor,
                reason: str | None = None, name: str | None = None,
                args: dict[str, Any] | None = None) -> None:
        """Record a verdict; ``ApprovalNotPending`` unless the call is pending in the open turn
        (R11) — and, given ``name`` (and ``args``), pending for that tool (and arguments): the
        request the caller decided on, not another one a model made under the same id."""
        if verdict not in VERDICTS:
            raise ValueError(f"a verdict is one of {', '.join(VERDICTS)}, not {verdict!r}")
        self._run(session_id, lambda s: s.resolve_approval(call_id, verdict, by=by,
                                                           reason=reason, name=name, args=args))

    def resolve_in_doubt(self, session_id: UUID, call_id: str, verdict: str, *, by: Actor,
                         reason: str | None = None, name: str | None = None,
                         args: dict[str, Any] | None = None) -> None:
        """Record a verdict on a call in doubt (``rerun`` or ``skipped``); ``CallNotInDoubt``
        unless the call is in doubt in the open turn (R15), for ``name`` and ``args`` when
        given."""
        if verdict not in DOUBT_VERDICTS:
            raise ValueError(f"a verdict on a call in doubt is one of "
                             f"{', '.join(DOUBT_VERDICTS)}, not {verdict!r}")
        self._run(session_id, lambda s: s.resolve_in_doubt(call_id, verdict, by=by,
                                                           reason=reason, name=name, args=args))

    def set_budget(self, session_id: UUID, limit: float | None, *, by: Actor,
                   reason: str | None = None) -> None:
        """Record the session's own spend budget (``budget/set``; None: the deployment's
        default again). A turn parked on its budget goes on if the new one covers its next
        step."""
        self._run(session_id, lambda s: s.set_budget(limit, by=by, reason=reason))

    def set_policy(self, session_id: UUID, patterns: Sequence[str], *, by: Actor) -> None:
        """Replace the allow-list (R23): the very next tool call uses it, in any process. No
        patterns is deny-all."""
        if not isinstance(patterns, str | bytes) and isinstance(patterns, Iterable):
            # Read once: a command re-run on a conflict would find a generator empty, and
            # record deny-all.
            patterns = list(patterns)
        self._run(session_id, lambda s: s.update_policy(patterns, by=by))

    def reset_policy(self, session_id: UUID, *, by: Actor) -> None:
        """Withdraw the recorded allow-list: the agent definition's floor applies again, that
        of the release running each call."""
        self._run(session_id, lambda s: s.reset_policy(by=by))

    def set_model(self, session_id: UUID, role: str, spec: str, *, by: Actor,
                  check: Callable[[str], None] | None = None, not_a_key: bool = False) -> None:
        """Point a model role at a ``provider:model`` spec; the next step uses it. ``check``
        (the caller's providers resolving the spec, say) runs after the session's own rules
        and before anything is written: what it raises refuses the command. A spec whose
        model looks like an API key is refused unless ``not_a_key``."""

        def command(s: Session) -> None:
            s.set_model(role, spec, by=by, not_a_key=not_a_key)
            if check is not None:
                check(spec)

        self._run(session_id, command)

    def set_title(self, session_id: UUID, title: str, *, by: Actor) -> str:
        """Record an explicit title (it replaces the automatic one); returns it as stored."""
        value, _ = self.writer.execute(session_id, lambda s: s.title(title, by=by))
        return str(value)

    # --- reading what the commands decide on -----------------------------------------------

    def policy_floor(self, session_id: UUID) -> list[str] | None:
        """The allow-list floor the session recorded when it started, None if it recorded
        none (then the serving agent definition's applies)."""
        from terret.domain.codec import decode
        from terret.domain.store import session_stream

        first = self.repository.store.read_stream(session_stream(session_id), limit=1)
        if not first:
            raise SessionNotFound(f"no session {session_id}")
        floor = getattr(decode(first[0]).payload, "policy_floor", None)
        return list(floor) if floor is not None else None

    def _run(self, session_id: UUID, command: object) -> AppendResult | None:
        _, result = self.writer.execute(session_id, command)  # type: ignore[arg-type]
        return result
