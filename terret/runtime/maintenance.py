"""Between-turn upkeep fed by ``turn/end``: compaction (R17–R19) and titling (R20).

Listeners only queue the work: the summarizer's round trip runs on a worker thread, never on the
projection runner's thread, and whatever it appends is delivered after the ``turn/end`` it
reacted to (R6).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol
from uuid import UUID

from terret.domain import errors
from terret.domain.codec import RecordedEvent, decode
from terret.domain.events import Actor
from terret.domain.messages import Message
from terret.domain.store import session_stream
from terret.runtime.summarizer import Summarizer

if TYPE_CHECKING:
    from terret.runtime.runtime import Runtime

log = logging.getLogger("terret.maintenance")

FALLBACK_TITLE_CHARS = 40


class Titler(Protocol):
    """Produces a title from the conversation, or None to fall back (R20)."""

    def title(self, messages: Sequence[Message]) -> str | None: ...


class Compactor:
    """Compacts a session after a turn whose last ``step/end`` reported
    ``prompt_tokens >= budget``, and on demand via ``compact``."""

    def __init__(self, runtime: Runtime, summarizer: Summarizer, budget: int | None) -> None:
        self.runtime = runtime
        self.summarizer = summarizer
        self.budget = budget

    def on_turn_end(self, event: RecordedEvent) -> None:
        sid = event.session_id
        if self.budget is None or sid is None:
            return
        turn = getattr(event.payload, "turn", 0)
        self.runtime.background(lambda: self._maybe_compact(sid, turn))

    def _maybe_compact(self, sid: UUID, turn: int) -> None:
        prompt = self.runtime.views.last_prompt_tokens(sid, turn)
        if prompt is None or self.budget is None or prompt < self.budget:
            return
        try:
            self.compact(sid)
        except Exception as exc:  # a decline or a summarizer error is never fatal here
            log.warning("automatic compaction of %s skipped: %s", sid, exc)

    def compact(self, sid: UUID) -> int | None:
        """Summarize the history and append ``session/compacted``. Returns ``upto_seq``, or None
        when the summarizer declined. Raises ``CompactionDeclined`` if model-visible history
        landed while the summarizer ran (R18), and whatever the summarizer raised."""
        runtime = self.runtime
        session = runtime.writer.load(sid)
        mark = session.version
        runtime.catch_up_views()
        messages = runtime.views.messages(sid)
        summary = self.summarizer.summarize(messages)
        if summary is None:
            log.warning("compaction of %s declined by the summarizer", sid)
            return None
        upto, _ = runtime.writer.execute(sid, lambda s: s.compact(summary, mark=mark))
        log.info("session %s compacted up to seq %d", sid, upto)
        return int(upto)


class AutoTitler:
    """Exactly one automatic title per session, at the first ``turn/end`` (R20)."""

    def __init__(self, runtime: Runtime, titler: Titler | None) -> None:
        self.runtime = runtime
        self.titler = titler

    def on_turn_end(self, event: RecordedEvent) -> None:
        sid = event.session_id
        if sid is None:
            return
        self.runtime.background(lambda: self.title_now(sid))

    def title_now(self, sid: UUID) -> None:
        if self.runtime.views.title(sid) is not None:
            return  # titled already: a local view read; a title once projected stays until a purge
        session = self.runtime.writer.load(sid)
        if session.state.titled:
            return
        title = None
        if self.titler is not None:
            try:
                title = self.titler.title(self.runtime.views.messages(sid))
            except Exception as exc:
                log.warning("titler failed for %s, using the first message: %s", sid, exc)
        if not title:
            title = self._first_user_message(sid)[:FALLBACK_TITLE_CHARS]
        if not title.strip():
            title = "Untitled session"
        try:
            self.runtime.writer.execute(
                sid, lambda s: s.title(title, by=Actor(actor="agent"), automatic=True))
        except (errors.AlreadyTitled, errors.SessionClosed):
            pass  # titled meanwhile (another process), or closed: nothing to do

    def _first_user_message(self, sid: UUID) -> str:
        store = self.runtime.store
        stream = session_stream(sid)
        start = 1
        while True:
            page = store.read_stream(stream, from_seq=start, limit=100)
            for record in page:
                if record.wire_name in ("user/message", "context/injected"):
                    return str(getattr(decode(record).payload, "text", ""))
            if len(page) < 100:
                return ""
            start = page[-1].seq + 1

