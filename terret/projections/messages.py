"""What the model sees next (R17): model-visible events in seq order, with everything at or
before the latest compaction's ``upto_seq`` replaced by one user message holding the summary.

Reading costs O(messages since the last compaction), not O(log): the read is one range scan of
the session's primary key, from the latest compaction's boundary on. Rows before the boundary
stay (deleting them on every compaction made rebuilds markedly slower, and the read never
touches them); a purge removes a session's rows. Rows are keyed by a small integer per session
(``message_streams``) rather than the stream's name: the key index is then a fraction of the
size, which is most of the cost of writing a message row during a rebuild.
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from terret.domain.messages import Message, ToolCall
from terret.projections._typed import handler
from terret.projections.base import TypedProjection

if TYPE_CHECKING:  # importing the codec loads every payload class
    from terret.domain.codec import RecordedEvent
    from terret.domain.events import (
        AssistantMessage,
        ContextInjected,
        SessionCompacted,
        ToolResult,
        UserMessage,
    )


def message_of(payload: Any) -> Message | None:
    """What one model-visible event shows the model (None for anything else). The messages
    view and the loop's own bookkeeping both render through this."""
    render = _renderers().get(type(payload))
    return render(payload) if render is not None else None


def _user(p: UserMessage | ContextInjected) -> Message:
    return Message(role="user", text=p.text)


def _assistant(p: AssistantMessage) -> Message:
    calls = tuple(ToolCall(id=c.id, name=c.name, args=dict(c.args)) for c in p.tool_calls)
    return Message(role="assistant", text=p.text, tool_calls=calls)


def _tool(p: ToolResult) -> Message:
    return Message(role="tool", text=p.content, tool_call_id=p.call_id, tool_name=p.name,
                   is_error=p.is_error)


@functools.cache
def _renderers() -> dict[type[Any], Callable[[Any], Message]]:
    """Each model-visible payload class and its renderer (the classes loaded on first use)."""
    from terret.domain import events as ev

    return {ev.UserMessage: _user, ev.ContextInjected: _user,
            ev.AssistantMessage: _assistant, ev.ToolResult: _tool}


class MessagesProjection(TypedProjection):
    name = "messages"
    version = 3  # 3: rows keyed by a per-session integer; 2: rows hold the payload's JSON
    tables = ("messages", "message_streams", "message_summaries")
    schema = """
    CREATE TABLE IF NOT EXISTS message_streams (
        key INTEGER PRIMARY KEY, session TEXT NOT NULL UNIQUE
    );
    CREATE TABLE IF NOT EXISTS messages (
        key INTEGER NOT NULL, seq INTEGER NOT NULL, role TEXT NOT NULL, body BLOB NOT NULL,
        PRIMARY KEY (key, seq)
    );
    CREATE TABLE IF NOT EXISTS message_summaries (
        session TEXT PRIMARY KEY, upto_seq INTEGER NOT NULL, seq INTEGER NOT NULL,
        summary TEXT NOT NULL
    );
    """

    def __init__(self) -> None:
        self._rows: list[tuple[int, int, str, bytes]] = []  # inserts not written yet
        self._keys: dict[str, int] = {}  # the batch's sessions' keys (a rollback forgets them)

    def begin(self) -> None:
        self._rows, self._keys = [], {}

    @handler
    def _on_compacted(self, db: sqlite3.Connection, event: RecordedEvent, p: SessionCompacted
                      ) -> None:
        db.execute("INSERT OR REPLACE INTO message_summaries VALUES (?, ?, ?, ?)",
                   (event.stream, p.upto_seq, event.seq, p.summary))

    @handler
    def _on_message(self, db: sqlite3.Connection, event: RecordedEvent,
                    p: UserMessage | ContextInjected | AssistantMessage | ToolResult) -> None:
        session = event.stream
        key = self._keys.get(session)
        if key is None:
            key = self._keys[session] = _key(db, session)
        # The row keeps the event's own payload (pydantic's serializer, in Rust: no Python
        # encoding per event on the rebuild path); reading renders it with ``message_of``.
        self._rows.append((key, event.seq, event.wire_name, p.__pydantic_serializer__.to_json(p)))

    def flush(self, db: sqlite3.Connection) -> None:
        if self._rows:
            db.executemany("INSERT OR REPLACE INTO messages VALUES (?, ?, ?, ?)", self._rows)
            self._rows = []

    def purge(self, db: sqlite3.Connection, stream: str) -> None:
        db.execute("DELETE FROM messages WHERE key ="
                   " (SELECT key FROM message_streams WHERE session = ?)", (stream,))
        super().purge(db, stream)  # the tables keyed by the stream's name
        self._keys.pop(stream, None)

    def dump(self, db: sqlite3.Connection) -> dict[str, list[tuple[object, ...]]]:
        """The rows by session rather than by key: keys are an internal detail, which
        ``verify`` need not hold equal. Sorted as they are (no column is ever NULL): sorting
        the rows' reprs, message bodies and all, cost a verify more than comparing them."""
        rows = db.execute("SELECT s.session, m.seq, m.role, m.body FROM messages m"
                          " JOIN message_streams s USING (key)").fetchall()
        summaries = db.execute("SELECT * FROM message_summaries").fetchall()
        return {"messages": sorted(rows), "message_summaries": sorted(summaries)}


def _key(db: sqlite3.Connection, session: str) -> int:
    row = db.execute("SELECT key FROM message_streams WHERE session = ?", (session,)).fetchone()
    if row is not None:
        return int(row[0])
    cursor = db.execute("INSERT INTO message_streams (session) VALUES (?)", (session,))
    assert cursor.lastrowid is not None
    return cursor.lastrowid


_ALL = 2**63 - 1
"""The largest seq SQLite's integers hold: no bound."""


def read_messages(db: sqlite3.Connection, stream: str, *, through: int | None = None
                  ) -> list[Message]:
    from terret.domain.catalogue import catalogue  # the payload classes: only when read

    summary = db.execute(
        "SELECT upto_seq, summary FROM message_summaries WHERE session = ?", (stream,)
    ).fetchone()
    out: list[Message] = []
    upto = 0
    if summary is not None:
        upto = summary[0]
        out.append(Message(role="user", text=summary[1]))
    for wire_name, body in db.execute(
        "SELECT role, body FROM messages WHERE key ="
        " (SELECT key FROM message_streams WHERE session = ?) AND seq > ? AND seq <= ?"
        " ORDER BY seq",
        (stream, upto, _ALL if through is None else through),
    ):
        cls = catalogue.payload_class(wire_name)
        message = message_of(cls.model_validate_json(body)) if cls is not None else None
        if message is not None:
            out.append(message)
    return out
