"""Assembling an OpenAI-style chunk stream into one :class:`ModelReply`.

Chunks are plain dicts from ``json.loads``: no model validation per chunk, because a long
reply is thousands of chunks and the parsing must cost little next to reading the bytes.
Shape problems surface as :class:`MalformedStream` naming the provider and the offending data.
"""

from __future__ import annotations

import json
import math
import uuid
from typing import Any

from terret._text import SURROGATE, whole_characters
from terret.adapters.providers.errors import UpstreamError
from terret.domain.errors import MalformedStream, ProviderError
from terret.domain.messages import (
    MAX_ARGUMENT_DEPTH,
    ToolCall,
    Usage,
    args_too_deep,
    distinct_ids,
)
from terret.runtime.model import ModelReply, TextSink


class _CallParts:
    """The fragments of one tool call, keyed by its ``index`` in the stream."""

    __slots__ = ("id", "name", "arguments")

    def __init__(self) -> None:
        self.id = ""
        self.name = ""
        self.arguments: list[str] = []


class ChunkAssembler:
    """Feed it decoded chunks in order; ``reply()`` gives the complete message.

    ``progressed`` turns true at the first text or tool-call fragment: from then on a retry
    would repeat output already passed to ``on_text``, so failures are final.
    """

    def __init__(self, provider: str, on_text: TextSink | None = None) -> None:
        self.provider = provider
        self._on_text = on_text
        self._text: list[str] = []
        self._append = self._text.append  # bound once: feed runs per chunk
        self._calls: dict[int, _CallParts] = {}
        self._ids: dict[str, int] = {}
        self.usage: Usage | None = None
        self.finish_reason: str | None = None
        self.cancel_seen: float | None = None
        """When the reader first saw a cancel after the reply finished (monotonic)."""
        self._high = ""
        """A text delta's last character when it was the first half of a surrogate pair:
        held for the next delta, which may bring the other half."""

    @property
    def progressed(self) -> bool:
        return bool(self._text) or bool(self._calls)

    @property
    def text_length(self) -> int:
        return sum(len(part) for part in self._text)

    def feed(self, chunk: Any) -> None:
        # Runs once per chunk: membership tests and subscripts rather than ``.get`` calls,
        # explicit type checks where a wrong type would otherwise slip by. Each level of the
        # chunk (chunk → choice → delta) is a method of its own that checks its shape and
        # returns the delta's content.
        try:
            content = self._take_chunk(chunk)
        except (AttributeError, TypeError, IndexError, KeyError, ValueError,
                RecursionError) as exc:  # (json.dumps of an arguments object nested too deeply)
            raise MalformedStream(
                self.provider, f"unexpected chunk shape ({exc})", data=_show(chunk)
            ) from exc
        # Outside the try: an error in the caller's sink is the caller's, not a bad chunk.
        if content and self._on_text is not None:
            self._on_text(content)

    def _take_chunk(self, chunk: Any) -> Any:
        if type(chunk) is not dict:
            raise TypeError("a chunk must be a JSON object")
        if "error" in chunk and chunk["error"] is not None:
            raise _upstream(self.provider, chunk["error"])
        choices = chunk["choices"] if "choices" in chunk else None
        content = self._take_choice(choices[0]) if choices else None
        if "usage" in chunk and chunk["usage"]:
            self.usage = parse_usage(chunk["usage"])
        return content

    def _take_choice(self, choice: Any) -> Any:
        if type(choice) is not dict:
            raise TypeError("a choice must be a JSON object")
        # ``delta`` in a stream; ``message`` in a non-streamed completion.
        delta = choice["delta"] if "delta" in choice else choice.get("message")
        content = self._take_delta(delta) if delta else None
        reason = choice["finish_reason"] if "finish_reason" in choice else None
        if reason:
            if reason == "error":
                raise UpstreamError(self.provider, "the stream ended with finish_reason=error")
            self.finish_reason = str(reason)
        return content

    def _take_delta(self, delta: Any) -> Any:
        if type(delta) is not dict:
            raise TypeError("a delta must be a JSON object")
        content = None
        if "content" in delta:
            content = delta["content"]
            if content:
                if type(content) is not str:
                    raise TypeError("delta content must be a string")
                content = self._whole_characters(content)
                if content:
                    self._append(content)
        if "tool_calls" in delta and delta["tool_calls"]:
            self._feed_calls(delta["tool_calls"])
        return content

    def _whole_characters(self, content: str) -> str:
        """The delta's text in whole characters. A server that cuts text by UTF-16 units (as
        JavaScript's ``slice`` does) sends a character beyond the BMP as two escaped halves
        in two chunks, and each chunk's JSON decodes its half alone: the two halves are put
        together here, and a half that has no other (a server's bug) becomes U+FFFD — the
        text handed to ``on_text``, joined in the reply, summarized or titled is always valid
        Unicode (it could not be printed or stored otherwise)."""
        if self._high:
            content, self._high = self._high + content, ""
        if content.isascii() or not SURROGATE.search(content):
            return content
        if "\ud800" <= content[-1] <= "\udbff":
            content, self._high = content[:-1], content[-1]
        return whole_characters(content)

    def _feed_calls(self, calls: list[Any]) -> None:
        for part in calls:
            call_id = part.get("id")
            index = part.get("index")
            if index is None:
                # Servers that send whole calls omit ``index``; place them by id, else append.
                index = self._ids.get(call_id, len(self._calls)) if call_id else len(self._calls)
            slot = self._calls.get(index)
            if slot is None:
                slot = self._calls[index] = _CallParts()
            if call_id and not slot.id:
                slot.id = call_id
                self._ids[call_id] = index
            function = part.get("function")
            if function:
                name = function.get("name")
                # Most servers send the name once; some repeat it on every fragment.
                if name and name != slot.name:
                    slot.name = name if not slot.name else slot.name + name
                arguments = function.get("arguments")
                if arguments:
                    if type(arguments) is str:
                        slot.arguments.append(arguments)
                    else:
                        # A non-streamed reply from a lenient server may send an object.
                        slot.arguments.append(json.dumps(arguments))

    def tool_calls(self) -> tuple[ToolCall, ...]:
        """The reply's calls, each with an id of its own (``distinct_ids``)."""
        return distinct_ids([self._complete_call(index) for index in sorted(self._calls)])

    def _complete_call(self, index: int) -> ToolCall:
        slot = self._calls[index]
        # Cut by UTF-16 units as text may be (``_whole_characters``): a character's halves, in
        # two fragments, each decoded alone by its chunk's JSON.
        raw = whole_characters("".join(slot.arguments))
        if not slot.name:
            raise MalformedStream(self.provider, f"tool call #{index} has no name", data=raw)
        try:
            args = (json.loads(raw, parse_constant=_not_json, parse_float=_finite)
                    if raw.strip() else {})
        except ValueError:
            args = None
        except RecursionError:  # nested too deeply for the decoder, far past the limit
            args = _TOO_DEEP
        if args is _TOO_DEEP or (isinstance(args, dict) and _too_deep(raw, args)):
            raise MalformedStream(
                self.provider,
                f"arguments of tool call {slot.name!r} are nested more than "
                f"{MAX_ARGUMENT_DEPTH} levels deep",
                data=raw,
            )
        if not isinstance(args, dict):
            if self.finish_reason == "length":
                raise ProviderError(
                    self.provider,
                    f"the reply hit the token limit inside the arguments of tool call "
                    f"{slot.name!r} (finish_reason=length)",
                    data=raw,
                )
            raise MalformedStream(
                self.provider,
                f"arguments of tool call {slot.name!r} are not a JSON object",
                data=raw,
            )
        call_id = slot.id or f"call_{uuid.uuid4().hex[:24]}"
        return ToolCall(id=call_id, name=slot.name, args=args)

    def reply(self) -> ModelReply:
        if self._high:  # the stream ended on the first half of a pair
            self._high = ""
            self._append("\ufffd")
            if self._on_text is not None:
                self._on_text("\ufffd")
        return ModelReply(
            text="".join(self._text),
            tool_calls=self.tool_calls(),
            usage=self.usage,
            finish_reason=self.finish_reason,
        )


