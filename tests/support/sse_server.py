"""A real local HTTP server that plays scripted replies: OpenAI/OpenRouter-shaped SSE streams,
error statuses, cut connections, and JSON bodies (Morph's compact endpoint).

Tests script replies per path (a FIFO, plus an optional reply repeated once the FIFO is empty)
and read back the requests the server received. It speaks plain HTTP/1.1 on 127.0.0.1 from a
background thread; nothing in httpx is mocked.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# --- replies ---------------------------------------------------------------------------------


@dataclass
class Reply:
    """One scripted response. ``parts`` are written one at a time, each flushed on its own,
    the way a streaming server emits events."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    parts: list[bytes] = field(default_factory=list)
    #: ``chunked``: Transfer-Encoding chunked (what OpenAI/OpenRouter use); ``close``: the body
    #: ends when the connection closes; ``length``: Content-Length.
    framing: str = "chunked"
    #: Abort the connection after the parts, without finishing the body.
    cut: bool = False
    delay: float = 0.0  # before the status line
    part_delay: float = 0.0  # between parts
    stall: float = 0.0  # after the parts, before the end of the body

    @classmethod
    def json(
        cls, document: Any, *, status: int = 200, headers: dict[str, str] | None = None
    ) -> Reply:
        return cls(
            status=status,
            headers={"Content-Type": "application/json", **(headers or {})},
            parts=[json.dumps(document).encode()],
            framing="length",
        )

    @classmethod
    def text(cls, body: str, *, status: int, headers: dict[str, str] | None = None) -> Reply:
        return cls(
            status=status,
            headers={"Content-Type": "text/plain", **(headers or {})},
            parts=[body.encode()],
            framing="length",
        )

    @classmethod
    def sse(cls, parts: list[bytes], **kwargs: Any) -> Reply:
        headers = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        return cls(headers=headers, parts=parts, **kwargs)


# --- SSE in recorded shapes ------------------------------------------------------------------

KEEPALIVE = b": OPENROUTER PROCESSING\n\n"
DONE = b"data: [DONE]\n\n"


def event(document: Any) -> bytes:
    return b"data: " + json.dumps(document, separators=(",", ":")).encode() + b"\n\n"


def chunk(
    delta: dict[str, Any] | None = None,
    *,
    finish_reason: str | None = None,
    usage: dict[str, Any] | None = None,
    choices: bool = True,
    model: str = "test/model",
) -> dict[str, Any]:
    document: dict[str, Any] = {
        "id": "gen-1",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": model,
        "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish_reason}]
        if choices
        else [],
    }
    if usage is not None:
        document["usage"] = usage
    return document


def openai_usage(prompt: int = 12, completion: int = 5) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def openrouter_usage(
    prompt: int = 12, completion: int = 5, cost: float = 0.00042
) -> dict[str, Any]:
    return {**openai_usage(prompt, completion), "cost": cost, "is_byok": False}


def text_stream(
    pieces: list[str],
    *,
    style: str = "openrouter",
    finish_reason: str | None = "stop",
    usage: dict[str, Any] | None = None,
    done: bool = True,
) -> list[bytes]:
    """A text reply. ``openrouter`` style opens with keep-alive comments and reports usage with
    cost; ``openai`` style reports usage in a final chunk with empty ``choices`` (what
    ``stream_options.include_usage`` produces)."""
    parts: list[bytes] = [KEEPALIVE, KEEPALIVE] if style == "openrouter" else []
    parts.append(event(chunk({"role": "assistant", "content": ""})))
    parts.extend(event(chunk({"content": piece})) for piece in pieces)
    if finish_reason is not None:
        parts.append(event(chunk({}, finish_reason=finish_reason)))
    if usage is None:
        usage = openrouter_usage() if style == "openrouter" else openai_usage()
    if usage:
        parts.append(event(chunk(usage=usage, choices=False)))
    if done:
        parts.append(DONE)
    return parts


