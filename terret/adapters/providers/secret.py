"""Keeping API keys out of reprs, logs, error messages and exceptions."""

from __future__ import annotations


class Secret:
    """An API key that never prints itself. ``reveal()`` is the one way to read it, and it
    is called only where the Authorization header is built."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def scrub(self, text: str) -> str:
        """Replace every occurrence of the key in ``text`` (a server may echo it back in an
        error body, e.g. "invalid key sk-...")."""
        if self._value and self._value in text:
            return text.replace(self._value, "***")
        return text

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def __reduce__(self) -> tuple[object, ...]:
        # A pickled provider must not carry its key to wherever the pickle goes.
        raise TypeError("a Secret cannot be pickled")


def scrub(secret: Secret | None, text: str) -> str:
    return secret.scrub(text) if secret is not None else text
