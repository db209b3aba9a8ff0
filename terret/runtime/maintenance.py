"""Between-turn upkeep fed by ``turn/end``: compaction (R17–R19) and titling (R20).

Listeners only queue the work: the summarizer's round trip runs on a worker thread, never on the
projection runner's thread, and whatever it appends is delivered after the ``turn/end`` it
reacted to (R6).

Both read the session at the store's head (``SessionWriter.refresh``), never this process's
last write: the turn that triggered them, a ``model/set`` of their role, or a compaction may
have come from another process. By default both ask a model role of the session
(:class:`RoleSummarizer` on ``compactor``, :class:`RoleTitler` on ``titler``), resolved from the
session's recorded roles through the runtime's ``resolver``.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from functools import partial
from typing import Protocol
from uuid import UUID

from terret._text import whole_characters
from terret.domain import errors
from terret.domain.codec import RecordedEvent, decode
from terret.domain.errors import shown
from terret.domain.events import (
    TITLE_MAX,
    Actor,
    ContextInjected,
    TurnEnded,
    UpkeepPurpose,
    UserMessage,
)
from terret.domain.messages import Message
from terret.domain.payloads import text_problem
from terret.domain.session import Session
from terret.domain.store import EventStore, session_stream
from terret.projections.views import Views
from terret.runtime._handlers import answered_within
from terret.runtime.model import ModelProvider, ModelRequest, ModelResolver
from terret.runtime.summarizer import (
    RoleAsker,
    RoleBound,
    RoleResolver,
    RoleSummarizer,
    Summarizer,
    render_history,
)
from terret.runtime.usage_meter import UsageMeter
from terret.runtime.writer import SessionWriter

log = logging.getLogger("terret.maintenance")

_FIRST_TEXT = frozenset({UserMessage.wire_name, ContextInjected.wire_name})

FALLBACK_TITLE_CHARS = 40


class Titler(Protocol):
    """Produces a title from the conversation, or None to fall back (R20)."""

    def title(self, messages: Sequence[Message]) -> str | None: ...


@dataclass(frozen=True)
class UpkeepServices:
    """What between-turn upkeep needs from the process that runs it (the ``Runtime`` builds
    one for its compactor and its titler): the store, the session writer and the views, the
    model resolver and the session's model spec for a role, the upkeep pool and the views'
    catch-up."""

    store: EventStore
    writer: SessionWriter
    views: Views
    resolver: ModelResolver
    model_spec: Callable[[Session, str], str]
    background: Callable[[Callable[[], object]], None]
    """Queue a task on the upkeep pool (never the projection runner's thread)."""
    catch_up_views: Callable[[UUID], None]
    """Until the views hold everything of this session written so far."""
    serves: Callable[[str], bool] = lambda agent: True
    """Whether this process serves sessions of that agent (it defines it): the automatic
    upkeep writes only to those, and leaves the others to the processes that do."""
    ended_here: Callable[[UUID], bool] = lambda event_id: False
    """Whether this process wrote the ``turn/end`` with that id: it ran the turn, and its
    upkeep is this process's, whoever owns the session now."""
    owner_upkeeps: Callable[[Session, str, int], bool] = lambda session, purpose, seq: False
    """Whether the session's owner — the worker that ran the turn ended at that seq (it has
    not moved since) — is another live process that does this upkeep for its turns."""
    later: Callable[[float, Callable[[], object]], None] = lambda delay, task: None
    """Queue a task on the upkeep pool in ``delay`` seconds."""
    recheck_after: float = 15.0
    """How long before upkeep left to a live owner is looked at again (a lease's TTL)."""
    owner_folds: Callable[[Session], bool] = lambda session: True
    """Whether the session's open turn may take a summary while it runs: its owner folds
    ``session/compacted`` in (this release does; an older one, live, does not)."""
    upkeep_rank: Callable[[Session, str], int] = lambda session, purpose: 0
    """This process's place among the live processes that would do this upkeep of the session
    (those that follow the log, define its agent and do it), in rendezvous order: 0, first."""
    answer_timeout: float | None = None
    """Seconds a summarizer or titler has to answer (``RuntimeConfig.upkeep_timeout``)."""
    keeping: Callable[[UUID], AbstractContextManager[bool]] = lambda sid: nullcontext(True)
    """Whether this process's views follow the session, kept following it for the task
    (``AgentHost.keeping``): a pool member that lets it go mid-task forgets its rows."""

    def left_to_another(self, session: Session, purpose: str, end: RecordedEvent,
                        again: Callable[[int], None], attempt: int) -> bool:
        """Whether this process leaves the upkeep of the turn that ``end`` closed to another —
        so that a title or summary is asked for and paid for once, not once per serving
        process. To the session's owner, which ran it and does its own: looked at again
        (``again(attempt + 1)``) after a lease's TTL, for as long as the owner lives (one that
        died before doing it leaves it to this process). Else to the processes before this
        one in rendezvous order: looked at again two TTLs a place later, and done then if it
        is still undone (the one before may have died, or not follow the session: a pool
        member)."""
        if self.ended_here(end.event_id):
            return False
        if self.owner_upkeeps(session, purpose, end.seq):
            if attempt < MAX_RECHECKS:
                self.later(self.recheck_after, lambda: again(attempt + 1))
            return True
        rank = self.upkeep_rank(session, purpose) if attempt < RANKED else 0
        if rank:
            self.later(rank * 2 * self.recheck_after, lambda: again(RANKED))
        return rank > 0


def last_turn_end(store: EventStore, sid: UUID) -> RecordedEvent | None:
    """The session's last ``turn/end`` (read backwards: the tail of a long log, not all)."""
    stream, before = session_stream(sid), None
    while True:
        page = store.read_stream(stream, from_seq=before, backwards=True, limit=100)
        for record in page:
            if record.wire_name == TurnEnded.wire_name:
                return decode(record)
        if len(page) < 100 or page[-1].seq <= 1:
            return None
        before = page[-1].seq - 1


MAX_RECHECKS = 40
"""How many times upkeep left to a live owner is looked at again (at 15 s, ten minutes)."""
RANKED = MAX_RECHECKS + 1
"""The attempt of upkeep this process left to those before it in rendezvous order, looked at
again when its turn came: done now if still undone (unless a live owner does it)."""


def session_roles(upkeep: UpkeepServices, session: Session,
                  meter: UsageMeter | None = None) -> RoleResolver:
    """Resolves a role the way the session's own steps do: its recorded spec
    (``Runtime.model_spec``: ``session/started`` and ``model/set``, else the runtime's
    configuration) through the runtime's resolver. With ``meter``, the providers it hands out
    report each reply's usage to it."""

    def resolve(role: str) -> tuple[ModelProvider, str]:
        spec = upkeep.model_spec(session, role)
        provider, model = upkeep.resolver.resolve(spec)
        return (meter.metered(provider, spec) if meter is not None else provider), model

    return resolve


def record_usage(upkeep: UpkeepServices, sid: UUID, purpose: UpkeepPurpose,
                 meter: UsageMeter) -> None:
    """The metered calls of an upkeep that recorded nothing else (declined, refused, failed):
    paid for all the same. Never raises: the upkeep's own outcome is what its caller reports."""
    if not meter.calls:
        return
    try:
        upkeep.writer.execute(sid, meter.record_on(purpose))
    except Exception as exc:  # noqa: BLE001 - e.g. purged meanwhile: nothing left to count on
        log.warning("the usage of the %s request for %s was not recorded: %s",
                    purpose, sid, exc)


class Compactor:
    """Compacts a session after a turn whose last ``step/end`` reported
    ``prompt_tokens >= budget``, and on demand via ``compact``. ``summarizer`` defaults to the
    role summarizer on the session's ``compactor`` role."""

    def __init__(self, upkeep: UpkeepServices, summarizer: Summarizer | None,
                 budget: int | None) -> None:
        self.upkeep = upkeep
        self.summarizer: Summarizer = summarizer if summarizer is not None else RoleSummarizer()
        self.budget = budget
        self._lock = threading.Lock()
        self._running: dict[UUID, RecordedEvent | None] = {}
        """The sessions whose budget trigger runs here, each with the latest turn end that
        came meanwhile: one summary at a time per session, the next from where it left."""

    def on_turn_end(self, event: RecordedEvent) -> None:
        if self.budget is None or event.session_id is None:
            return
        self.upkeep.background(lambda: self._maybe_compact(event, 0))

    def _maybe_compact(self, end: RecordedEvent, attempt: int) -> None:
        """The budget trigger for the turn ``end`` closed. While one runs for the session, a
        later turn's end waits for it, then goes on from what it left (triggers queued on a
        busy session each paid for a summary of the same history, some thrown away)."""
        sid = end.session_id
        assert sid is not None
        with self._lock:
            if sid in self._running:
                self._running[sid] = end
                return
            self._running[sid] = None
        try:
            self._trigger(end, attempt)
        finally:
            with self._lock:
                later = self._running.pop(sid, None)
            if later is not None:
                self.upkeep.background(lambda: self._maybe_compact(later, 0))

    def _trigger(self, end: RecordedEvent, attempt: int) -> None:
        sid = end.session_id
        assert sid is not None
        with self.upkeep.keeping(sid) as followed:
            if followed:  # (else whoever serves the session next compacts it)
                self._trigger_followed(sid, end, attempt)

    def _trigger_followed(self, sid: UUID, end: RecordedEvent, attempt: int) -> None:
        prompt = self.upkeep.views.last_prompt_tokens(sid, getattr(end.payload, "turn", 0))
        if prompt is None or self.budget is None or prompt < self.budget:
            return
        session = self.upkeep.writer.refresh(sid)
        if session.state.compacted_upto >= end.seq:
            return  # compacted since (its owner, or another process)
        if not self.upkeep.serves(session.state.agent) or self.upkeep.left_to_another(
                session, "compaction", end,
                lambda n: self.upkeep.background(lambda: self._maybe_compact(end, n)),
                attempt):
            return  # another app's agent, or its owner compacts it
        try:
            self._compact(sid, after=end.seq)
        except Exception as exc:  # a decline or a summarizer error is never fatal here
            log.warning("automatic compaction of %s skipped: %s", sid, exc)

    def catch_up(self, sid: UUID, turn: int, end: RecordedEvent | None = None) -> None:
        """At serve start, for a session between turns whose last one, ``turn``, ended over the
        budget and nothing compacted it since — the process that ran it stopped before its
        upkeep: compact it now, as that turn's end would have (left to its owner if that is a
        live, budgeted worker)."""
        if self.budget is None:
            return
        prompt = self.upkeep.views.last_prompt_tokens(sid, turn)
        if prompt is None or prompt < self.budget:
            return
        end = end or last_turn_end(self.upkeep.store, sid)
        if end is not None:  # whether a compaction covers it is _maybe_compact's to say
            self._maybe_compact(end, 0)

    def compact(self, sid: UUID) -> int | None:
        """Summarize the history and append ``session/compacted``. Returns ``upto_seq``, or None
        when the summarizer declined. Raises ``CompactionDeclined`` while a turn is open when
        it starts, when nothing is new since what the latest summary covers, when a compaction
        covering its mark landed meanwhile, or when a live owner of an older release runs the
        turn then open; and whatever the summarizer raised."""
        return self._compact(sid)

    def _compact(self, sid: UUID, *, after: int | None = None) -> int | None:
        upkeep = self.upkeep
        # R18: the mark is the store's head for the stream when the compactor starts (the tail
        # other processes appended is folded in), not this process's last write.
        session = upkeep.writer.refresh(sid)
        if after is not None and session.state.compacted_upto >= after:
            log.info("session %s was compacted up to seq %d already", sid, after)
            return None
        mark = _mark(session, after)
        # Whatever the roles, a summary the session would refuse is declined here, before the
        # summarizer is bound to a role or paid: a closed or mid-turn session, a turn an older
        # release runs, a compaction covering the mark already.
        session.compaction_upto(mark, during_turn=upkeep.owner_folds(session))
        last = session.state.last_compaction_seq
        if min(session.state.last_visible_seq, mark) <= session.state.compacted_upto:
            # Nothing the model sees landed since the last compaction (or at all): a new
            # summary would only summarize the summary, or nothing — and cost a model call to
            # say it, which the model would then be shown.
            if after is not None:
                return None
            since = f"since the compaction at seq {last}" if last else "yet"
            raise errors.CompactionDeclined(
                f"session {sid}: nothing the model sees is new {since}")
        return self._paid_for(session, mark)

    def _paid_for(self, session: Session, mark: int) -> int | None:
        """``_summarize``, its request's cost recorded whatever came of the summary — with it,
        or alone — unless the outcome of its append is unknown."""
        upkeep, sid, meter = self.upkeep, session.id, UsageMeter()
        try:
            return self._summarize(session, mark, meter)
        except errors.WrongExpectedVersion:
            record_usage(upkeep, sid, "compaction", meter)  # refused: nothing was appended
            raise
        except errors.PayloadTooLarge as exc:
            # Refused before anything was written: a summary the log cannot hold. Its cost
            # is recorded alone, as any declined summary's.
            log.warning("the summary of %s is not recorded: %s", sid, exc)
            record_usage(upkeep, sid, "compaction", meter)
            raise
        except errors.StoreError:
            # The outcome of the append is unknown (it may have landed, the cost with it):
            # recorded again it could count twice; its cost is left out instead, and said.
            log.warning("the compaction of %s may not have been recorded (the store "
                        "failed); its request's cost is not recorded again", sid)
            raise
        except BaseException:
            record_usage(upkeep, sid, "compaction", meter)  # nothing was appended: alone
            raise

    def _summarize(self, session: Session, mark: int, meter: UsageMeter) -> int | None:
        """Ask the summarizer (its role's calls metered by ``meter``) and record the summary
        with what it cost; None when it declined (its cost recorded alone)."""
        upkeep, sid = self.upkeep, session.id
        summarizer = self.summarizer
        if isinstance(summarizer, RoleBound):
            summarizer = summarizer.for_session(session_roles(upkeep, session, meter))
        upkeep.catch_up_views(sid)  # the views now hold at least everything up to the mark
        # No further than the mark: what lands after it stays verbatim after the summary (R18);
        # and not from a view halted before it, or the summary's mark would cover history it
        # never read — lost to the model for good.
        (at_mark,) = upkeep.store.read_stream(session_stream(sid), from_seq=mark, limit=1)
        history = upkeep.views.messages(sid, through=mark, reaching=at_mark.position)
        try:
            summary = answered_within(upkeep.answer_timeout, "the summarizer",
                                      partial(summarizer.summarize, history))
        except TimeoutError as exc:
            log.warning("compaction of %s given up: %s", sid, exc)
            record_usage(upkeep, sid, "compaction", meter)  # what it reported by then
            return None
        if not isinstance(summary, str) or not summary.strip():
            # An empty summary would replace the whole history the model sees with nothing.
            log.warning("compaction of %s declined by the summarizer%s", sid,
                        "" if summary is None else f" (it returned {shown(summary)[:40]})")
            record_usage(upkeep, sid, "compaction", meter)
            return None
        # Half a character (a model's or a summarizer's slip) would have the log refuse the
        # whole summary, paid for: it is U+FFFD in it, as in a reply.
        summary = whole_characters(summary)
        record = meter.record_on("compaction")

        def compact(s: Session) -> int:
            upto = s.compact(summary, mark=mark, during_turn=upkeep.owner_folds(s))
            record(s)  # in the same append: the summary and what it cost
            return upto

        upto, _ = upkeep.writer.execute(sid, compact)
        log.info("session %s compacted up to seq %d", sid, upto)
        return int(upto)


def _mark(session: Session, after: int | None) -> int:
    """Where the summary reads up to: the store's head. When the budget's turn (ended at
    ``after``) is over and the next one began (a busy session), the end of the turn that
    triggered it: the running turn stays as it is after the summary (R18)."""
    if after is not None and session.state.turn_open and session.state.turn_started_seq > after:
        return after
    return session.version


class AutoTitler:
    """Exactly one automatic title per session, at the first ``turn/end`` (R20): from
    ``titler`` (default: the role titler on the session's ``titler`` role, when that role is
    configured), else the first user message cut to 40 characters."""

    def __init__(self, upkeep: UpkeepServices, titler: Titler | None) -> None:
        self.upkeep = upkeep
        self.titler: Titler = titler if titler is not None else RoleTitler()
        self._lock = threading.Lock()
        self._titling: set[UUID] = set()
        """The sessions whose title is being asked for here: the turns that end meanwhile
        leave it to that request (each asked anew and paid for, until the first title landed)."""

    def on_turn_end(self, event: RecordedEvent) -> None:
        if event.session_id is None:
            return
        self.upkeep.background(lambda: self._after_turn(event, 0))

    def _after_turn(self, end: RecordedEvent, attempt: int) -> None:
        sid = end.session_id
        assert sid is not None
        with self.upkeep.keeping(sid) as followed:
            if followed:  # (else whoever serves the session next titles it)
                self._title_after(sid, end, attempt)

    def _title_after(self, sid: UUID, end: RecordedEvent, attempt: int) -> None:
        if self.upkeep.views.title(sid) is not None:
            return  # titled already: a local view read; a title once projected stays until a purge
        session = self.upkeep.writer.refresh(sid)
        if untitleable(session) or self.upkeep.left_to_another(
                session, "title", end,
                lambda n: self.upkeep.background(lambda: self._after_turn(end, n)), attempt):
            return  # titled already (or closed: it never will be), or its owner titles it
        self.title_now(sid)

    def catch_up(self, sid: UUID, end: RecordedEvent | None = None) -> None:
        """For an untitled session whose worker stopped (or died) before titling it: title it
        now, as its last turn's end (``end``, read when not given) would have — left to its
        owner if that is a live worker that titles (a deploy's new worker starting beside an
        old one in its titler)."""
        if self.upkeep.views.title(sid) is not None:
            return
        end = end or last_turn_end(self.upkeep.store, sid)
        if end is not None:
            self._after_turn(end, 0)

    def title_now(self, sid: UUID) -> None:
        with self._lock:
            if sid in self._titling:
                return  # the request under way titles it (with the first message, if it fails)
            self._titling.add(sid)
        try:
            self._title_now(sid)
        finally:
            with self._lock:
                self._titling.discard(sid)

    def _title_now(self, sid: UUID) -> None:
        if self.upkeep.views.title(sid) is not None:
            return  # titled already: a local view read; a title once projected stays until a purge
        session = self.upkeep.writer.refresh(sid)
        if untitleable(session) or not self.upkeep.serves(session.state.agent):
            return  # titled already or closed, or another app's agent: its processes title it
        first = self._first_user_message(sid)
        if not first.strip():
            # Nothing said yet (a first turn that ended empty): the first turn/end after a user
            # message titles it — a placeholder now would be the one automatic title for good.
            return
        meter = UsageMeter()
        title = self._asked(session, meter, first) or first[:FALLBACK_TITLE_CHARS]
        record = meter.record_on("title")

        def entitle(s: Session) -> None:
            s.title(title, by=Actor(actor="agent"), automatic=True)
            record(s)  # in the same append: the title and what it cost

        try:
            self.upkeep.writer.execute(sid, entitle)
        except (errors.AlreadyTitled, errors.SessionClosed):
            # Titled meanwhile (another process), or closed: the request was paid for all
            # the same.
            record_usage(self.upkeep, sid, "title", meter)
        except errors.WrongExpectedVersion as exc:  # refused: nothing was appended
            log.warning("the automatic title of %s was not recorded: %s", sid, exc)
            record_usage(self.upkeep, sid, "title", meter)
        except errors.StoreError as exc:  # the outcome is unknown: the cost may be in
            log.warning("the automatic title of %s may not have been recorded (%s); its "
                        "request's cost is not recorded again", sid, exc)
        except Exception as exc:  # noqa: BLE001 - upkeep: said, never fatal, cost kept
            log.warning("the automatic title of %s was not recorded: %s", sid, exc)
            record_usage(self.upkeep, sid, "title", meter)

    def _asked(self, session: Session, meter: UsageMeter, first: str) -> str | None:
        """The titler's title, or None when there is none to record (no titler for the
        session, a failure, a blank answer or text that cannot be stored): the first message
        is the title then. The titler reads the start of the conversation: once a compaction
        replaced it (it can land before the title), the first user message stands for it."""
        titler = self._titler_for(session, meter)
        if titler is None:
            return None
        messages = (self.upkeep.views.messages(session.id)
                    if not session.state.last_compaction_seq else [Message("user", first)])
        try:
            title = answered_within(self.upkeep.answer_timeout, "the titler",
                                    partial(titler.title, messages))
        except Exception as exc:
            log.warning("titler failed for %s, using the first message: %s", session.id, exc)
            return None
        if not isinstance(title, str) or not title.strip():
            return None
        problem = text_problem(title)
        if problem is not None:  # a lone surrogate, say: a JSON escape in the reply
            log.warning("the titler's title for %s cannot be stored (%s), using the first "
                        "message", session.id, problem)
            return None
        return title

    def _titler_for(self, session: Session, meter: UsageMeter) -> Titler | None:
        """The titler bound to the session's roles (its calls metered by ``meter``); None when
        it would ask a role the session does not configure (the first message is then the
        title, with no warning)."""
        titler = self.titler
        if not isinstance(titler, RoleBound):
            return titler
        bound: Titler = titler.for_session(session_roles(self.upkeep, session, meter))
        if bound is titler:
            return titler  # it brought its own resolver
        try:
            self.upkeep.model_spec(session, titler.role)
        except errors.ConfigurationError:
            return None
        return bound

    def _first_user_message(self, sid: UUID) -> str:
        store = self.upkeep.store
        stream = session_stream(sid)
        start = 1
        while True:
            page = store.read_stream(stream, from_seq=start, limit=100)
            for record in page:
                if record.wire_name in _FIRST_TEXT:
                    return str(getattr(decode(record).payload, "text", ""))
            if len(page) < 100:
                return ""
            start = page[-1].seq + 1


# --- the role titler ---------------------------------------------------------------------------

TITLE_INSTRUCTION = (
    "Give this conversation a short title of at most six words that says what it is about. "
    "Reply with the title only: no quotes, no trailing punctuation, no preamble."
)

#: Titles are capped where ``session/titled`` caps them (R20): a model asked for six words
#: can answer with sixty.
MAX_TITLE = TITLE_MAX

_QUOTES = "\"'`*_“”‘’«»"
_PREFIX = re.compile(r"^\s*(?:title)\s*[:\-–—]\s*", re.IGNORECASE)
_EMPHASIS = re.compile(r"(?<![\w*])(\*\*|\*|__|_)(?=\S)(.+?)(?<=\S)\1(?![\w*])")
"""Markdown emphasis around a word or words (``*prod*``, ``**World**``, ``_Draft_``): not
inside a word (``user_id``), so snake_case names stay."""


class RoleTitler(RoleAsker):
    """One utility request to the ``titler`` role over the start of the conversation.

    The runtime's default titler. Built without ``resolve_role`` it is :class:`RoleBound`: the
    runtime binds it to the session being titled and uses it only when the session configures
    the role (``create_session(roles=...)``, ``model/set``, else ``RuntimeConfig.roles``).
    Built with ``resolve_role`` it always uses that resolver, which raises
    :class:`~terret.domain.errors.ConfigurationError` for an unconfigured role; that error is
    let through (the runtime's titler then falls back to the first user message). Returns
    ``None`` when the model's reply is empty after cleaning.
    """

    def __init__(
        self,
        resolve_role: RoleResolver | None = None,
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
        provider, model = self._resolved()
        transcript = render_history(messages)[: self.max_input_chars]
        if not transcript.strip():
            return None
        request = ModelRequest(
            model=model,
            messages=(Message("system", self.instruction), Message("user", transcript)),
        )
        return clean_title(provider.complete(request).text, self.max_chars)


def untitleable(session: Session) -> bool:
    """Whether no automatic title is to be asked for: the session has one, or is closed — a
    closed session takes no title, so a titler asked now would be paid for nothing (and,
    the title undone for good, asked again by every process in its turn)."""
    return session.state.titled or session.state.closed


def clean_title(text: str, max_chars: int = MAX_TITLE) -> str | None:
    """First non-empty line, without a ``Title:`` prefix, surrounding quotes or markdown
    emphasis (emphasis inside it dropped too), whitespace collapsed, cut to ``max_chars`` (at
    a word boundary when one is near); ``None`` if nothing is left."""
    line = next((ln for ln in text.splitlines() if ln.strip(_QUOTES + " \t#")), "")
    line = _PREFIX.sub("", line.strip().lstrip("#").strip())
    # Emphasis in pairs first (stripping the ends alone left 'Deploy to *prod'), then what is
    # left around the title: quotes, a marker without its pair.
    while (plain := _EMPHASIS.sub(r"\2", line)) != line:
        line = plain
    line = " ".join(line.strip(_QUOTES + " \t").split())
    line = line.rstrip(".").strip(_QUOTES + " \t")
    if len(line) > max_chars:
        cut = line[: max_chars + 1].rfind(" ")
        line = line[:cut] if cut >= max_chars // 2 else line[:max_chars]
        line = line.rstrip(" ,;:-–—" + _QUOTES).strip()
    return line or None
