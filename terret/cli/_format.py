"""How values read on the command line: tables, times, costs, JSON inline. Plain functions of
their arguments (the terminal's ``colour``, the clock), imported by the commands."""

from __future__ import annotations

import json
import logging
import math
import os
import re
import sys
import time
from decimal import Decimal
from itertools import chain
from typing import Any

from terret.domain.keys import KEY_SHAPES
from terret.domain.money import cost_figure


def colour() -> bool:
    """Colour only on a terminal, and never with ``NO_COLOR`` set (https://no-color.org)."""
    return sys.stdout.isatty() and not os.environ.get("NO_COLOR")


_KEY_LIKE = re.compile(r"[A-Za-z0-9_\-+=]{20,}")


def may_hold_secret(text: str) -> bool:
    """Whether a value given where a spec or a word was expected may be a credential, and so
    must not be quoted back in an error: a URL (user-info, a query), something with an ``@``,
    a run of 20 or more letters and digits, both (an API key pasted in the wrong place), or
    the shape of a common key (``KEY_SHAPES``; so every spec ``looks_like_key`` refuses)."""
    if "://" in text or "@" in text or KEY_SHAPES.search(text):
        return True
    return any(re.search(r"\d", run) and re.search(r"[A-Za-z]", run)
               for run in _KEY_LIKE.findall(text))


NOT_SHOWN = "(not shown: it may hold a credential)"

def scrubbed(message: str, value: str) -> str:
    """``message`` with each quote of ``value`` (as ``shown`` or ``repr`` quotes it, or bare)
    replaced by a note that it is not shown, when ``value`` may be a credential: a resolver's
    or a validator's error may quote the spec it was given."""
    from terret.domain.errors import shown

    if not value or not may_hold_secret(value):
        return message
    for form in (shown(value), repr(value), value):
        message = message.replace(form, NOT_SHOWN)
    return message


CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
"""The control characters (C0 but newline and tab, DEL, C1): a terminal acts on them (a bell,
an escape sequence that recolours or moves the cursor, a carriage return that writes over the
line) instead of showing them. And the bidirectional overrides and isolates, which reorder
what follows on the line (a reason that reads as another)."""


def printable(text: str) -> str:
    """``text`` as it is shown: each control character escaped as ``log`` (``repr``) shows it
    (``\\x07``, ``\\x1b[31m``, ``\\r``), whether the output is a terminal or not — what a
    session's text holds is seen, never acted on. The log keeps the text as it was written
    (``--json`` prints it JSON-escaped)."""
    if text.isprintable() or not CONTROL.search(text):
        return text
    return CONTROL.sub(lambda found: repr(found.group())[1:-1], text)


class PrintableFormatter(logging.Formatter):
    """Log lines (``serve``'s, ``-v``'s) with their control characters escaped, as every other
    output: a record may quote what a provider's error body or a session's text held."""

    def format(self, record: logging.LogRecord) -> str:
        return printable(super().format(record))


def table(rows: list[list[str]], headers: list[str]) -> str:
    """Left-aligned columns two spaces apart (linear in the cells: 10,000 rows in ~20 ms); a
    cell's control characters escaped (``printable``) before the columns are measured."""
    if not "".join(chain.from_iterable(rows)).isprintable():  # one look at them all: rare
        rows = [[printable(cell) for cell in row] for row in rows]
    widths = [max(map(len, column)) for column in zip(headers, *rows, strict=False)]
    line = "  ".join(f"{{:<{w}}}" for w in widths).format
    return "\n".join([line(*headers).rstrip(), *(line(*row).rstrip() for row in rows)])


# --- how values read ---------------------------------------------------------------------


def when(ts: float | None) -> str:
    """A timestamp as local date and time."""
    if ts is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def ago(ts: float | None, now: float | None = None) -> str:
    """How long ago ``ts`` was, as people say it: ``just now``, ``42 s ago``, ``5 min ago``,
    ``3 h ago``, ``2 days ago`` (``in 3 s`` for a time ahead)."""
    if ts is None:
        return "never"
    delta = (time.time() if now is None else now) - ts
    future = delta < 0
    delta = abs(delta)
    if delta < 1:
        return "just now"
    for size, unit in ((86400 * 365, "y"), (86400, "days"), (3600, "h"), (60, "min"),
                       (1, "s")):
        if delta >= size:
            count = int(delta // size)
            if unit == "days" and count == 1:
                unit = "day"
            return f"in {count} {unit}" if future else f"{count} {unit} ago"
    return "just now"


CURRENCY = "$"
"""Costs are what the providers report: OpenRouter and OpenAI-compatible endpoints report US
dollars."""


def money(cost: float | None) -> str:
    """A cost, always the same way: dollars with six decimals (LLM calls cost fractions of a
    cent)."""
    # Through the float's shortest repr: 123456789012.99 is not 123456789012.990005.
    return f"{CURRENCY}{Decimal(repr(float(cost or 0.0))):.6f}"


def parked_json(wait: dict[str, Any] | None) -> dict[str, Any] | None:
    """A turn parked on its budget, for ``--json``: its figures rounded as ``usage`` rounds."""
    if wait is None:
        return None
    return {"turn": wait["turn"], "limit": cost_figure(wait["limit"]),
            "spent": cost_figure(wait["spent"]),
            "estimate": cost_figure(wait["estimate"])}


def plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def strict_json(value: Any, **options: Any) -> str:
    """``value`` as standard JSON: a number JSON has no form for (NaN, an infinity — a record
    another client appended may hold one; Python's decoder reads them) as its name in a string,
    ``"NaN"``, ``"Infinity"``, ``"-Infinity"``; strict parsers refuse the bare tokens."""
    try:
        return json.dumps(value, allow_nan=False, **options)
    except ValueError:
        return json.dumps(_named_non_finite(value), allow_nan=False, **options)


def _named_non_finite(value: Any) -> Any:
    """A copy of ``value`` with each non-finite float named. Without recursion: a record may
    nest as deep as the JSON decoder let it, which the encoder prints (Python frames would
    not)."""
    root: list[Any] = [value]
    slots: list[tuple[Any, Any]] = [(root, 0)]
    while slots:
        holder, key = slots.pop()
        item = holder[key]
        if isinstance(item, float) and not math.isfinite(item):
            holder[key] = json.dumps(item)  # NaN, Infinity, -Infinity
        elif isinstance(item, dict):
            holder[key] = mapping = dict(item)
            slots.extend((mapping, k) for k in mapping)
        elif isinstance(item, list | tuple):
            holder[key] = items = list(item)
            slots.extend((items, i) for i in range(len(items)))
    return root[0]


def as_json(value: Any) -> str:
    """A value shown inline as JSON (arguments of a call), keys sorted."""
    return json.dumps(value, sort_keys=True, default=str, ensure_ascii=False)


def actor_text(by: dict[str, Any] | None) -> str:
    """``operator (alice)`` for a recorded ``by``; empty for none."""
    if not by:
        return ""
    return str(by["actor"]) + (f" ({by['id']})" if by.get("id") else "")
