"""Text cut to a length for a line or a record, shared by every layer (it imports nothing)."""

from __future__ import annotations


def cut(text: str, n: int) -> str:
    """``text``, or its first ``n - 1`` characters and an ellipsis when it is longer."""
    return text if len(text) <= n else text[: n - 1] + "…"


def one_line(text: str, n: int) -> str:
    """``text`` on one line (runs of whitespace, newlines included, as one space), ``cut``."""
    return cut(" ".join(text.split()), n)