def tool_call_stream(
    calls: list[tuple[str, str, str]],
    *,
    text: str = "",
    pieces: int = 3,
    usage: dict[str, Any] | None = None,
) -> list[bytes]:
    """Tool calls ``(id, name, arguments JSON)`` the OpenAI way: the first fragment of each
    carries id and name, then the arguments arrive split over ``pieces`` chunks, by ``index``."""
    parts: list[bytes] = [event(chunk({"role": "assistant", "content": None}))]
    if text:
        parts.append(event(chunk({"content": text})))
    for index, (call_id, name, arguments) in enumerate(calls):
        head = {"index": index, "id": call_id, "type": "function"}
        parts.append(
            event(chunk({"tool_calls": [{**head, "function": {"name": name, "arguments": ""}}]}))
        )
        size = max(1, -(-len(arguments) // pieces))
        for start in range(0, len(arguments), size):
            fragment = {"index": index, "function": {"arguments": arguments[start : start + size]}}
            parts.append(event(chunk({"tool_calls": [fragment]})))
    parts.append(event(chunk({}, finish_reason="tool_calls")))
    parts.append(event(chunk(usage=usage or openrouter_usage(), choices=False)))
    parts.append(DONE)
    return parts


# --- the server ------------------------------------------------------------------------------


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]  # lower-cased names
    body: bytes
    client_port: int = 0  # the same port twice means a reused connection

    def json(self) -> Any:
        return json.loads(self.body)


class ScriptedServer:
    """``with ScriptedServer() as server: server.script("/v1/chat/completions", Reply(...))``."""

    def __init__(self) -> None:
        self._queues: dict[str, deque[Reply]] = {}
        self._repeat: dict[str, Reply] = {}
        self._lock = threading.Lock()
        self.requests: list[RecordedRequest] = []
        self._httpd = _Server(("127.0.0.1", 0), _Handler)
        self._httpd.scripted = self
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> ScriptedServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> ScriptedServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def script(self, path: str, *replies: Reply) -> None:
        with self._lock:
            self._queues.setdefault(path, deque()).extend(replies)

    def repeat(self, path: str, reply: Reply) -> None:
        """Serve ``reply`` on ``path`` whenever its FIFO is empty."""
        with self._lock:
            self._repeat[path] = reply

    def _next(self, request: RecordedRequest) -> Reply | None:
        with self._lock:
            self.requests.append(request)
            queue = self._queues.get(request.path)
            if queue:
                return queue.popleft()
            return self._repeat.get(request.path)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    scripted: ScriptedServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that hangs up mid-stream (cancellation, timeouts) is a scenario under test,
        # not a server failure worth a traceback on stderr.
        import sys

        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass

    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        self._serve()

    def do_POST(self) -> None:  # noqa: N802 - stdlib naming
        self._serve()

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        headers = {name.lower(): value for name, value in self.headers.items()}
        recorded = RecordedRequest(
            self.command, self.path, headers, body, int(self.client_address[1])
        )
        reply = self.server.scripted._next(recorded)
        if reply is None:
            reply = Reply.json(
                {"error": {"message": f"nothing scripted for {self.path}"}}, status=404
            )
        self._play(reply)

    def _play(self, reply: Reply) -> None:  # noqa: C901 - one branch per scripted framing fault
        if reply.delay:
            time.sleep(reply.delay)
        self.send_response(reply.status)
        for name, value in reply.headers.items():
            self.send_header(name, value)
        body = b"".join(reply.parts)
        if reply.framing == "length":
            # A cut body promises more than it delivers, as a dropped connection does.
            promised = len(body) + 100 if reply.cut else len(body)
            self.send_header("Content-Length", str(promised))
        elif reply.framing == "chunked":
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        if reply.framing == "length" and not reply.cut:
            self.wfile.write(body)
            return
        for index, part in enumerate(reply.parts):
            if index and reply.part_delay:
                time.sleep(reply.part_delay)
            if reply.framing == "chunked":
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
            else:
                self.wfile.write(part)
        if reply.stall:
            time.sleep(reply.stall)
        if reply.cut:
            self._abort()
            return
        if reply.framing == "chunked":
            self.wfile.write(b"0\r\n\r\n")

    def _abort(self) -> None:
        """Drop the connection mid-body, the way a crashed upstream or proxy does."""
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def free_port() -> int:
    """A loopback port with nothing listening on it (for connection-refused tests)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
