"""``Views``: the read side in one object — what the runtime and the CLI query."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from terret.domain.errors import ProjectionHalted
from terret.domain.messages import Message
from terret.domain.store import EventStore, as_session_id, session_id_of, session_stream
from terret.projections import approvals, messages, policy, sessions, status, title, usage
from terret.projections.base import Projection, ViewStore
from terret.projections.sessions import PurgeRecord, SessionSummary
from terret.projections.status import SessionStatus
from terret.projections.usage import UsageTotals


def default_projections() -> list[Projection]:
    return [
        messages.MessagesProjection(),
        usage.UsageProjection(),
        title.TitleProjection(),
        policy.PolicyProjection(),
        policy.ModelsProjection(),
        approvals.ApprovalsProjection(),
        status.StatusProjection(),
        sessions.SessionsProjection(),
    ]


def _stream(session: UUID | str) -> str:
    """The stream of a session given as the runtime takes it (a UUID, its string in any case,
    its stream name): a stream name passed through as written missed an upper-case id, and
    junk raised ValueError or AttributeError rather than ``SessionNotFound``."""
    if isinstance(session, UUID):
        return session_stream(session)
    return session_stream(as_session_id(session))


def _ids(streams: list[str]) -> list[UUID]:
    return [sid for stream in streams if (sid := session_id_of(stream)) is not None]


class Views:
    def __init__(self, store: ViewStore) -> None:
        self.store = store

    def messages(self, session: UUID | str, *, through: int | None = None,
                 reaching: int | None = None) -> list[Message]:
        """The model's context; with ``through``, as it stood at that seq (a summarizer reads
        no further than its mark). With ``reaching`` (a store position the caller waited
        for), ``ProjectionHalted`` when the view halted before it: it holds an old
        conversation, which a model would be asked with, or a summary made of, silently."""
        if reaching is not None:
            self._require_reached("messages", reaching)
        with self.store.reading() as db:
            return messages.read_messages(db, _stream(session), through=through)

    def _require_reached(self, name: str, position: int) -> None:
        """``ProjectionHalted`` when ``name`` halted before ``position`` (behind and not
        halted: the caller's wait is what lacks, not the view)."""
        if self.store.tracked(name) >= position:
            return
        fault = self.store.fault(name)
        if fault is not None:
            raise ProjectionHalted(name, fault[0], f"{fault[1]} (a view halted before position "
                                   f"{position}, which it must hold: `terret doctor` says what "
                                   "to do)")

    def usage(self, session: UUID | str) -> UsageTotals:
        with self.store.reading() as db:
            return usage.session_usage(db, _stream(session))

    def usage_by_turn(self, session: UUID | str) -> dict[int, UsageTotals]:
        with self.store.reading() as db:
            return usage.usage_by_turn(db, _stream(session))

    def usage_by_model(self, session: UUID | str | None = None) -> dict[str, UsageTotals]:
        with self.store.reading() as db:
            return usage.usage_by_model(db, _stream(session) if session else None)

    def upkeep_usage(self, session: UUID | str | None = None) -> dict[str, UsageTotals]:
        """What the upkeep's model calls cost (``usage/recorded``), by purpose
        (``compaction``, ``title``), of one session or all; ``steps`` counts the calls. Apart
        from :meth:`usage`, which sums the steps (R21)."""
        with self.store.reading() as db:
            return usage.upkeep_usage(db, _stream(session) if session else None)

    def last_prompt_tokens(self, session: UUID | str, turn: int) -> int | None:
        with self.store.reading() as db:
            return usage.last_prompt_tokens(db, _stream(session), turn)

    def title(self, session: UUID | str) -> str | None:
        with self.store.reading() as db:
            return title.read_title(db, _stream(session))

    def policy(self, session: UUID | str) -> list[str] | None:
        with self.store.reading() as db:
            return policy.read_policy(db, _stream(session))

    def roles(self, session: UUID | str) -> dict[str, str]:
        with self.store.reading() as db:
            return policy.read_roles(db, _stream(session))

    def pending(self, session: UUID | str | None = None) -> list[approvals.PendingApproval]:
        with self.store.reading() as db:
            return approvals.pending(db, _stream(session) if session else None)

    def verdict_for(self, session: UUID | str, call_id: str, name: str,
                    args: dict[str, Any]) -> approvals.RecordedVerdict | None:
        with self.store.reading() as db:
            return approvals.verdict_for(db, _stream(session), call_id, name, args)

    def in_doubt(self, session: UUID | str | None = None
                 ) -> list[tuple[SessionStatus, dict[str, Any]]]:
        """Calls in doubt of open turns (one session's, or all): ``(status, {id, name,
        args})``."""
        with self.store.reading() as db:
            return status.in_doubt_calls(db, _stream(session) if session else None)

    def parked_on_budget(self) -> list[SessionStatus]:
        with self.store.reading() as db:
            return status.parked_on_budget(db)

    def status(self, session: UUID | str) -> SessionStatus | None:
        with self.store.reading() as db:
            return status.read_status(db, _stream(session))

    def resumable(self, session: UUID | str) -> bool:
        found = self.status(session)
        return bool(found and found.resumable and not found.closed)

    def resumable_sessions(self) -> list[UUID]:
        with self.store.reading() as db:
            return _ids(status.resumable_sessions(db))

    def sessions_to_wake(self) -> list[UUID]:
        with self.store.reading() as db:
            return _ids(status.sessions_to_wake(db))

    def sessions(self, *, status: str | None = None, limit: int | None = None,
                 **filters: Any) -> list[SessionSummary]:
        """Most recently active first; ``filters``: ``agent``, ``title``, ``since``,
        ``until``, ``offset`` (see ``terret.projections.sessions.list_sessions``)."""
        with self.store.reading() as db:
            return sessions.list_sessions(db, status=status, limit=limit, **filters)

    def state(self, session: UUID | str) -> Any:
        """The session's ``SessionState`` as the status view holds it (None if unknown)."""
        with self.store.reading() as db:
            return status.read_state(db, _stream(session))

    def summary(self, session: UUID | str) -> SessionSummary | None:
        with self.store.reading() as db:
            return sessions.get_summary(db, _stream(session))

    def purge_of(self, session: UUID | str) -> PurgeRecord | None:
        """The session's purge, if one is recorded (its last)."""
        with self.store.reading() as db:
            found = sessions.purges(db, _stream(session))
        return found[-1] if found else None

    def require_not_purged(self, session: UUID | str, store: EventStore) -> None:
        """``PurgeUnfinished`` (or ``SessionExpiring``) for a session whose purge is recorded:
        the views forgot it, and would show it empty (``PurgeRecord.refuse``)."""
        purge = self.purge_of(session)
        if purge is not None:
            purge.refuse(store)

    def purges(self) -> list[PurgeRecord]:
        """Every purge recorded, oldest first."""
        with self.store.reading() as db:
            return sessions.purges(db)

