"""What the model sees next (R17): model-visible events in seq order, with everything at or
before the latest compaction's ``upto_seq`` replaced by one user message holding the summary.

Rows at or before a compaction's boundary are deleted when it lands, so the view holds only the
messages since the last compaction and reading it costs O(those messages), not O(log).
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from terret.domain.codec import RecordedEvent
from terret.domain.messages import Message, ToolCall
from terret.projections.base import Projection

_dumps = json.JSONEncoder(separators=(",", ":")).encode  # json.dumps(…, separators=…)


class MessagesProjection(Projection):
    name = "messages"
    handles = frozenset(
        {"user/message", "context/injected", "assistant/message", "tool/result",
         "session/compacted"}
    )
    tables = ("messages", "message_summaries")
    schema = """
    CREATE TABLE IF NOT EXISTS messages (
        session TEXT NOT NULL, seq INTEGER NOT NULL, role TEXT NOT NULL, body TEXT NOT NULL,
        PRIMARY KEY (session, seq)
    ) WITHOUT ROWID;
    CREATE TABLE IF NOT EXISTS message_summaries (
        session TEXT PRIMARY KEY, upto_seq INTEGER NOT NULL, seq INTEGER NOT NULL,
        summary TEXT NOT NULL
    );
    """

    def __init__(self) -> None:
        self._rows: list[tuple[str, int, str, str]] = []  # inserts a batch has not written yet

    def begin(self) -> None:
        self._rows = []

    def process(self, db: sqlite3.Connection, event: RecordedEvent) -> None:
        session = event.stream
        p: Any = event.payload
        name = event.wire_name
        if name == "session/compacted":
            self.flush(db)  # in log order: the messages it replaces are written first
            db.execute(
                "INSERT OR REPLACE INTO message_summaries VALUES (?, ?, ?, ?)",
                (session, p.upto_seq, event.seq, p.summary),
            )
            db.execute("DELETE FROM messages WHERE session = ? AND seq <= ?",
                       (session, p.upto_seq))
            return
        if name == "assistant/message":
            role, body = "assistant", {"text": p.text, "calls": [
                [c.id, c.name, c.args] for c in p.tool_calls]}
        elif name == "tool/result":
            role, body = "tool", {"text": p.content, "id": p.call_id, "name": p.name,
                                  "error": p.is_error}
        else:
            role, body = "user", {"text": p.text}
        self._rows.append((session, event.seq, role, _dumps(body)))

    def flush(self, db: sqlite3.Connection) -> None:
        if self._rows:
            db.executemany("INSERT OR REPLACE INTO messages VALUES (?, ?, ?, ?)", self._rows)
            self._rows = []


def read_messages(db: sqlite3.Connection, stream: str) -> list[Message]:
    summary = db.execute(
        "SELECT upto_seq, summary FROM message_summaries WHERE session = ?", (stream,)
    ).fetchone()
    out: list[Message] = []
    upto = 0
    if summary is not None:
        upto = summary[0]
        out.append(Message(role="user", text=summary[1]))
    for seq, role, body in db.execute(
        "SELECT seq, role, body FROM messages WHERE session = ? AND seq > ? ORDER BY seq",
        (stream, upto),
    ):
        del seq
        data = json.loads(body)
        if role == "assistant":
            calls = tuple(ToolCall(id=c[0], name=c[1], args=c[2]) for c in data["calls"])
            out.append(Message(role="assistant", text=data["text"], tool_calls=calls))
        elif role == "tool":
            out.append(Message(role="tool", text=data["text"], tool_call_id=data["id"],
                               tool_name=data["name"], is_error=data["error"]))
        else:
            out.append(Message(role="user", text=data["text"]))
    return out

