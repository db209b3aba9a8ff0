"""Shared CLI plumbing: opening the store and views, typed errors → exit codes, output.

Everything heavy (the aggregate, the payload classes, the projection runner) is imported when a
command needs it, so ``terret --help`` and a ``sessions list`` on views that are up to date
start in a fraction of the time a full import takes (``bench/cli.py``).
"""

from __future__ import annotations

import getpass
import json
import logging
import os
import re
import sqlite3
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from uuid import UUID

import click
from click.shell_completion import CompletionItem

from terret._text import one_line
from terret.cli._format import NOT_SHOWN, may_hold_secret, printable, scrubbed
from terret.domain.errors import (
    SessionNotFound,
    StoreUnavailable,
    ViewsBehind,
    ViewsBusy,
    ViewsMismatch,
)
from terret.domain.errors import shown as cut
from terret.domain.keys import KEY_REFUSED, looks_like_key

if TYPE_CHECKING:
    from terret.domain.events import Actor
    from terret.domain.store import EventStore
    from terret.projections.base import ViewStore
    from terret.projections.runner import ProjectionRunner
    from terret.projections.views import Views
    from terret.runtime.commands import SessionCommands

DEFAULT_STORE = "terret.db"
PREFIX_MIN = 4
"""The shortest session-id prefix accepted (as git accepts 4 hex digits of an object id)."""

_HEXISH = re.compile(r"[0-9a-f-]+\Z")


def default_views_path(store_uri: str) -> str:
    """Beside a SQLite store (``x.db`` → ``x.views.db``), in memory for ``memory:``, else
    ``terret-views.db``. Raises ``InvalidStoreURI`` for a URI no store takes."""
    from terret.adapters.stores.uri import sqlite_path, store_kind

    kind = store_kind(store_uri)
    if kind == "memory":
        return ":memory:"
    path = sqlite_path(store_uri)
    if path is None:
        return "terret-views.db"
    return str(Path(path).with_suffix("")) + ".views.db"


class SessionIdType(click.ParamType):
    """A session id: a UUID, ``session-<uuid>``, or a unique prefix of one (4 or more hex
    digits, as ``git`` takes object ids). Malformed ids and ambiguous prefixes are usage errors
    (exit 2); a prefix no session has is ``SessionNotFound`` (exit 1). Completes session ids in
    the shell.

    A prefix is looked up in the sessions view, which opens the store: in a context that
    ``resolves_prefixes`` (every ``terret`` command's), that is left to when the command runs
    (a :class:`SessionPrefix`, resolved by :meth:`resolve`), so that the command's other values
    are checked first and a bad one is a usage error with nothing read or written — as it is
    with a full id."""

    name = "SESSION"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> UUID | SessionPrefix:
        if isinstance(value, UUID | SessionPrefix):
            return value
        text = str(value).strip().lower().removeprefix("session-")
        try:
            return UUID(text)
        except ValueError:
            pass
        digits = len(text.replace("-", ""))
        # Longer than a UUID's 32 digits, it is no prefix of one (and too long a LIKE pattern).
        if not PREFIX_MIN <= digits <= 32 or not _HEXISH.match(text):
            self.fail(f"{cut(value)} is not a session id (a UUID, or a unique prefix of one: "
                      f"{PREFIX_MIN} or more hex digits)", param, ctx)
        prefix = SessionPrefix(text, str(value), param)
        if ctx is not None and getattr(ctx, "resolves_prefixes", False):
            return prefix
        return self.resolve(prefix, ctx)

    def resolve(self, prefix: SessionPrefix, ctx: click.Context | None) -> UUID:
        """The one session id that starts with ``prefix``, from the sessions view."""
        obj = ctx.find_object(CliContext) if ctx is not None else None
        if obj is None:
            self.fail(f"{cut(prefix.given)} is not a session id (expected a UUID)",
                      prefix.param, ctx)
        text = prefix.text
        found = obj.sessions_with_prefix(_dashed(text), limit=6)
        if not found:
            behind = obj.sessions_view_behind()
            if behind is not None:  # the log may hold it past where the view stopped
                raise ViewsBehind(f"no session id starts with {text} in the sessions view, "
                                  f"which is behind the log ({behind}): give the whole id")
            raise SessionNotFound(f"no session id starts with {text} in {obj.masked_uri}")
        if len(found) > 1:
            shown = ", ".join(str(s) for s in found[:5]) + (", …" if len(found) > 5 else "")
            self.fail(f"{cut(prefix.given)} is ambiguous: it starts {len(found)} session ids "
                      f"({shown}); give more of it", prefix.param, ctx)
        halted = obj.sessions_view_halted()
        if halted is not None:  # a session past where it stopped may start with it too
            raise ViewsBehind(f"{text} starts one session id in the sessions view ({found[0]}), "
                              f"which is halted {halted}; another one the log holds past the "
                              "halt may start with it too: give the whole id")
        return found[0]

    def shell_complete(self, ctx: click.Context, param: click.Parameter,
                       incomplete: str) -> list[CompletionItem]:
        """Session ids from the views (most recently active first), for ``terret … <TAB>``."""
        root = ctx.find_root()
        params = root.params
        # A person waits on the Tab key: an unreachable store gives up after COMPLETION_TIMEOUT
        # unless the line being completed gives its own --store-timeout.
        obj = CliContext(params.get("store_uri") or os.environ.get("TERRET_STORE")
                         or DEFAULT_STORE, params.get("views_path"), False,
                         store_timeout=params.get("store_timeout") or COMPLETION_TIMEOUT)
        try:
            text = incomplete.lower().removeprefix("session-")
            return [CompletionItem(str(s.id), help=s.title or s.status)
                    for s in obj.views(reads=()).sessions() if s.id.startswith(text)][:200]
        except Exception:  # noqa: BLE001 - completion must never print a traceback
            return []
        finally:
            obj.close()


