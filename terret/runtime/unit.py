"""The turn's unit of work and the model's context that follows it.

A step's events are recorded in as few durable appends as the loop can: the last tool result of
a step and its ``step/end`` are *carried* and ride with whatever the loop appends next (the next
``step/start``, or the ``turn/end``). :class:`StepWork` holds that carried part and records it,
with the next command, in one append through the ``SessionWriter`` — after eventsourcing's
``Application.save``/``ProcessingEvent``: collect, commit once, and hand what was committed
(:class:`Committed`) to whoever follows it — here :class:`ModelContext`, the model's messages
kept in step with the agent's own appends so that a step needs no view read.

Lifecycle: ``carry`` (collect) → ``commit`` (one append of the carried part and the command; on
a failure the carried part stays carried) → ``on_commit`` → ``discard`` when a turn stops without
writing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from terret.domain.messages import Message
from terret.domain.session import Session
from terret.projections.messages import message_of
from terret.runtime.writer import SessionWriter

Command = Callable[[Session], Any]


@dataclass(frozen=True, slots=True)
class Committed:
    """One append of the unit of work: the version it followed, the payloads it recorded, the
    store position and stream version it reached."""

    base: int
    payloads: list[Any]
    position: int
    version: int


class StepWork:
    """The unit of work of one agent's turns (see the module's docstring)."""

    __slots__ = ("_carried", "_fence", "_on_commit", "_session_id", "_writer", "position",
                 "version")

    def __init__(self, writer: SessionWriter, session_id: UUID, *,
                 fence: Callable[[Session], None],
                 on_commit: Callable[[Committed], None]) -> None:
        self._writer = writer
        self._session_id = session_id
        self._fence = fence
        self._on_commit = on_commit
        self._carried: Command | None = None
        self.position = 0
        """The store position of this unit's last append (read-your-writes waits for it)."""
        self.version = 0

    @property
    def carrying(self) -> bool:
        return self._carried is not None

    def carry(self, command: Command) -> None:
        """Collect ``command``: it is recorded with the next ``commit``."""
        self._carried = command

    def discard(self) -> None:
        """Forget the carried part (the turn stops without writing, or starts afresh)."""
        self._carried = None

    def commit(self, command: Command, *, owner: bool = True) -> Any:
        """Record the carried part and ``command`` in one append; returns what ``command``
        returned. ``owner``: the lease's fence guards the append (R28) and the writer starts
        from its own copy. If the append fails, the carried part stays carried."""
        carried, self._carried = self._carried, None
        fence = self._fence if owner else None
        base = 0
        payloads: list[Any] = []

        def run(s: Session) -> Any:
            nonlocal base, payloads
            if fence is not None:
                fence(s)  # R28: only the lease holder's writes land
            base = s.version  # the version this attempt appends after
            if carried is not None:
                carried(s)
            value = command(s)
            payloads = [getattr(e, "payload", None) for e in s.pending_events]
            return value

        try:
            value, result = self._writer.execute(self._session_id, run, owner=owner)
        except BaseException:
            self._carried = carried
            raise
        if result is not None:
            self.position, self.version = result.position, result.version
            self._on_commit(Committed(base, payloads, result.position, result.version))
        return value

    def flush(self) -> None:
        """Record the carried part now, if there is one."""
        if self._carried is not None:
            self.commit(_nothing)


def _nothing(s: Session) -> None:
    return None


class ModelContext:
    """The messages of the model's last request, kept in step with the agent's own appends:
    while nothing else lands in the session, the next request is these messages plus what those
    appends show the model, exactly as the messages projection renders them. Emptied whenever it
    cannot follow (something else landed, a compaction, a parked turn): the next step then reads
    the view."""

    __slots__ = ("_messages", "_version")

    def __init__(self) -> None:
        self._messages: list[Message] | None = None
        self._version = 0

    def messages(self) -> list[Message] | None:
        """A copy of the followed messages, or None: read the view."""
        return list(self._messages) if self._messages is not None else None

    def start(self, messages: list[Message], version: int) -> None:
        """Follow from ``messages``, the view as read at stream ``version``."""
        self._messages = list(messages)
        self._version = version

    def drop(self) -> None:
        self._messages = None

    def follow(self, committed: Committed) -> None:
        if self._messages is None:
            return
        rendered = _rendered(committed.payloads) if committed.base == self._version else None
        if rendered is None:
            self._messages = None  # something else landed (or a compaction): read the view
            return
        self._messages.extend(rendered)
        self._version = committed.version


def _rendered(payloads: list[Any]) -> list[Message] | None:
    """What these events show the model, as the messages projection renders them; None when
    one of them is something the loop does not render itself (a compaction, a model-visible
    extension event): the caller then reads the view."""
    out: list[Message] = []
    for p in payloads:
        message = message_of(p)
        if message is not None:
            out.append(message)
        elif getattr(p, "model_visible", False):
            return None
    return out
