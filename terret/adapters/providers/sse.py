"""A small, fast Server-Sent Events decoder over raw byte chunks.

It works on bytes and hands ``data`` payloads on as bytes, because ``json.loads`` accepts bytes
and decoding every line to ``str`` first would cost a copy per chunk for nothing.
"""

from __future__ import annotations

from typing import NamedTuple


class SSEEvent(NamedTuple):
    #: The ``event:`` field; empty for the default ``message`` event (OpenAI, OpenRouter).
    name: bytes
    data: bytes


class SSEDecoder:
    """Feed it network chunks; it returns the events completed by each one.

    Events end at a blank line. Comment lines (``: OPENROUTER PROCESSING`` keep-alives) are
    counted and dropped. ``id:`` and ``retry:`` are ignored: chat streams are never resumed.
    Lines end in ``\\n`` or ``\\r\\n``.
    """

    __slots__ = ("_tail", "_data", "_name", "comments")

    def __init__(self) -> None:
        self._tail = b""
        self._data: list[bytes] = []
        self._name = b""
        self.comments = 0

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        buffer = self._tail + chunk if self._tail else chunk
        lines = buffer.split(b"\n")
        self._tail = lines.pop()
        events: list[SSEEvent] = []
        data = self._data
        for line in lines:
            if line.endswith(b"\r"):
                line = line[:-1]
            if not line:
                if data:
                    events.append(
                        SSEEvent(self._name, data[0] if len(data) == 1 else b"\n".join(data))
                    )
                    data.clear()
                self._name = b""
            elif line.startswith(b"data:"):
                value = line[5:]
                data.append(value[1:] if value.startswith(b" ") else value)
            elif line[0] == 0x3A:  # ":" starts a comment
                self.comments += 1
            elif line.startswith(b"event:"):
                self._name = line[6:].strip()
        return events

    def close(self) -> tuple[list[SSEEvent], bool]:
        """End of stream: returns any event whose blank-line terminator never came, and
        whether the stream was *torn* (it stopped in the middle of a line)."""
        torn = bool(self._tail)
        events: list[SSEEvent] = []
        if self._data and not torn:
            events.append(SSEEvent(self._name, b"\n".join(self._data)))
        self._data = []
        self._tail = b""
        return events, torn