SESSION = SessionIdType()

COMPLETION_TIMEOUT = 2.0
"""Seconds completion waits for a store that does not answer (then it completes nothing)."""


@dataclass(frozen=True)
class SessionPrefix:
    """A session-id prefix as given on the command line, not yet looked up (see
    :class:`SessionIdType`)."""

    text: str
    """Lowered, without ``session-``."""
    given: str
    param: click.Parameter | None = field(compare=False)


def resolve_prefixes(ctx: click.Context, values: dict[str, Any]) -> dict[str, Any]:
    """``values`` (a command's parameters) with each :class:`SessionPrefix` looked up."""
    return {name: SESSION.resolve(value, ctx) if isinstance(value, SessionPrefix) else value
            for name, value in values.items()}


class ModelSpecType(click.ParamType):
    """A ``provider:model`` spec, checked as ``model/set`` checks it (usage error if bad)."""

    name = "SPEC"

    def __init__(self, *, keys_refused: bool = True) -> None:
        self.keys_refused = keys_refused
        """A spec whose model looks like an API key is refused (``model set`` checks it itself:
        its ``--not-a-key`` records one all the same)."""

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> str:
        from terret.domain.events import validate_model_spec

        text = str(value)
        try:
            spec = validate_model_spec(text)
        except ValueError as exc:
            # A spec that may hold a credential (a URL's, a pasted key) is not quoted: it would
            # be on the screen.
            if not may_hold_secret(text):
                self.fail(f"{cut(value)}: {exc}", param, ctx)
            provider = text.partition(":")[0]
            shown = f"{provider}:…" if ":" in text and not may_hold_secret(provider) \
                else NOT_SHOWN
            self.fail(f"{shown}: {scrubbed(str(exc), text)}", param, ctx)
        if self.keys_refused and looks_like_key(spec):
            self.fail(f"{NOT_SHOWN}: {KEY_REFUSED}; `terret model set --not-a-key` records "
                      "it all the same", param, ctx)
        return spec


MODEL_SPEC = ModelSpecType()
ANY_MODEL_SPEC = ModelSpecType(keys_refused=False)


@dataclass
class Staleness:
    """How far the views a command read are behind the log: positions behind its head, and
    the projections halted on an event they could not process (they stay behind until it is
    skipped or their reader fixed)."""

    head: int
    behind: dict[str, int]
    halted: dict[str, tuple[int, str]]
    rebuilding: str | None = None
    """Who is rebuilding the views (another process): what they held before it began is shown,
    not caught up, until it commits."""

    def as_dict(self) -> dict[str, Any]:
        return {"head": self.head, "behind": max(self.behind.values(), default=0),
                "rebuilding": self.rebuilding,
                "projections": {name: {"behind": lag,
                                       "halted": ({"position": self.halted[name][0],
                                                   "error": self.halted[name][1]}
                                                  if name in self.halted else None)}
                                for name, lag in sorted(self.behind.items())}}

    def line(self) -> str:
        parts = []
        for name, lag in sorted(self.behind.items()):
            if name in self.halted:
                position, error = self.halted[name]
                parts.append(f"{name} halted at position {position} ({one_line(error, 80)}), "
                             f"{lag} behind")
            else:
                parts.append(f"{name} {lag} behind")
        during = (f" while {self.rebuilding} rebuilds them (shown as they were before)"
                  if self.rebuilding else "")
        return (f"warning: what follows is behind the log (head {self.head}){during}: "
                f"{'; '.join(parts)} — see `terret doctor`")




