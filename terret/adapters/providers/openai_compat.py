"""A chat-completions provider for any OpenAI-compatible endpoint (OpenAI, OpenRouter, vLLM,
Ollama, LM Studio, ...), streaming over httpx.

Failure policy, in one place:
- before the first text or tool-call fragment, 408/429/5xx answers, connection errors,
  timeouts, in-stream upstream errors and streams that end early are retried with backoff
  (``Retry-After`` honoured, capped);
- after it, any failure raises a :class:`ProviderError` for the step: retrying would repeat
  text already handed to ``on_text``, and returning what arrived would pass a truncated
  message off as complete;
- malformed SSE or JSON raises :class:`MalformedStream` at once (never retried);
- ``cancel`` is checked before each attempt, after each network chunk (keep-alive comments
  included) and during backoff; it closes the stream and raises :class:`ModelCancelled` —
  unless the chunk in hand completed the reply (``[DONE]``), which is returned, usage and all;
- every error leaves :meth:`OpenAICompatibleProvider.complete` through
  :meth:`Secret.redact <terret.adapters.secret.Secret.redact>`, and a retried one goes through
  it before it is logged: a key the server echoes (in an error body, an ``error`` chunk, a
  chunk of the wrong shape, tool arguments) is masked in the exception itself, so the retry
  WARNING line, the caller's logs and a turn's ``turn/end.error`` are clean by construction.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import httpx

from terret.adapters.providers.chunks import ChunkParser
from terret.adapters.providers.config import (
    EndpointConfig,
    ModelPrice,
    RetryConfig,
    TimeoutConfig,
    check_headers,
)
from terret.adapters.providers.errors import ProviderHTTPError, StreamBroken, UpstreamError
from terret.adapters.providers.retry import is_retryable_status, parse_retry_after, policy_for
from terret.adapters.providers.secret import Secret, bearer_key, redact, scrub
from terret.adapters.providers.sse import SSEDecoder, SSEEvent
from terret.adapters.providers.stream import ChunkAssembler
from terret.adapters.providers.wire import request_body
from terret.domain.errors import (
    ConfigurationError,
    MalformedStream,
    ModelCancelled,
    ProviderError,
)
from terret.domain.messages import ToolCall
from terret.runtime.model import ModelReply, ModelRequest, TextSink

logger = logging.getLogger("terret.providers")

#: How much of an error response body is read (the rest is never needed for a message).
_ERROR_BODY_LIMIT = 8192
_DONE = b"[DONE]"


class _Retry(Exception):
    """Internal: this attempt failed in a way another attempt may fix. It carries no text of
    its own (the error's is not yet redacted); ``cause`` becomes the error's ``__cause__``."""

    def __init__(
        self,
        error: ProviderError,
        retry_after: float | None = None,
        *,
        cause: BaseException | None = None,
    ) -> None:
        super().__init__()
        if cause is not None:
            error.__cause__ = cause
        self.error = error
        self.retry_after = retry_after


USAGE_AFTER_CANCEL = 2.0
"""How long a cancelled request whose reply was already whole reads on for the usage chunk
that follows it (what the reply was billed)."""


class OpenAICompatibleProvider:
    """The :class:`~terret.runtime.model.ModelProvider` port over
    ``POST <base_url>/chat/completions``.

    Thread-safe: one instance (and its connection pool) serves every agent's worker thread.
    Owns its ``httpx.Client`` unless one is passed in; ``close()`` releases it.
    """

    def __init__(
        self,
        name: str,
        base_url: str,
        *,
        api_key: str | Secret | None = None,
        headers: Mapping[str, str] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        stream_usage: bool = True,
        timeouts: TimeoutConfig | None = None,
        retry: RetryConfig | None = None,
        client: httpx.Client | None = None,
        prices: Mapping[str, ModelPrice] | None = None,
    ) -> None:
        self.name = name
        self._prices = dict(prices or {})
        self.base_url = base_url.rstrip("/")
        self._url = self.base_url + "/chat/completions"
        # A key no header can carry is refused here, with a ConfigurationError.
        try:
            self._key = (
                api_key
                if isinstance(api_key, Secret) or not api_key
                else bearer_key(api_key, source=f"provider {name!r}: the API key")
            ) or None
        except ConfigurationError:
            del api_key  # a reporter that shows the traceback's locals would show it
            raise
        self._headers, self._hidden = _headers_and_hidden(name, headers or {}, self._key)
        self._extra_body = dict(extra_body or {})
        self._stream_usage = stream_usage
        self._retry = policy_for(retry or RetryConfig())
        self._owns_client = client is None
        if client is None:
            t = timeouts or TimeoutConfig()
            client = httpx.Client(
                timeout=httpx.Timeout(connect=t.connect, read=t.read, write=t.write, pool=t.pool)
            )
        self._client = client

    @classmethod
    def from_endpoint(
        cls,
        name: str,
        endpoint: EndpointConfig,
        *,
        api_key: str | Secret | None,
        timeouts: TimeoutConfig | None = None,
        retry: RetryConfig | None = None,
    ) -> OpenAICompatibleProvider:
        try:
            return cls(
                name,
                endpoint.base_url,
                api_key=api_key,
                headers=endpoint.headers,
                extra_body=endpoint.extra_body,
                stream_usage=endpoint.stream_usage,
                timeouts=endpoint.timeouts or timeouts,
                retry=endpoint.retry or retry,
                prices=endpoint.prices,
            )
        except ConfigurationError:
            del api_key  # as in __init__: a traceback's locals must not show a refused key
            raise

    def __repr__(self) -> str:
        # getattr: a reporter may show an instance whose __init__ refused its arguments.
        auth = "bearer" if getattr(self, "_key", None) is not None else "none"
        name, base_url = getattr(self, "name", None), getattr(self, "base_url", None)
        return f"OpenAICompatibleProvider(name={name!r}, base_url={base_url!r}, auth={auth})"

    def close(self) -> None:
        if self._owns_client:
            self._client.close()

    def __enter__(self) -> OpenAICompatibleProvider:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- the port ---------------------------------------------------------------------------

    def complete(
        self,
        request: ModelRequest,
        *,
        on_text: TextSink | None = None,
        cancel: threading.Event | None = None,
    ) -> ModelReply:
        try:
            reply = self._complete(request, on_text, cancel)
        except Exception as exc:
            # The one exit of every failure: nothing leaves with the key in it.
            self._redact(exc)
            raise
        return self._priced(request.model, self._masked(reply))

    def _masked(self, reply: ModelReply) -> ModelReply:
        """The reply with the key masked wherever a server echoed it (the text, a call's id,
        name or arguments): what the log keeps of a reply is the model's, never the key."""
        if not self._hidden:
            return reply
        calls = tuple(ToolCall(id=self._scrub(c.id), name=self._scrub(c.name),
                               args=_scrub_values(c.args, self._scrub))
                      for c in reply.tool_calls)
        return dataclasses.replace(reply, text=self._scrub(reply.text), tool_calls=calls)

    def _priced(self, model: str, reply: ModelReply) -> ModelReply:
        """The reply's cost from the endpoint's prices when the server reported none."""
        usage = reply.usage
        price = self._prices.get(model) or self._prices.get("*")
        if usage is None or usage.cost is not None or price is None:
            return reply
        cost = price.cost(usage.prompt_tokens, usage.completion_tokens)
        return dataclasses.replace(reply, usage=dataclasses.replace(usage, cost=cost))

    def _complete(
        self,
        request: ModelRequest,
        on_text: TextSink | None,
        cancel: threading.Event | None,
    ) -> ModelReply:
        body = request_body(request, stream_usage=self._stream_usage, extra_body=self._extra_body)
        headers = self._request_headers()
        attempt = 0
        while True:
            self._check_cancel(cancel)
            try:
                return self._attempt(body, headers, ChunkAssembler(self.name, on_text), cancel)
            except _Retry as retry:
                error, retry_after = retry.error, retry.retry_after
            # Outside the handler: the error is raised (or logged) without the _Retry as its
            # context, and redacted before anything shows it.
            self._redact(error)
            if attempt >= (self._retry.max_retries or 0):
                error.add_note(f"{self.name}: gave up after {attempt + 1} attempts")
                raise error
            delay = self._retry.delay(attempt, retry_after)
            attempt += 1
            logger.warning(
                "%s; retry %d of %d in %.2fs", error, attempt, self._retry.max_retries, delay
            )
            if cancel is not None:
                if cancel.wait(delay):
                    raise ModelCancelled(f"{self.name}: request cancelled")
            elif delay > 0:
                time.sleep(delay)

    # --- one attempt --------------------------------------------------------------------------

    def _request_headers(self) -> httpx.Headers:
        # httpx.Headers rather than a dict: its repr masks Authorization, so a traceback that
        # shows frame locals (pytest --showlocals, rich, error trackers) does not show the key.
        headers = httpx.Headers({"Content-Type": "application/json", "Accept": "text/event-stream"})
        headers.update(self._headers)
        if self._key is not None:
            headers["Authorization"] = "Bearer " + self._key.reveal()
        return headers

    def _attempt(
        self,
        body: bytes,
        headers: httpx.Headers,
        assembler: ChunkAssembler,
        cancel: threading.Event | None,
    ) -> ModelReply:
        try:
            with self._client.stream("POST", self._url, content=body, headers=headers) as response:
                if not 200 <= response.status_code < 300:
                    raise self._status_error(response)
                if response.headers.get("content-type", "").startswith("application/json"):
                    return self._read_completion(response, assembler)
                return self._read_stream(response, assembler, cancel)
        except (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError) as exc:
            return self._transport_failed(exc, assembler, cancel)
        except httpx.HTTPError as exc:  # bad URL, unsupported protocol: retrying cannot help
            raise ProviderError(self.name, self._scrub(f"{type(exc).__name__}: {exc}")) from exc
        except UpstreamError as exc:
            if assembler.progressed or not _retryable_code(exc.code):
                raise
            raise _Retry(exc) from None

    def _transport_failed(self, exc: httpx.HTTPError, assembler: ChunkAssembler,
                          cancel: threading.Event | None) -> ModelReply:
        """A timeout or a dropped connection: the reply if it was complete, else what it
        means — a cancel, a broken stream (the reply had begun) or another attempt's turn."""
        detail = self._scrub(f"{type(exc).__name__}: {exc}")
        if cancel is not None and cancel.is_set() and assembler.finish_reason is None:
            # Cancelled while the stream stalled (noticed at the read timeout), or the
            # stream closed under the cancel: the caller asked for this, nothing broke.
            raise ModelCancelled(f"{self.name}: request cancelled") from None
        if assembler.finish_reason is not None:
            # The message was complete (finish_reason comes after the last delta); only the
            # usage chunk or [DONE] was lost. Failing the step would throw away a whole,
            # paid-for reply.
            logger.warning("%s: the connection dropped after the reply finished (%s); usage "
                           "may be missing", self.name, detail)
            return assembler.reply()
        if assembler.progressed:
            raise StreamBroken(
                self.name,
                f"the stream broke after the reply began "
                f"({assembler.text_length} characters received): {detail}",
            ) from exc
        raise _Retry(ProviderError(self.name, f"request failed: {detail}"), cause=exc) from None

    def _read_stream(
        self,
        response: httpx.Response,
        assembler: ChunkAssembler,
        cancel: threading.Event | None,
    ) -> ModelReply:
        decoder = SSEDecoder()
        parser = ChunkParser()
        # Without a content encoding the raw bytes are the bytes: skip httpx's decoder layer.
        encoded = response.headers.get("content-encoding", "identity") != "identity"
        chunks = iter(response.iter_bytes() if encoded else response.iter_raw())
        if self._read_events(chunks, decoder, parser, assembler, cancel):
            if assembler.finish_reason is None:
                self._done_without_a_finish_reason(assembler)
            self._read_on(chunks, cancel)
        elif not self._handle_events(decoder.close(), parser.parse, assembler.feed):
            if assembler.finish_reason is None:
                raise self._ended_early(response, decoder, assembler)
            if assembler.usage is None:
                # The body ended cleanly after the reply, without [DONE] or a usage chunk: a
                # drop on a `Connection: close` stream looks like this. Said as a drop is.
                logger.warning("%s: the stream ended after the reply finished, without [DONE] "
                               "or usage; usage may be missing", self.name)
        return assembler.reply()

    def _read_events(
        self,
        chunks: Iterator[bytes],
        decoder: SSEDecoder,
        parser: ChunkParser,
        assembler: ChunkAssembler,
        cancel: threading.Event | None,
    ) -> bool:
        """Feed the stream's events until ``[DONE]`` (true) or the end of the body (false); a
        cancel ends the read — true when the reply it cut short was already whole."""
        parse = parser.parse
        feed = assembler.feed
        # The hot loop runs once per network chunk, thousands of times per reply; it is kept
        # flat so that parsing costs little next to reading the bytes (see bench/provider.py).
        for chunk in chunks:
            # (The first newline is the event's terminating blank line: one line, one event.
            # The parse checks that the JSON spans the rest.)
            if (
                decoder.idle
                and chunk.startswith(b"data: {")
                and chunk.find(b"\n") == len(chunk) - 2
                and chunk.endswith(b"\n")
            ):
                # Fast path: the chunk is exactly one whole JSON event, the common case for a
                # server that flushes per token.
                try:
                    text = chunk.decode()
                    value = parse(text, 6, len(text) - 2)
                except (ValueError, RecursionError):  # (JSON nested too deeply to decode)
                    raise self._malformed(chunk[6:-2]) from None
                feed(value)
            elif self._handle_events(decoder.feed(chunk), parse, feed):
                return True
            # After each chunk, keep-alive comments included: a stalled but alive stream
            # notices. A reply already whole (its finish reason and its usage read: only
            # keep-alives or [DONE] were to come) is kept for the turn to record — it was
            # billed; one whose usage is still to come is read on for it.
            if cancel is not None and cancel.is_set() and self._cut_short(assembler):
                return True
        return False

    def _done_without_a_finish_reason(self, assembler: ChunkAssembler) -> None:
        """``[DONE]`` with no finish reason before it: the server says the reply is whole,
        not why it ended. With nothing received, an empty stream is no reply: another
        attempt's. Else the reply is kept, and said: a reply cut short would read the same."""
        if not assembler.progressed:
            raise _Retry(ProviderError(self.name, "the stream ended at [DONE] with no reply "
                                                  "and no finish_reason"))
        logger.warning("%s: the stream ended at [DONE] without a finish_reason; the reply "
                       "(%d characters) is kept as whole, though it may have been cut short",
                       self.name, assembler.text_length)

    def _cut_short(self, assembler: ChunkAssembler) -> bool:
        """On a cancel: True when the reply is whole (stop reading, keep it), else
        ``ModelCancelled``; False while its usage is the one thing still to come — for
        ``USAGE_AFTER_CANCEL`` seconds at most (keep-alives without an end would hold the
        cancel for good), and not at all when none was asked for."""
        if assembler.finish_reason is None:
            raise ModelCancelled(f"{self.name}: request cancelled")
        if assembler.usage is not None or not self._stream_usage:
            return True
        if assembler.cancel_seen is None:
            assembler.cancel_seen = time.monotonic()
        if time.monotonic() - assembler.cancel_seen < USAGE_AFTER_CANCEL:
            return False
        logger.warning("%s: cancelled after the reply finished; its usage did not follow "
                       "within %g s: usage may be missing", self.name, USAGE_AFTER_CANCEL)
        return True

    def _read_on(self, chunks: Iterator[bytes], cancel: threading.Event | None) -> None:
        """Read the body on after ``[DONE]``, so that the connection returns to the pool; a
        cancel stops that (the reply is whole: it is kept)."""
        for _ in chunks:
            if cancel is not None and cancel.is_set():
                return

    def _handle_events(
        self,
        events: Iterable[SSEEvent],
        parse: Callable[[str], Any],
        feed: Callable[[Any], None],
    ) -> bool:
        """Decoded events in order; true at ``[DONE]`` (the events after it are not read)."""
        for name, data in events:
            if self._handle_event(name, data, parse, feed):
                return True
        return False

    def _ended_early(
        self, response: httpx.Response, decoder: SSEDecoder, assembler: ChunkAssembler
    ) -> Exception:
        """The error of a body that ended with neither ``[DONE]`` nor a finish_reason: final
        once the reply began, another attempt's to fix before."""
        why = "in the middle of a line" if decoder.torn else "without [DONE] or a finish_reason"
        kind = response.headers.get("content-type", "")
        if not kind.startswith("text/event-stream"):
            why += f" (content-type {kind or 'missing'!r}, not an event stream)"
        if assembler.progressed:
            return StreamBroken(
                self.name,
                f"the stream ended {why} after {assembler.text_length} characters",
            )
        return _Retry(ProviderError(self.name, f"the stream ended {why}"))

    def _handle_event(
        self,
        name: bytes,
        data: bytes,
        parse: Callable[[str], Any],
        feed: Callable[[Any], None],
    ) -> bool:
        """One decoded event; true when it is ``[DONE]``."""
        if data == _DONE:
            return True
        if name == b"error":
            raise UpstreamError(self.name, self._scrub(data.decode("utf-8", "replace")))
        if name and name != b"message":  # "message" is the default event type, spelled out
            return False  # other named events are not part of the protocol
        try:
            value = parse(data.decode())
        except (ValueError, RecursionError):
            raise self._malformed(data) from None
        feed(value)
        return False

    def _malformed(self, data: bytes) -> MalformedStream:
        try:
            json.loads(data)
            reason = "an SSE data line could not be parsed"
        except ValueError as exc:
            reason = f"an SSE data line is not valid JSON ({exc})"
        except RecursionError:
            reason = "an SSE data line is JSON nested too deeply to decode"
        return MalformedStream(self.name, reason, data=self._scrub(data.decode("utf-8", "replace")))

    def _read_completion(self, response: httpx.Response, assembler: ChunkAssembler) -> ModelReply:
        """A server that ignores ``stream: true`` answers with one JSON completion."""
        raw = response.read()
        try:
            document = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            deep = isinstance(exc, RecursionError)
            raise MalformedStream(
                self.name,
                f"the JSON reply is {'nested too deeply to decode' if deep else 'not valid JSON'}",
                data=self._scrub(raw.decode("utf-8", "replace")),
            ) from exc
        assembler.feed(document)
        return assembler.reply()

    def _status_error(self, response: httpx.Response) -> Exception:
        raw = b""
        for piece in response.iter_bytes():
            raw += piece
            if len(raw) >= _ERROR_BODY_LIMIT:
                break
        # Scrubbed before it is cut to size, so that no cut can fall inside an echoed key.
        detail = _error_detail(self._scrub(raw.decode("utf-8", "replace")))
        error = ProviderHTTPError(self.name, response.status_code, detail)
        if is_retryable_status(response.status_code):
            return _Retry(error, parse_retry_after(response.headers))
        return error

    def _check_cancel(self, cancel: threading.Event | None) -> None:
        if cancel is not None and cancel.is_set():
            raise ModelCancelled(f"{self.name}: request cancelled")

    def _scrub(self, text: str) -> str:
        for secret in self._hidden:
            text = scrub(secret, text)
        return text

    def _redact(self, error: BaseException) -> None:
        for secret in self._hidden:
            redact(secret, error)


def _error_detail(body: str) -> str:
    """The human part of an error body: ``error.message`` when it is OpenAI-shaped JSON."""
    text = body.strip()
    try:
        document = json.loads(text)
    except ValueError:
        return text[:500]
    if isinstance(document, dict):
        error = document.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])[:500]
        if isinstance(error, str):
            return error[:500]
    return text[:500]