def parse_usage(raw: Any) -> Usage:
    """``prompt_tokens``/``completion_tokens``, and ``cost`` when the provider reports it
    (OpenRouter does, in credits, on the final chunk)."""
    if type(raw) is not dict:
        raise TypeError("usage must be a JSON object")
    cost = raw.get("cost")
    return Usage(
        prompt_tokens=_count(raw.get("prompt_tokens")),
        completion_tokens=_count(raw.get("completion_tokens")),
        cost=None if cost is None else float(cost),
    )


def _count(value: Any) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"token count {value!r} is not a number")
    return int(value)


def _upstream(provider: str, error: Any) -> UpstreamError:
    if isinstance(error, dict):
        return UpstreamError(provider, str(error.get("message") or error), code=error.get("code"))
    return UpstreamError(provider, str(error))


_TOO_DEEP: Any = object()


def _not_json(name: str) -> Any:
    """``NaN`` and ``Infinity``: Python's decoder takes them, JSON has no such values (and the
    log could not store them)."""
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    """A number too large for a float (``1e999``) would be read as infinity: not JSON either."""
    value = float(text)
    if value in (math.inf, -math.inf):
        raise ValueError(f"{text} is out of range")
    return value


def _too_deep(raw: str, args: dict[str, Any]) -> bool:
    """Whether ``args`` (decoded from ``raw``) is nested more than :data:`MAX_ARGUMENT_DEPTH`
    levels deep. Each level opens a bracket, so counting them is a bound that costs next to
    nothing: only arguments with that many are walked."""
    return raw.count("[") + raw.count("{") > MAX_ARGUMENT_DEPTH and args_too_deep(args)


def _show(chunk: Any) -> str:
    try:
        return json.dumps(chunk)[:500]
    except (TypeError, ValueError, RecursionError):
        pass
    try:
        return repr(chunk)[:500]
    except RecursionError:
        return "<a chunk nested too deeply to show>"
