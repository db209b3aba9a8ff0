"""A small, fast Server-Sent Events decoder over raw byte chunks.

It works on bytes and hands ``data`` payloads on as bytes, because ``json.loads`` accepts bytes
and decoding every line to ``str`` first would cost a copy per chunk for nothing.
"""

from __future__ import annotations

#: ``(name, data)``: the ``event:`` field (empty for the default ``message`` event, which is
#: all OpenAI and OpenRouter send) and the ``data`` payload. A plain tuple rather than a
#: NamedTuple: it is built once per chunk, and a NamedTuple costs a Python-level call.
SSEEvent = tuple[bytes, bytes]

_BOM = "\ufeff".encode()


class SSEDecoder:
    """Feed it network chunks; it returns the events completed by each one.

    Events end at a blank line. Comment lines (``: OPENROUTER PROCESSING`` keep-alives) are
    counted and dropped. ``id:`` and ``retry:`` are ignored: chat streams are never resumed.
    Lines end in ``\\n``, ``\\r\\n`` or a bare ``\\r``, as SSE allows.
    """

    __slots__ = ("_tail", "_data", "_name", "comments", "torn", "idle", "_started", "_cr")

    def __init__(self) -> None:
        self._tail = b""
        self._data: list[bytes] = []
        self._name = b""
        self.comments = 0
        #: Set by :meth:`close`: the stream stopped in the middle of a line.
        self.torn = False
        #: No partial line or event is buffered: the next chunk starts a fresh event. A
        #: reader may then take a chunk holding exactly one whole event without the decoder.
        self.idle = True
        self._started = False  # a byte-order mark may open the stream: ignored (SSE says so)
        self._cr = False  # the last chunk ended in CR

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        if self._cr and chunk:  # (an empty chunk says nothing of what follows the CR)
            self._cr = False
            chunk = chunk.removeprefix(b"\n")
        buffer = self._tail + chunk if self._tail else chunk
        if not self._started:
            if len(buffer) < len(_BOM) and _BOM.startswith(buffer):
                self._tail = buffer  # the mark may be split across chunks
                self.idle = False
                return []
            self._started = True
            buffer = buffer.removeprefix(_BOM)
        lines = self._lines(buffer)
        events: list[SSEEvent] = []
        data = self._data
        for line in lines:
            if not line:
                if data:
                    events.append((self._name, data[0] if len(data) == 1 else b"\n".join(data)))
                    data.clear()
                self._name = b""
            elif line.startswith(b"data:"):
                value = line[5:]
                data.append(value[1:] if value.startswith(b" ") else value)
            elif line[0] == 0x3A:  # ":" starts a comment
                self.comments += 1
            elif line.startswith(b"event:"):
                self._name = line[6:].strip()
        self.idle = not self._tail and not data and not self._name and not self._cr
        return events

    def _lines(self, buffer: bytes) -> list[bytes]:
        """The whole lines of ``buffer``; what follows the last line's end is kept."""
        if b"\r" in buffer:  # CRLF or a bare CR (SSE allows both) become LF: one rule after
            # A CR ending the chunk ends its line now; an LF opening the next chunk is then
            # the rest of that CRLF, not a blank line (``_cr``).
            self._cr = buffer.endswith(b"\r")
            buffer = buffer.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = buffer.split(b"\n")
        self._tail = lines.pop()
        return lines

    def close(self) -> list[SSEEvent]:
        """End of stream: returns any event whose blank-line terminator never came (unless
        the stream was torn mid-line, see :attr:`torn`)."""
        self.torn = bool(self._tail)
        events: list[SSEEvent] = []
        if self._data and not self.torn:
            events.append((self._name, b"\n".join(self._data)))
        self._data = []
        self._tail = b""
        return events