def _retryable_code(code: object) -> bool:
    """Whether an error the stream carried may pass on retry: one whose code is an HTTP status
    is retried as that status would be (``404 No endpoints found`` would fail every attempt);
    one without a status code (an upstream provider failing) is."""
    try:
        status = int(str(code))
    except ValueError:
        return True
    return not 400 <= status < 500 or is_retryable_status(status)


def _headers_and_hidden(name: str, headers: Mapping[str, str], key: Secret | None
                        ) -> tuple[dict[str, str], list[Secret]]:
    """The endpoint's extra headers, checked, and what its errors and echoed replies must
    mask: the key, and the headers' values — a header may carry a credential (Azure's
    ``api-key``, an ``x-api-key``)."""
    try:
        checked = check_headers(headers)
    except ValueError as exc:
        raise ConfigurationError(f"provider {name!r}: {exc}") from None
    values = [v for v in checked.values() if v]
    hidden = [key] if key is not None else []
    return checked, hidden + ([Secret("", hide=values)] if values else [])


def _scrub_values(value: Any, scrub: Callable[[str], str]) -> Any:
    """``value`` (decoded JSON) with ``scrub`` applied to every string in it, keys included."""
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, dict):
        return {scrub(k): _scrub_values(v, scrub) for k, v in value.items()}
    if isinstance(value, list):
        return [_scrub_values(v, scrub) for v in value]
    return value
