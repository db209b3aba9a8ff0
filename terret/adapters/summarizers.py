"""Summarizers (R19): the role summarizer, a utility request to the ``compactor`` model role
(defined with the port in :mod:`terret.runtime.summarizer`, being the runtime's default, and
re-exported here), and Morph's Compact API, an extractive compressor that deletes whole lines.

Neither is a session request: they read the messages they are given and never touch the event
log. They fail differently on purpose: the role summarizer raises (an unconfigured role or a
provider failure is the operator's to see), Morph declines to ``None`` with a warning on any
failure (it is an optional service; a decline just skips this compaction).
"""

from __future__ import annotations

import json
import logging
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import httpx

from terret.adapters.providers.config import check_env_name
from terret.adapters.providers.secret import Secret
from terret.domain.errors import ConfigurationError
from terret.domain.messages import Message
from terret.runtime.summarizer import (
    SUMMARY_INSTRUCTION,
    RoleResolver,
    RoleSummarizer,
    render_history,
)

__all__ = [
    "SUMMARY_INSTRUCTION",
    "MorphSummarizer",
    "RoleResolver",
    "RoleSummarizer",
    "SummarizerDeclined",
]

logger = logging.getLogger("terret.summarizers")


class SummarizerDeclined(UserWarning):
    """Warned when a summarizer declines (returns ``None``) because something failed."""


