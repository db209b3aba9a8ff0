"""Secrets that never print themselves, and the one scrubber every error text they could reach
goes through.

A :class:`Secret` holds a value (an API key, a store URI) and the material to hide: the key
itself, or the credentials inside the URI. ``reveal()`` is the one way to read the value, and it
is called only where a header or a client is built. Everything else — reprs, log lines,
exception texts, exception attributes and the exceptions chained to them — goes through
:meth:`Secret.scrub` / :meth:`Secret.redact`, which mask the material in every spelling an
error text may quote it in:

- raw, and ``repr``-escaped (``\\r``, ``\\n``, ``\\x..``, ``\\\\``), as ``str`` and as
  ``bytes`` (``Illegal header value b'Bearer sk-…\\r'``);
- JSON-escaped (ASCII-only or not) and URL-encoded (``%XX``, ``+``), in either case;
- Base64-encoded (standard or URL-safe, at any byte offset), folded like the rest;
- each of those escaped once more (a repr of a repr), and
- cut short: any run of :data:`RUN` characters of a spelling is masked, so a key cut by a length
  limit (a 200-character excerpt that ends mid-key) or split by an escape no spelling foresees
  does not show either. Shorter runs are left alone; seven characters of a key are not the key.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
import traceback
import weakref
from collections.abc import Iterable
from types import TracebackType
from typing import Any
from urllib.parse import quote, quote_plus

from terret.domain.errors import ConfigurationError

MASK = "***"

#: Any run of this many characters of a secret's spelling is masked.
RUN = 8

#: Shorter material is not masked at all: it would mask ordinary words ("a", "ok").
MIN_LENGTH = 3

# ASCII-only case folding: it keeps every index where it was (``str.lower`` does not).
_FOLD = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def spellings(value: str) -> set[str]:
    """``value`` as texts may quote it (see the module docstring), case-folded to ASCII lower."""
    forms = {
        value,
        repr(value)[1:-1],
        repr(value.encode("utf-8", "backslashreplace"))[2:-1],
        json.dumps(value)[1:-1],
        json.dumps(value, ensure_ascii=False)[1:-1],
        quote(value, safe=""),
        quote(value),
        quote_plus(value, safe=""),
    }
    again = {repr(form)[1:-1] for form in forms} | {json.dumps(form)[1:-1] for form in forms}
    return {form.translate(_FOLD) for form in forms | again | _base64(value) if form}


def _base64(value: str) -> set[str]:
    """``value``'s Base64 (standard and URL-safe) at each of the three byte offsets it may
    start at inside an encoded text (``user:KEY`` in a Basic header, a body echoed encoded):
    the characters that also encode the bytes around it are left out, and the runs of
    :data:`RUN` characters in between are masked wherever they show."""
    raw = value.encode("utf-8", "backslashreplace")
    forms: set[str] = set()
    for shift in range(3):
        encoded = base64.b64encode(b"\0" * shift + raw).decode()
        inner = encoded[4 if shift else 0 : -4]
        if len(inner) >= RUN:  # a shorter piece would mask ordinary text
            forms |= {inner, inner.replace("+", "-").replace("/", "_")}
    return forms


class _Matcher:
    """Finds where any of ``pieces`` shows in a text, in any spelling."""

    __slots__ = ("_grams", "_whole")

    def __init__(self, pieces: Iterable[str]) -> None:
        grams: set[str] = set()
        whole: set[str] = set()
        for piece in pieces:
            if len(piece) < MIN_LENGTH:
                continue
            for form in spellings(piece):
                if len(form) <= RUN:
                    whole.add(form)
                else:
                    grams.update(form[i : i + RUN] for i in range(len(form) - RUN + 1))
        self._grams = frozenset(grams)
        self._whole = tuple(sorted(whole, key=len, reverse=True))

    def spans(self, text: str) -> list[tuple[int, int]]:
        """Merged ``(start, end)`` ranges of ``text`` that show a piece."""
        if not (self._grams or self._whole) or len(text) < MIN_LENGTH:
            return []
        folded = text.translate(_FOLD)
        found: list[tuple[int, int]] = []
        if self._grams:
            grams = self._grams
            found.extend(
                (i, i + RUN) for i in range(len(folded) - RUN + 1) if folded[i : i + RUN] in grams
            )
        for form in self._whole:
            at = folded.find(form)
            while at >= 0:
                found.append((at, at + len(form)))
                at = folded.find(form, at + 1)
        if not found:
            return []
        found.sort()
        merged = [found[0]]
        for start, end in found[1:]:
            last_start, last_end = merged[-1]
            if start <= last_end:
                merged[-1] = (last_start, max(last_end, end))
            else:
                merged.append((start, end))
        return merged


class Secret:
    """A value that never prints itself: ``repr``/``str`` show ``masked`` (``***``, or a store
    URI with its credentials masked), and pickling is refused, so a pickled provider or store
    does not carry its key to wherever the pickle goes.

    ``hide`` is the material to mask in texts (default: the value itself). A URI's host names
    are no secret, so a store URI hides only its credentials (``uri.secret_uri``).
    """

    __slots__ = ("_value", "masked", "_matcher", "__weakref__")

    def __init__(
        self, value: str, *, masked: str = MASK, hide: Iterable[str] | None = None
    ) -> None:
        self._value = value
        self.masked = masked
        self._matcher = _Matcher([value] if hide is None else hide)
        _LibraryLogs.watch(self)

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return f"Secret({self.masked!r})"

    __str__ = __repr__

    def __reduce__(self) -> tuple[object, ...]:
        raise TypeError("a Secret cannot be pickled")

    # --- texts --------------------------------------------------------------------------------

    def shows_in(self, text: str) -> bool:
        return bool(self._matcher.spans(text))

    def scrub(self, text: str) -> str:
        """``text`` with the whole value replaced by ``masked`` and the material masked in every
        spelling (a server may echo a key back: ``"invalid key sk-..."``)."""
        if self._value and self._value in text:
            text = text.replace(self._value, self.masked)
        spans = self._matcher.spans(text)
        if not spans:
            return text
        parts: list[str] = []
        at = 0
        for start, end in spans:
            parts.append(text[at:start])
            parts.append(MASK)
            at = end
        parts.append(text[at:])
        return "".join(parts)

    # --- exceptions ---------------------------------------------------------------------------

    def redact(self, error: BaseException) -> BaseException:
        """Scrub ``error`` in place and return it (``raise secret.redact(exc)``): its message
        (``args``), its attributes (``data``, ``code``, ...), its notes, every exception
        chained to it (``__cause__``, ``__context__``), and the locals of the finished frames of
        their tracebacks that hold the material (what ``--showlocals``, rich tracebacks and
        error trackers display). A chained exception whose text still shows the material
        (one with a ``__str__`` of its own) is cut from the chain, with a note saying so."""
        self._redact_chain(error, set())
        return error

    def _redact_chain(self, error: BaseException, seen: set[int]) -> None:
        seen.add(id(error))
        self._redact_one(error)
        for link in ("__cause__", "__context__"):
            linked = getattr(error, link)
            if linked is None:
                continue
            if id(linked) not in seen:
                self._redact_chain(linked, seen)
            if self.shows_in(_text_of(linked)):
                setattr(error, link, None)
                note = f"(a chained {type(linked).__name__} was dropped: its text showed a secret)"
                if note not in getattr(error, "__notes__", ()):
                    error.add_note(note)

    def _redact_one(self, error: BaseException) -> None:
        error.args = tuple(self._clean(arg) for arg in error.args)
        try:
            attributes = vars(error)
        except TypeError:  # __slots__ only
            attributes = {}
        for name, value in list(attributes.items()):
            if name == "__notes__" and isinstance(value, list):
                error.__notes__ = [self._clean(note) for note in value]
                continue
            cleaned = self._clean(value)
            if cleaned is not value:
                try:
                    setattr(error, name, cleaned)
                except (AttributeError, TypeError):
                    pass
        self._clear_frames(error.__traceback__)

    def _clean(self, value: Any) -> Any:
        """``value`` with the material masked: the same object when it shows none."""
        if isinstance(value, str):
            cleaned = self.scrub(value)
            return value if cleaned == value else cleaned
        if isinstance(value, bytes | bytearray):
            text = bytes(value).decode("utf-8", "backslashreplace")
            return value if not self.shows_in(text) else self.scrub(text).encode()
        if isinstance(value, int | float | bool) or value is None:
            return value
        shown = _repr_of(value)
        if shown is not None and self.shows_in(shown):
            return self.scrub(shown)
        return value

    def _clear_frames(self, tb: TracebackType | None) -> None:
        while tb is not None:
            frame = tb.tb_frame
            if any(
                self.shows_in(shown)
                for shown in map(_repr_of, frame.f_locals.values())
                if shown is not None
            ):
                try:
                    frame.clear()
                except RuntimeError:  # a frame still running (the caller's): nothing to do
                    pass
            tb = tb.tb_next


def _repr_of(value: Any) -> str | None:
    try:
        return repr(value)
    except Exception:  # noqa: BLE001 - a repr that fails shows nothing
        return None


def _text_of(error: BaseException) -> str:
    try:
        return "".join(traceback.format_exception_only(error)) + (_repr_of(error) or "")
    except Exception:  # noqa: BLE001
        return ""


class _LibraryLogs:
    """The HTTP libraries under the providers log in their own words at DEBUG — httpcore the
    response's headers, a server may echo the key in one. Their records are scrubbed of every
    live secret as they are made (a log-record factory: a filter on ``httpcore`` would miss
    ``httpcore.http11``'s records, and the handlers are the application's)."""

    LOGGERS = ("httpx", "httpcore")
    _live: weakref.WeakSet[Secret] = weakref.WeakSet()
    _installed = False
    _lock = threading.Lock()

    @classmethod
    def watch(cls, secret: Secret) -> None:
        with cls._lock:
            cls._live.add(secret)
            if cls._installed:
                return
            cls._installed = True
            made = logging.getLogRecordFactory()

            def make(*args: Any, **kwargs: Any) -> logging.LogRecord:
                record = made(*args, **kwargs)
                if record.name.startswith(cls.LOGGERS):
                    cls._scrub(record)
                return record

            logging.setLogRecordFactory(make)

    @classmethod
    def _scrub(cls, record: logging.LogRecord) -> None:
        secrets = list(cls._live)
        if not secrets:
            return
        message = clean = record.getMessage()
        for secret in secrets:
            clean = secret.scrub(clean)
        if clean != message:
            record.msg, record.args = clean, None


def scrub(secret: Secret | None, text: str) -> str:
    return secret.scrub(text) if secret is not None else text


def redact(secret: Secret | None, error: BaseException) -> BaseException:
    return secret.redact(error) if secret is not None else error


# --- bearer keys ------------------------------------------------------------------------------

_NAMES = {"\r": "a carriage return (\\r)", "\n": "a line feed (\\n)", "\t": "a tab", " ": "a space"}


def _describe(char: str) -> str:
    if char in _NAMES:
        return _NAMES[char]
    if char.isascii():
        return f"the control character U+{ord(char):04X}"
    return "a non-ASCII character"


def bearer_key(value: str, *, source: str = "the API key") -> Secret:
    """``value`` as a bearer key, refused with a :class:`ConfigurationError` (which names
    ``source`` and what is wrong, never a character of the key) unless it is printable ASCII
    without spaces: anything else cannot go into an ``Authorization`` header, and httpx would
    fail with the header in its message (``Illegal header value b'Bearer sk-…\\r'``).
    A key is never trimmed silently."""
    bad = [i for i, char in enumerate(value) if not "\x21" <= char <= "\x7e"]
    if not bad:
        return Secret(value)
    first = bad[0]
    trailing = len(value.rstrip())
    if first >= trailing:
        tail = sorted({_describe(char) for char in value[trailing:]})
        where = f"ends with {' and '.join(tail)}"
        if "\r" in value[trailing:] or "\n" in value[trailing:]:
            where += " (a .env file saved with CRLF line endings?)"
    elif first == 0 and value[0].isspace():
        where = f"starts with {_describe(value[0])}"
    else:
        where = f"contains {_describe(value[first])} at position {first + 1} of {len(value)}"
    # Unbound first: reporters that show a traceback's locals would show the key.
    del value
    raise ConfigurationError(
        f"{source} {where}; an HTTP header cannot carry it. Fix the value: keys are not "
        "trimmed silently"
    )