class WarningLines(logging.Handler):
    """What a command run without ``-v`` says of the log records it meets (WARNING and above):
    one line each on stderr, ``warning: <message>``, as its other notes — no time, no logger
    name, the message on one line (``-v`` logs them as they are). A projection's halt met while
    the views are caught up for a command that reads views is said by that command's own
    ``warning: what follows is behind the log …`` line (``CliContext.emit``) when it reads the
    projection, and by any later command that does: its record is left out (``halts_said``).
    Met elsewhere (``projections rebuild``), it is a ``warning:`` line."""

    HALTED = re.compile(r"projection \S+ halted at \d+: ")
    """A halt's record (``terret.projections``' applier)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.halts_said = False

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = " ".join(record.getMessage().split())
            if self.halts_said and record.name.startswith("terret.projections") \
                    and self.HALTED.match(message):
                return
            click.echo(f"warning: {printable(message)}", err=True)
        except Exception:  # noqa: BLE001 - logging's own contract: a failing handler reports
            self.handleError(record)

    def install(self) -> None:
        logging.getLogger().addHandler(self)

    def remove(self) -> None:
        logging.getLogger().removeHandler(self)


@dataclass
class CliContext:
    store_uri: str
    views_path: str | None
    json_output: bool
    store_timeout: float | None = None
    _store: EventStore | None = None
    _views: ViewStore | None = None
    _runner: ProjectionRunner | None = None
    _commands: SessionCommands | None = None
    _caught_up: bool = False
    _rebuilding: str | None = None
    _reached: int | None = None
    """The head the views were caught up to: events appended since by other processes are not
    "behind" (the command shows the log as of its start, as any read does)."""
    stale: Staleness | None = None
    """Set by ``views`` when what the views hold is behind the log (``emit`` reports it)."""
    _reads: set[str] | None = field(default_factory=set)
    closers: list[Any] = field(default_factory=list)
    log: WarningLines | None = None
    """Without ``-v``: the handler that turns log records into ``warning:`` lines."""

    @property
    def masked_uri(self) -> str:
        from terret.adapters.stores.uri import mask_credentials

        return mask_credentials(self.store_uri)

    def store(self, *, create: bool = False) -> EventStore:
        if self._store is None:
            from terret.adapters.stores.uri import open_store, sqlite_path

            self._views_apart()
            path = sqlite_path(self.store_uri)  # None for the other stores
            if path is not None and not create and not os.path.exists(path):
                raise StoreUnavailable(
                    f"no store at {path} (create one with `terret sessions new` or "
                    "`terret demo`, or pass --store)")
            timeout = self.store_timeout
            self._store = open_store(
                self.store_uri, retry_timeout=timeout,
                call_timeout=min(5.0, timeout) if timeout is not None else None)
            self.closers.append(self._store.close)
        return self._store

    def commands(self, *, create: bool = False) -> SessionCommands:
        """The domain's commands (``terret.runtime.commands``), on this store: the CLI issues
        every command through them, as the runtime does."""
        if self._commands is None:
            from terret.runtime.commands import SessionCommands

            self._commands = SessionCommands.on(self.store(create=create))
        return self._commands

    def view_store(self) -> ViewStore:
        if self._views is None:
            from terret.projections.base import ViewStore

            self._views_apart()
            path = self.views_path or default_views_path(self.store_uri)
            try:
                self._views = ViewStore(path)  # a damaged file or a full disk: typed errors
            except sqlite3.Error as exc:
                raise click.BadParameter(f"cannot open the views at {path}: {exc}",
                                         param_hint="'--views'") from None
            self.closers.append(self._views.close)
        return self._views

    def _views_apart(self) -> None:
        """Refuse a ``--views`` file that is the SQLite store's own (the same file, by any
        path): the views are a cache of the log, deleted and rebuilt at will, and their tables
        would go into the store. Checked before either is opened, so nothing is written."""
        if not self.views_path or self.views_path == ":memory:":
            return
        from terret.adapters.stores.uri import sqlite_path

        store = sqlite_path(self.store_uri)
        if store is None or not _same_file(store, self.views_path):
            return
        raise click.BadParameter(
            f"{self.views_path} is the store's own file ({self.masked_uri}): the views are a "
            "cache of the log, kept in a file of their own; give another file, or leave "
            f"--views out (default {default_views_path(self.store_uri)})",
            param_hint="'--views'")

    def runner(self) -> ProjectionRunner:
        if self._runner is None:
            from terret.projections.registry import serving_projections
            from terret.projections.runner import ProjectionRunner

            self._runner = ProjectionRunner(self.store(), self.view_store(),
                                            serving_projections())
        return self._runner

    def views(self, *, reads: Iterable[str] | None = None,
              session: UUID | None = None) -> Views:
        """The views, caught up with the store's head (read-your-writes for one-shot commands).
        ``reads`` names the projections the command shows: if any of them is behind the log
        (halted on an event it cannot process), ``stale`` says so and ``emit`` reports it.
        Views already at the head are used as they are, without loading the runner. With
        ``session`` (one the store holds: ``require_session``), ``PurgeUnfinished`` when its
        purge is recorded: the views forgot it, and would show it empty."""
        views = self._views_caught_up(reads)
        if session is not None:
            views.require_not_purged(session, self.store())
        return views

    def _views_caught_up(self, reads: Iterable[str] | None) -> Views:
        from terret.projections.views import Views

        if not self._caught_up:
            # A rebuild in another process holds the views' write lock until it commits:
            # show what they held before it began rather than wait for it.
            self.store()  # a missing store is said first, before a views file is made
            views = self.view_store()
            self._rebuilding = views.rebuild_lock.holder()
            if self._rebuilding is not None:
                self._refuse_other_stores(views)
            if self._rebuilding is None and not self._fresh():
                views.wait_for_rebuilds = False  # this catch-up only: a runtime's may wait
                try:
                    self._catch_up(said=reads is None or bool(reads))
                except ViewsBusy:  # a rebuild began while catching up: as above
                    self._reached = None
                    self._rebuilding = views.rebuild_lock.holder() or "another process"
                finally:
                    views.wait_for_rebuilds = True
            self._caught_up = True
        if (self._runner is not None or self._rebuilding) and (reads is None or reads):
            self.stale = self._staleness(self._read(reads))  # none on the fresh path
        return Views(self.view_store())

    def _refuse_other_stores(self, views: ViewStore) -> None:
        """``ViewsMismatch`` for views another store's process is rebuilding: what they hold
        (until it commits) is that store's, and this command cannot adopt them meanwhile —
        shown, another store's sessions passed for this one's, no word said."""
        mark = views.log_mark()
        if mark is None:  # never built: the rebuild is their first, nothing to show yet
            raise ViewsBusy(f"{self._rebuilding} is building the views in {views.path} for "
                            "the first time: run the command again once it ends")
        mine = self.store().store_id()
        if mark.store_id is None or mine is None or mark.store_id == mine:
            return
        raise ViewsMismatch(
            f"the views in {views.path} were built from another store ({mark.store_id}; this "
            f"is {mine}), and {self._rebuilding} is rebuilding them: they are not shown as "
            "this store's — run the command again once that rebuild ends, or give this store "
            "views of its own (--views)")

    def _read(self, reads: Iterable[str] | None) -> set[str] | None:
        """Every projection the command read so far (None: all): what one command shows from
        several reads (``approvals list``: approvals, then calls in doubt) is as stale as the
        stalest of them."""
        if reads is None or self._reads is None:
            self._reads = None
        else:
            self._reads |= set(reads)
        return self._reads

    def _catch_up(self, *, said: bool) -> None:
        """The views caught up with the log; a projection that halts meanwhile is ``said`` by
        the command's stale warning (when it reads some), so its log record is left out."""
        log = self.log
        if log is None or not said:
            self._reached = self.runner().catch_up()
            return
        log.halts_said = True
        try:
            self._reached = self.runner().catch_up()
        finally:
            log.halts_said = False

    def _fresh(self) -> bool:
        """Whether the views belong to this store's log and every projection is at its head,
        of its current version and not halted: then nothing is left to catch up."""
        if self._runner is not None:
            return False
        from terret.projections._logcheck import LogCheck
        from terret.projections.registry import serving_projections

        store, views, projections = self.store(), self.view_store(), serving_projections()
        if LogCheck(store, views, projections).check():
            return False  # emptied: they replay from position 0
        with views.reading() as db:
            tracked = dict(db.execute("SELECT projection, position FROM tracking").fetchall())
            versions = dict(db.execute(
                "SELECT projection, version FROM projection_versions").fetchall())
            halted = db.execute("SELECT 1 FROM projection_faults LIMIT 1").fetchone()
        if halted is not None:
            return False
        head = store.head_position()  # after the views (another process may move both)
        return all(tracked.get(p.name) == head and versions.get(p.name) == p.version
                   for p in projections)

    def _staleness(self, reads: Iterable[str] | None) -> Staleness | None:
        """Read from the views' bookkeeping, which needs no write (a runner's start-up does,
        and waits while another process rebuilds)."""
        from terret.projections.registry import serving_projections

        head = self.store().head_position() if self._reached is None else self._reached
        tracked, faults = self.view_store().bookkeeping()
        wanted = None if reads is None else set(reads)
        names = [p.name for p in serving_projections() if wanted is None or p.name in wanted]
        behind = {name: max(0, head - tracked.get(name, 0)) for name in names}
        behind = {name: lag for name, lag in behind.items() if lag or name in faults}
        if not behind:
            return None
        return Staleness(head, behind, {n: faults[n] for n in behind if n in faults},
                         self._rebuilding)

    def require_session(self, session_id: UUID, *, expiring: bool = False) -> None:
        """``SessionNotFound`` unless the store holds the session; ``SessionExpiring`` when
        its start has expired after a purge with a max age (unless ``expiring``: the caller
        acts on such a session, as a purge deletes it)."""
        from terret.adapters.stores.sqlite import SQLiteStore
        from terret.domain.repository import SessionRepository

        store = self.store()
        repository = SessionRepository(store)
        if not repository.exists(session_id):
            if isinstance(store, SQLiteStore):
                # A damaged index can hide a session's events without an error: make sure
                # the file is sound before saying the session does not exist.
                store.check_integrity()
            raise SessionNotFound(f"no session {session_id} in {self.masked_uri}")
        if store.native_expiry and not expiring:  # a partly expired one is not shown as whole
            repository.refuse_if_expiring(session_id)

    def refuse_if_purged(self, session_id: UUID) -> None:
        """For a command that reads the log, not the views: ``PurgeUnfinished`` (or
        ``SessionExpiring``) when the session's purge is recorded (``purge_on_record``: the
        views as far as they read, then the latest records) — its log would be shown whole."""
        from terret.projections.views import Views
        from terret.runtime.retention import purge_on_record

        try:
            views: Views | None = Views(self.view_store())
        except click.BadParameter:  # views it cannot open: the log's own record is read
            views = None
        purge = purge_on_record(self.store(), session_id, views)
        if purge is not None:
            purge.refuse(self.store())

    def sessions_view_behind(self) -> str | None:
        """How the sessions view (what prefixes are looked up in) is behind the log, or None
        when it is at its head."""
        stale = self._staleness(["sessions"])
        return stale.line().split(": ", 1)[1] if stale is not None else None

    def sessions_view_halted(self) -> str | None:
        """How the sessions view is halted, or None. Only a halt: a view a moment behind a
        serve's appends lacks sessions created meanwhile, not one a prefix was meant for."""
        stale = self._staleness(["sessions"])
        if stale is None or "sessions" not in stale.halted:
            return None
        position, error = stale.halted["sessions"]
        return f"at position {position}: {one_line(error, 80)} — see `terret doctor`"

    def session_state(self, session_id: UUID) -> Any:
        """The session's ``SessionState`` folded from its log (not a view)."""
        from terret.domain.repository import SessionRepository

        return SessionRepository(self.store()).get(session_id).state

    def sessions_with_prefix(self, prefix: str, *, limit: int) -> list[UUID]:
        """The session ids that start with ``prefix`` (from the sessions view, caught up)."""
        from terret.domain.store import SESSION_PREFIX

        views = self.views(reads=())
        pattern = SESSION_PREFIX + prefix.replace("\\", "").replace("%", "").replace("_", "")
        with views.store.reading() as db:
            rows = db.execute("SELECT session FROM sessions WHERE session LIKE ? ORDER BY"
                              " session LIMIT ?", (pattern + "%", limit)).fetchall()
            # A session whose purge stopped before it deleted the log: the view forgot it,
            # the store holds it — a prefix may mean it (running the purge again by prefix
            # deleted another session that happened to share it).
            purged = db.execute("SELECT DISTINCT purged FROM sessions_purged WHERE purged LIKE"
                                " ? ORDER BY purged", (pattern + "%",)).fetchall()
        store = self.store()
        found = {row[0] for row in rows}
        for (stream,) in purged:  # every one: most purges are done, their logs gone
            if len(found) >= limit:
                break
            if stream not in found and store.stream_version(stream) > 0:
                found.add(stream)
        return [UUID(stream.removeprefix(SESSION_PREFIX)) for stream in sorted(found)[:limit]]

    def close(self) -> None:
        for close in reversed(self.closers):
            try:
                close()
            except Exception:
                pass
        self.closers.clear()

    # --- output --------------------------------------------------------------------------

    def emit(self, data: Any, text: str | None = None, *, rows: bool = False) -> None:
        """Print ``data`` as JSON with --json, else ``text`` (or a readable rendering). When
        the views the command read are behind the log, one warning line goes to stderr and
        the JSON carries ``stale`` (in each item of a list, in each row of a table keyed by
        name, at the top of an object)."""
        if self.stale is not None:
            note(self.stale.line())
            if self.json_output:
                data = with_stale(data, self.stale.as_dict(), rows=rows)
        if self.json_output:
            click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))
        elif text is not None:
            click.echo(printable(text))  # a title's BEL or escape sequence: shown, not acted on
        else:
            click.echo(json.dumps(data, indent=2, default=str))


