"""The role titler (R20): asks the ``titler`` model role for a short session title."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from terret.domain.events import TITLE_MAX
from terret.domain.messages import Message
from terret.runtime.model import ModelProvider, ModelRequest
from terret.runtime.summarizer import render_history

TITLE_INSTRUCTION = (
    "Give this conversation a short title of at most six words that says what it is about. "
    "Reply with the title only: no quotes, no trailing punctuation, no preamble."
)

#: Titles are capped where ``session/titled`` caps them (R20): a model asked for six words
#: can answer with sixty.
MAX_TITLE = TITLE_MAX

_QUOTES = "\"'`*_“”‘’«»"
_PREFIX = re.compile(r"^\s*(?:title)\s*[:\-–—]\s*", re.IGNORECASE)


class RoleTitler:
    """One utility request to the ``titler`` role over the start of the conversation.

    ``resolve_role`` raises :class:`~terret.domain.errors.ConfigurationError` for an
    unconfigured role and that error is let through: the runtime's titler catches it and falls
    back to the first user message. Returns ``None`` when the model's reply is empty after
    cleaning.
    """

    def __init__(
        self,
        resolve_role: Callable[[str], tuple[ModelProvider, str]],
        *,
        role: str = "titler",
        instruction: str = TITLE_INSTRUCTION,
        max_chars: int = MAX_TITLE,
        max_input_chars: int = 4000,
    ) -> None:
        self._resolve_role = resolve_role
        self.role = role
        self.instruction = instruction
        self.max_chars = max_chars
        # The opening of a session says what it is about; the rest would only cost tokens.
        self.max_input_chars = max_input_chars

    def title(self, messages: Sequence[Message]) -> str | None:
        provider, model = self._resolve_role(self.role)
        transcript = render_history(messages)[: self.max_input_chars]
        if not transcript.strip():
            return None
        request = ModelRequest(
            model=model,
            messages=(Message("system", self.instruction), Message("user", transcript)),
        )
        return clean_title(provider.complete(request).text, self.max_chars)


def clean_title(text: str, max_chars: int = MAX_TITLE) -> str | None:
    """First non-empty line, without a ``Title:`` prefix, surrounding quotes or markdown
    emphasis, whitespace collapsed, cut to ``max_chars`` (at a word boundary when one is near);
    ``None`` if nothing is left."""
    line = next((ln for ln in text.splitlines() if ln.strip(_QUOTES + " \t#")), "")
    line = _PREFIX.sub("", line.strip().lstrip("#").strip())
    line = " ".join(line.strip(_QUOTES + " \t").split())
    line = line.rstrip(".").strip(_QUOTES + " \t")
    if len(line) > max_chars:
        cut = line[: max_chars + 1].rfind(" ")
        line = line[:cut] if cut >= max_chars // 2 else line[:max_chars]
        line = line.rstrip(" ,;:-–—" + _QUOTES).strip()
    return line or None
