"""Parsing the JSON of stream chunks, fast.

A streamed reply is thousands of chunks, and in CPython parsing them is most of what the
provider adds to reading the bytes. Two things make it cheap without giving up validation:

- the C scanner is called directly: ``json.loads`` spends more time in its Python wrappers
  (type and BOM checks, a whitespace regex twice) than the scanner spends on a small chunk;
- the *envelope* is remembered. Within one stream every chunk starts with the same bytes
  (``{"id":"…","object":"chat.completion.chunk","created":…,"model":"…","choices":``); once a
  chunk has been parsed in full and found to have that shape, a later chunk that starts with
  the byte-identical prefix is parsed from its ``choices`` value on. That is exact, not a
  heuristic: JSON is parsed left to right, so an identical prefix leaves the parser in the
  identical state; the rest of the chunk is still parsed and must close the object, or the
  chunk goes through the full parse (and ``json.loads`` has the last word on what is invalid).
  The envelope's own members are dropped from the result: the assembler never reads them,
  and a prefix whose members include ``error`` or ``usage`` is never remembered.
"""

from __future__ import annotations

import json
import json.scanner
from collections.abc import Callable
from typing import Any

Scanner = Callable[[str, int], tuple[Any, int]]

#: Members the assembler reads; an envelope holding one of them is never skipped.
_MEANINGFUL = frozenset({"choices", "error", "usage"})
_CHOICES_KEY = '"choices":'
#: A stream whose envelope keeps changing stops trying to learn it after this many attempts.
_MAX_LEARNING = 4


def make_scanner() -> Scanner:
    """The C JSON scanner (the pure-Python fallback keeps per-call state: one per stream)."""
    decoder: Any = json.JSONDecoder()  # typeshed types make_scanner's argument oddly
    scan: Scanner = json.scanner.make_scanner(decoder)
    return scan


class ChunkParser:
    """Parses one stream's chunk payloads; use one per stream (it is not thread-safe)."""

    __slots__ = ("_scan", "_prefix", "_learning")

    def __init__(self) -> None:
        self._scan = make_scanner()
        self._prefix: str | None = None
        self._learning = _MAX_LEARNING

    def parse(self, text: str, start: int = 0, stop: int | None = None) -> Any:
        """The JSON value in ``text[start:stop]``; raises ``ValueError`` if it is not JSON."""
        if stop is None:
            stop = len(text)
        prefix = self._prefix
        if prefix is not None and text.startswith(prefix, start):
            # The common case, inline: ``choices`` is the last member.
            try:
                choices, end = self._scan(text, start + len(prefix))
            except StopIteration:
                pass
            else:
                if end == stop - 1 and text[end] == "}":
                    return {"choices": choices}
                members = self._more_members(text, end, stop, choices)
                if members is not None:
                    return members
        value = self._parse_whole(text, start, stop)
        if self._learning and type(value) is dict and "choices" in value:
            self._learn(text, start, stop, value)
        return value

    def _parse_whole(self, text: str, start: int, stop: int) -> Any:
        try:
            value, end = self._scan(text, start)
            if end == stop:
                return value
        except StopIteration:
            pass
        # Surrounding whitespace is fine and garbage is not: json.loads decides (and raises).
        return json.loads(text[start:stop])

    def _after_prefix(self, text: str, at: int, stop: int) -> dict[str, Any] | None:
        """The members from ``choices`` on, if they close the object; else ``None``."""
        try:
            choices, end = self._scan(text, at)
        except StopIteration:
            return None
        if end == stop - 1 and text[end] == "}":
            return {"choices": choices}
        return self._more_members(text, end, stop, choices)

    def _more_members(self, text: str, end: int, stop: int, choices: Any) -> dict[str, Any] | None:
        """Members after ``choices`` (OpenAI adds ``usage``, ``obfuscation``, ...), parsed as
        an object of their own; ``None`` unless they close the object."""
        if end >= stop or text[end] != ",":
            return None
        try:
            rest, rest_end = self._scan("{" + text[end + 1 : stop], 0)
        except StopIteration:
            return None
        # An empty ``rest`` means the chunk ended in ``,}``: invalid, for the full parse to reject.
        if rest_end != stop - end or type(rest) is not dict or not rest or "choices" in rest:
            return None
        rest["choices"] = choices
        return rest

    def _learn(self, text: str, start: int, stop: int, value: dict[str, Any]) -> None:
        self._learning -= 1
        key_at = text.find(_CHOICES_KEY, start, stop)
        if key_at < 0:
            return
        # The envelope's own members, parsed on their own: none may be one the assembler
        # reads (a duplicate ``usage`` in the envelope would otherwise be skipped unseen).
        head = text[start:key_at].rstrip()
        try:
            envelope = {} if head == "{" else json.loads(head[:-1] + "}")
        except ValueError:
            return
        if type(envelope) is not dict or envelope.keys() & _MEANINGFUL:
            return
        at = key_at + len(_CHOICES_KEY)
        while at < stop and text[at] in " \t\r\n":
            at += 1
        members = self._after_prefix(text, at, stop)
        # Remember the prefix only if, on this very chunk, the short route gives exactly the
        # full parse minus the envelope.
        if members is None or any(members[key] != value.get(key) for key in members):
            return
        if value.keys() - members.keys() - envelope.keys():
            return
        self._prefix = text[start:at]
        self._learning = _MAX_LEARNING
