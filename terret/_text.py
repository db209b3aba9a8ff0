"""Text cut to a length for a line or a record, and made whole, shared by every layer (it
imports nothing of Terret's)."""

from __future__ import annotations

import re


def cut(text: str, n: int) -> str:
    """``text``, or its first ``n - 1`` characters and an ellipsis when it is longer."""
    return text if len(text) <= n else text[: n - 1] + "…"


def one_line(text: str, n: int) -> str:
    """``text`` on one line (runs of whitespace, newlines included, as one space), ``cut``."""
    return cut(" ".join(text.split()), n)


SURROGATE = re.compile("[\ud800-\udfff]")
"""Half of a character beyond the BMP, as a ``str`` may hold one (JSON's ``\\ud83c`` alone)."""


def whole_characters(text: str) -> str:
    """``text`` with each surrogate pair as the one character it stands for, and a lone half
    as U+FFFD: text a log, a terminal or UTF-8 can hold."""
    if text.isascii() or not SURROGATE.search(text):
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
