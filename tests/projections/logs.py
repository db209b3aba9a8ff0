"""Writing session logs for the projection tests: every event goes through the ``Session``
aggregate and ``SessionRepository``, so the logs are valid by construction."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any
from uuid import UUID

from terret import Actor, Session, SessionRepository
from terret.domain.events import ToolCallData, UsageData
from terret.domain.store import AppendResult, EventStore

MODEL = "openrouter:openai/gpt-4o"
OPERATOR = Actor(actor="operator", id="ops")


def positions(store: EventStore, after: int = 0) -> list[int]:
    """Every record's position after ``after``, in log order. Positions need not be consecutive
    (EventStoreDB's are commit positions), so tests count events with this, not by subtracting."""
    out: list[int] = []
    while page := store.read_all(after=after, limit=1000):
        out.extend(r.position for r in page)
        after = page[-1].position
    return out


class Writer:
    """Loads a session, runs the commands on it, saves — one append per ``do``."""

    def __init__(self, store: EventStore) -> None:
        self.store = store
        self.repo = SessionRepository(store)

    def start(self, *, agent: str = "default", roles: dict[str, str] | None = None
              ) -> UUID:
        session = Session.start(agent=agent, roles=roles or {"main": MODEL})
        self.repo.save(session)
        return session.id

    def do(self, session_id: UUID, *commands: Callable[[Session], Any]) -> AppendResult:
        session = self.repo.get(session_id)
        for command in commands:
            command(session)
        result = self.repo.save(session)
        assert result is not None, "the command appended nothing"
        return result

    def step(self, session_id: UUID, text: str = "", *,
             calls: Sequence[tuple[str, str, dict[str, Any]]] = (),
             results: Sequence[str] | None = None, usage: UsageData | None = None,
             model: str = MODEL, end: bool = True) -> AppendResult:
        """One step of the open turn: step/start, assistant/message, a result per call
        (``results`` gives their contents), step/end (unless ``end`` is False)."""

        def run(s: Session) -> None:
            s.start_step(model)
            s.record_assistant(text, [ToolCallData(id=i, name=n, args=a) for i, n, a in calls])
            if results is not None:
                for (call_id, name, _), content in zip(calls, results, strict=True):
                    s.record_tool_result(call_id, name, content)
            if end:
                s.end_step(usage)

        return self.do(session_id, run)

    def turn(self, session_id: UUID, text: str, answer: str = "ok", *,
             usage: UsageData | None = None) -> AppendResult:
        """A whole one-step turn without tool calls."""

        def run(s: Session) -> None:
            s.start_turn(text=text)
            s.start_step(MODEL)
            s.record_assistant(answer)
            s.end_step(usage)
            s.end_turn("completed")

        return self.do(session_id, run)