def _same_file(a: str, b: str) -> bool:
    """Whether two paths name one file: the same resolved path, or (both existing) the same
    file under two names (a hard link)."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet): two files
        return False


def with_stale(data: Any, stale: dict[str, Any], *, rows: bool = False) -> Any:
    """``data`` with the ``stale`` field: in each item of a list, in each row of a table keyed
    by name (``rows``), else at the top of an object."""
    if isinstance(data, list):
        return [{**item, "stale": stale} if isinstance(item, dict) else item for item in data]
    if isinstance(data, dict) and rows:
        return {k: {**v, "stale": stale} if isinstance(v, dict) else v for k, v in data.items()}
    if isinstance(data, dict):
        return {**data, "stale": stale}
    return data


def operator() -> Actor:
    from terret.domain.events import Actor

    try:
        user = getpass.getuser()
    except Exception:
        user = None
    return Actor(actor="operator", id=user)


def note(message: str) -> None:
    """Progress and status messages go to stderr, so stdout stays parseable."""
    click.echo(printable(message), err=True)


def parse_when(text: str, now: float | None = None) -> float:
    """``--since``/``--until``: an ISO date or date and time (local time unless it names its
    offset), or a duration back from now: ``30s``, ``15m``, ``2h``, ``3d``, ``1w``."""
    from datetime import datetime

    now = time.time() if now is None else now
    found = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([smhdw])", text.strip())
    if found:
        size = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}[found.group(2)]
        return now - float(found.group(1)) * size
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"{cut(text)} is neither a date (2026-12-01, 2026-12-01T09:30) nor a "
                         "duration (30s, 15m, 2h, 3d, 1w)") from None
    try:
        return when.timestamp()
    except (OverflowError, ValueError, OSError):
        # A date the platform's clock cannot place in local time (year 1, 9999-12-31T23:59
        # west of UTC): before or after every event, as the comparison needs.
        return float("-inf") if when.replace(tzinfo=None) < datetime(5000, 1, 1) \
            else float("inf")


class WhenType(click.ParamType):
    name = "WHEN"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> float:
        if isinstance(value, float):
            return value
        try:
            return parse_when(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


WHEN = WhenType()


def _dashed(prefix: str) -> str:
    """A prefix's hex digits with the dashes of a UUID's form (8-4-4-4-12) where they fall: a
    prefix counts digits, so ``584fabc0d4f2`` finds what ``584fabc0-d4f2`` finds."""
    digits = prefix.replace("-", "")
    groups = [digits[a:b] for a, b in ((0, 8), (8, 12), (12, 16), (16, 20), (20, 32))]
    return "-".join(g for g in groups if g)