class MorphSummarizer:
    """Morph's Compact API: ``POST <base_url>/v1/compact`` with a bearer key.

    The request body (per Morph's public API reference) is
    ``{"messages": [{"role", "content"}], "query"?, "compression_ratio"?, "preserve_recent"?}``
    plus any ``options``; the reply is
    ``{"output": str, "messages": [{"role", "content", "compacted_line_ranges",
    "kept_line_ranges"}], ...}``. Each Terret message is sent as one Morph message whose content
    is its :func:`render_history` lines, so a deletion removes whole message parts and every
    kept line still says whose it was. Messages for which ``keep_context`` is true are wrapped in
    ``<keepContext>`` tags (kept verbatim); the tags are removed from the result.

    Declines to ``None``, with a :class:`SummarizerDeclined` warning and a log record, on every
    failure: no key, a connection error or timeout, an HTTP error, a torn or unexpected reply.
    It never raises (its constructor does: an ``api_key_env`` that is not a variable's name
    is a :class:`ConfigurationError`).
    """

    def __init__(
        self,
        *,
        api_key: str | None = None,
        api_key_env: str = "MORPH_API_KEY",
        base_url: str = "https://api.morphllm.com",
        compression_ratio: float | None = 0.5,
        query: str | None = None,
        preserve_recent: int | None = None,
        keep_context: Callable[[Message], bool] | None = None,
        options: Mapping[str, Any] | None = None,
        timeout: float = 60.0,
        header: str = "Earlier conversation, condensed (lines removed, none reworded):\n",
        environ: Mapping[str, str] | None = None,
        client: httpx.Client | None = None,
    ) -> None:
        self._key = Secret(api_key) if api_key else None
        problem = _env_name_problem(api_key_env)
        if problem is not None:
            # With no error chained and this frame's locals unbound: what is in the name's
            # place is often the key, and reporters that show a traceback's locals would too.
            del api_key, api_key_env, environ
            raise ConfigurationError(f"MorphSummarizer api_key_env {problem}")
        self.api_key_env = api_key_env
        base = base_url.rstrip("/")
        self.url = (base[:-3] if base.endswith("/v1") else base) + "/v1/compact"
        self.compression_ratio = compression_ratio
        self.query = query
        self.preserve_recent = preserve_recent
        self.keep_context = keep_context
        self.options = dict(options or {})
        self.header = header
        self._environ = os.environ if environ is None else environ
        self._owns_client = client is None
        self._client = client or httpx.Client(
            timeout=httpx.Timeout(timeout, connect=min(10.0, timeout))
        )

    def __repr__(self) -> str:
        # getattr: a reporter may show an instance whose __init__ refused its arguments.
        url = getattr(self, "url", None)
        api_key_env = getattr(self, "api_key_env", None)
        return f"MorphSummarizer(url={url!r}, api_key_env={api_key_env!r})"

    def close(self) -> None:
        if self._owns_client:
            self._client.close()

    def __enter__(self) -> MorphSummarizer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def summarize(self, messages: Sequence[Message]) -> str | None:
        key = self._key
        try:
            if key is None:
                value = self._environ.get(self.api_key_env)
                if not value:
                    return self._decline(f"no API key (set {self.api_key_env})")
                key = Secret(value)
            wire = [self._wire(message) for message in messages]
            wire = [item for item in wire if item["content"]]
            if not wire:
                return None
            return self._compact(key, wire, messages)
        except Exception as exc:  # the contract is "decline, never raise"
            detail = f"{type(exc).__name__}: {exc}"
            return self._decline(key.scrub(detail) if key is not None else detail)

    # --- internals ----------------------------------------------------------------------------

    def _compact(
        self, key: Secret, wire: list[dict[str, str]], messages: Sequence[Message]
    ) -> str | None:
        body: dict[str, Any] = dict(self.options)
        body["messages"] = wire
        query = self.query if self.query is not None else _last_user_text(messages)
        if query:
            body["query"] = query
        if self.compression_ratio is not None:
            body["compression_ratio"] = self.compression_ratio
        if self.preserve_recent is not None:
            body["preserve_recent"] = self.preserve_recent
        # httpx.Headers: its repr masks Authorization if a traceback shows frame locals.
        headers = httpx.Headers(
            {"Authorization": "Bearer " + key.reveal(), "Content-Type": "application/json"}
        )
        try:
            response = self._client.post(self.url, content=json.dumps(body), headers=headers)
        except httpx.HTTPError as exc:
            return self._decline(key.scrub(f"request failed: {type(exc).__name__}: {exc}"))
        if response.status_code != 200:
            detail = key.scrub(response.text[:300].strip())
            return self._decline(f"HTTP {response.status_code}: {detail}")
        try:
            document = response.json()
        except ValueError:
            return self._decline("the reply is not valid JSON (torn response?)")
        kept = _kept_text(document)
        if kept is None:
            return self._decline(f"unexpected reply shape: {key.scrub(response.text[:200])!r}")
        kept = _strip_keep_tags(kept).strip()
        if not kept:
            return self._decline("the reply kept nothing")
        # The summary goes into the event log (session/compacted): a reply that echoes the
        # key has it masked, as a provider's reply has.
        return self.header + key.scrub(kept)

    def _wire(self, message: Message) -> dict[str, str]:
        content = render_history([message])
        if content and self.keep_context is not None and self.keep_context(message):
            # Morph wants the tags on lines of their own.
            content = f"<keepContext>\n{content}\n</keepContext>"
        # Tool results travel as "user": the Compact API takes plain {role, content} messages
        # and a "tool" message without a call id is not one; the line tag keeps the meaning.
        role = message.role if message.role in ("system", "user", "assistant") else "user"
        return {"role": role, "content": content}

    def _decline(self, reason: str) -> str | None:
        """Warns and logs why; returns ``None`` (typed so callers can ``return`` it)."""
        text = f"Morph compaction declined: {reason}"
        logger.warning(text)
        warnings.warn(text, SummarizerDeclined, stacklevel=3)
        return None


def _env_name_problem(name: str) -> str | None:
    """Why ``name`` is no environment variable's name, or ``None``."""
    try:
        check_env_name(name)
    except ValueError as exc:
        return str(exc)
    return None


def _last_user_text(messages: Sequence[Message]) -> str | None:
    """The focus query Morph would otherwise guess from the last *user-role* message, which
    here may be a tool result; the last real user message, cut to 500 characters."""
    for message in reversed(messages):
        if message.role == "user" and message.text.strip():
            return message.text.strip()[:500]
    return None


def _kept_text(document: Any) -> str | None:
    """The kept text: the per-message contents joined, else ``output``; ``None`` if neither is
    there in the expected shape."""
    if not isinstance(document, dict):
        return None
    items = document.get("messages")
    if isinstance(items, list) and items:
        parts: list[str] = []
        for item in items:
            if not isinstance(item, dict) or not isinstance(item.get("content"), str):
                return None
            if item["content"].strip():
                parts.append(item["content"].strip("\n"))
        return "\n".join(parts)
    output = document.get("output")
    return output if isinstance(output, str) else None


def _strip_keep_tags(text: str) -> str:
    return "\n".join(
        line for line in text.split("\n") if line.strip() not in ("<keepContext>", "</keepContext>")
    )
