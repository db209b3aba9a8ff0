"""``terret projections status|rebuild|verify|skip`` and ``terret doctor``."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import click

from terret.adapters.stores.sqlite import SQLiteStore
from terret.adapters.stores.uri import sqlite_path
from terret.cli._context import CliContext, default_views_path, note
from terret.cli._format import plural, table
from terret.cli._owners import Liveness
from terret.domain.errors import InvalidStoreURI, StoreUnavailable, TerretError, ViewsBusy

if TYPE_CHECKING:
    from terret.projections.runner import ProjectionRunner, ProjectionState


@click.group("projections")
def projections() -> None:
    """Read models: their position and lag; rebuild or verify them from the log."""


@projections.command("status")
@click.pass_obj
def status(obj: CliContext) -> None:
    """Position and lag of each projection (lag is counted in log positions).

    Custom projections are listed once their module is imported (--extensions); one the views
    file tracks that this process does not load is listed as not loaded."""
    runner = obj.runner()
    states = [(s, True) for s in runner.states()] + [(s, False) for s in runner.unloaded()]
    other = runner.other_versions()
    versions = {p.name: p.version for p in runner.projections}
    # The positions as committed: a rebuild elsewhere replays in one transaction, unseen
    # until it commits, so a lag now may be the rebuild's, not a fault.
    rebuilding = obj.view_store().rebuild_lock.holder()
    data = [{"name": s.name, "position": s.position, "lag": s.lag, "loaded": loaded,
             "halted": {"position": s.fault[0], "error": s.fault[1]} if s.fault else None,
             "other_version": other.get(s.name), "rebuilding": rebuilding}
            for s, loaded in states]
    rows = [[s.name, str(s.position), str(s.lag), _state(s, loaded, other, versions)]
            for s, loaded in states]
    if rebuilding is not None:
        note(f"warning: {rebuilding} is rebuilding the views: shown as they were before it "
             "began, until it commits")
    obj.emit(data, table(rows, ["PROJECTION", "POSITION", "LAG", "STATE"]))


def _state(s: ProjectionState, loaded: bool, other: dict[str, int],
           versions: dict[str, int]) -> str:
    """The STATE column: halted, not loaded here, another release's, else ok."""
    notes = [f"HALTED at {s.fault[0]}: {s.fault[1]}"] if s.fault else []
    if not loaded:
        notes.append(_NOT_LOADED)
    elif s.name in other:
        notes.append(f"({_other_release(s.name, other[s.name], versions[s.name])})")
    return " ".join(notes) or "ok"


def _other_release(name: str, theirs: int, mine: int) -> str:
    """A projection whose view another release wrote: what this process does with it."""
    return (f"another release's: the views file holds version {theirs} of {name}, this "
            f"process has version {mine}; it neither maintains nor checks it")


_NOT_LOADED = "(not loaded here: --extensions its module)"


def _names(obj: CliContext, name: str | None) -> list[str]:
    runner = obj.runner()
    if name is None:
        return [p.name for p in runner.projections]
    runner.projection(name)  # KeyError names the known ones
    return [name]


@projections.command("rebuild")
@click.argument("name", required=False)
@click.pass_obj
def rebuild(obj: CliContext, name: str | None) -> None:
    """Drop a projection's view (all, without NAME) and replay it from position 0."""
    runner = obj.runner()
    names = _names(obj, name)
    obj.view_store().rebuild_lock.refuse_if_held()  # said before a progress bar is shown
    label = f"rebuilding {name}" if name else f"rebuilding {len(names)} projections"
    with _progress_bar(obj, label) as progress:
        head = runner.rebuild_all(names, progress=progress)  # one pass over the log for all
    states = {s.name: s for s in runner.states()}
    done = {n: states[n].position if states[n].fault else head for n in names}
    halted = {n: {"position": f[0], "error": f[1]}
              for n in names if (f := states[n].fault) is not None}
    obj.emit({"rebuilt": done, "halted": halted}, "\n".join(
        f"{k}: rebuilt up to {v}" + (f", HALTED at {halted[k]['position']}: "
                                     f"{halted[k]['error']}" if k in halted else "")
        for k, v in done.items()))
    if halted:  # the view is not the log's: as doctor says, a problem
        raise SystemExit(1)


@projections.command("verify")
@click.argument("name", required=False)
@click.pass_obj
def verify(obj: CliContext, name: str | None) -> None:
    """Rebuild into a scratch view and compare with the live one; exit 1 on any difference."""
    runner = obj.runner()
    runner.catch_up()
    names = _names(obj, name)
    if name is None:  # one NAME of another release's version is refused (ViewsMismatch)
        other = runner.other_versions()
        for n in (n for n in names if n in other):
            mine = runner.projection(n).version
            note(f"{n}: not verified — {_other_release(n, other[n], mine)}: verify it from a "
                 "process of that release")
        names = [n for n in names if n not in other]
    label = f"verifying {name}" if name else f"verifying {len(names)} projections"
    with _progress_bar(obj, label) as progress:
        report = runner.verify_all(names, progress=progress)  # one pass over the log for all
    for state in runner.states():  # a halted view equals a rebuild that halts: still not ok
        if state.name in report and state.fault is not None:
            report[state.name] = [f"halted at {state.fault[0]}: {state.fault[1]}",
                                  *report[state.name]]
    lines = []
    for projection, diffs in report.items():
        lines.append(f"{projection}: {'ok' if not diffs else _count(len(diffs), 'difference')}")
        lines.extend(f"  {d}" for d in diffs)
    obj.emit(report, "\n".join(lines))
    if any(report.values()):
        raise SystemExit(1)


@contextmanager
def _progress_bar(obj: CliContext, label: str) -> Iterator[Callable[[int, int], None]]:
    """One progress bar on stderr for a pass over the log, up to the store's head."""
    head = max(obj.store().head_position(), 1)
    with click.progressbar(length=head, label=label, file=sys.stderr, show_pos=True) as bar:
        seen = [0]

        def progress(position: int, total: int) -> None:
            bar.update(max(0, position - seen[0]))
            seen[0] = max(seen[0], position)

        yield progress


@projections.command("skip")
@click.argument("name")
@click.pass_obj
def skip(obj: CliContext, name: str) -> None:
    """Skip the event a halted projection stopped at (the skip is recorded); exit 1 if the
    replay after it halts again."""
    from terret.domain.errors import ProjectionNotHalted

    runner = obj.runner()
    try:
        position = runner.skip(name)
    except ProjectionNotHalted:
        # Not halted in the views as they are — they may be behind the event it halts at
        # (no process has caught them up since it was written): caught up, then asked again.
        runner.catch_up()
        position = runner.skip(name)
    fault = next(s.fault for s in runner.states() if s.name == name)
    halted = {"position": fault[0], "error": fault[1]} if fault is not None else None
    obj.emit({"projection": name, "skipped": position, "halted": halted},
             f"{name}: skipped position {position}" + (
                 f", HALTED again at {fault[0]}: {fault[1]}" if fault is not None else ""))
    if fault is not None:  # not following the log yet: as doctor says, a problem
        raise SystemExit(1)


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def _events(runner: ProjectionRunner) -> int:
    """How many events the sessions hold (the sessions view counts them): on EventStoreDB a
    position is a commit position, far larger than the number of events before it."""
    with runner.views.reading() as db:
        return int(db.execute("SELECT coalesce(sum(events), 0) FROM sessions").fetchone()[0])


@click.command("doctor")
@click.pass_obj
def doctor(obj: CliContext) -> None:
    """Check that the store and views are reachable and consistent, and say what to fix.

    On SQLite it also checks the file and folds its WAL into it, saying whether a copy of the
    file alone is now a whole backup."""
    checks: list[str] = []
    problems: list[str] = []
    _check_store(obj, checks, problems)
    views_path = obj.views_path or default_views_path(obj.store_uri)
    if views_path != ":memory:" and not os.path.exists(views_path):
        checks.append(f"views {views_path} do not exist yet; they will be built now")
    views = obj.view_store()
    rebuilding = views.rebuild_lock.holder()
    if rebuilding is None:
        views.wait_for_rebuilds = False  # one that begins while doctor catches up: as below
        try:
            _check_views(obj.runner(), checks, problems)
        except ViewsBusy:
            rebuilding = views.rebuild_lock.holder() or "another process"
        finally:
            views.wait_for_rebuilds = True
    if rebuilding is not None:  # its transaction holds the views: nothing to check until it ends
        checks.append(f"views {views_path} are being rebuilt by {rebuilding}: not checked — "
                      "run `terret doctor` again when it ends")
    obj.emit({"ok": not problems, "checks": checks, "problems": problems},
             "\n".join([*(f"ok    {c}" for c in checks), *(f"FIX   {p}" for p in problems)]))
    if problems:
        note(f"{_count(len(problems), 'problem')} found")
        raise SystemExit(1)


def _check_views(runner: ProjectionRunner, checks: list[str], problems: list[str]) -> None:
    reached = None
    try:
        reached = runner.catch_up()
    except ViewsBusy:
        raise  # not a problem of the views: a rebuild began meanwhile
    except TerretError as exc:
        problems.append(f"catching up the views failed: {exc}")
    halted = _check_states(runner, problems, reached)
    _check_unloaded(runner, checks, problems)
    if "sessions" not in halted:
        _check_purges(runner, checks, problems)
    if _events(runner) <= 200_000:
        _check_rebuild(runner, halted, checks, problems)
    else:
        checks.append("large store: run `terret projections verify` to compare with a rebuild")


def _check_store(obj: CliContext, checks: list[str], problems: list[str]) -> int:
    """The store reachable (and its file sound, on SQLite): its head. A store that is not is
    the command's error, for there is nothing more to check."""
    try:
        store = obj.store()
        head = store.head_position()
        checks.append(f"store {store.describe()} reachable, head position {head}")
        if isinstance(store, SQLiteStore):
            store.check_integrity()  # StoreCorrupt: restore it from a backup
            checks.append("store file sound (SQLite quick_check)")
            _check_checkpoint(store, checks, problems)
    except InvalidStoreURI:
        raise  # a usage error (exit 2), as for every other command
    except TerretError as exc:
        message = " ".join(str(exc).split())  # gRPC errors span several lines
        # Unreachable is most often a server that is down, not a wrong address: say both.
        hint = (" — is the server up? If it is, check --store / TERRET_STORE"
                if isinstance(exc, StoreUnavailable) and sqlite_path(obj.store_uri) is None
                else "")
        raise click.ClickException(f"{type(exc).__name__}: {message}{hint}") from None
    return head


def _check_checkpoint(store: SQLiteStore, checks: list[str], problems: list[str]) -> None:
    """docs/operations.md's backup by copying the file: doctor is the "open and close it once"
    step, so it says whether the file now holds every event."""
    whole, why = store.checkpoint()
    liveness = Liveness(store)  # as `terret workers` says: a killed one here is gone at once
    writers = sum(1 for beat in liveness.beats.values() if liveness.live(beat))
    if whole and writers:
        # Folded for now: a live worker's next append puts events in the WAL again.
        checks.append(f"store WAL folded into the file, but "
                      f"{plural(writers, 'live worker')} (terret serve) "
                      f"{'writes' if writers == 1 else 'write'} to it: back up with SQLite's "
                      "online backup (sqlite3 FILE \".backup COPY\"), not by copying the file")
    elif whole:
        checks.append("store WAL folded into the file (a copy of it alone is a whole backup "
                      "while nothing writes)")
    elif why is None:
        checks.append("store WAL in use by another process: back up with SQLite's online "
                      "backup (sqlite3 FILE \".backup COPY\"), not by copying the file")
    else:
        problems.append(f"the store's WAL could not be folded into {store.path} ({why}): the "
                        "file alone lacks the last events — free some space and run `terret "
                        f"doctor` again before copying it, or copy {store.path}-wal with it")


PURGES_CHECKED = 1000
"""How many of the latest purges doctor checks were carried out (a read of the store each)."""


def _check_purges(runner: ProjectionRunner, checks: list[str], problems: list[str]) -> None:
    """A purge recorded whose session's log is still in the store: its process stopped between
    the two (the views forgot the session; its readers say ``PurgeUnfinished``)."""
    from terret.projections.views import Views
    from terret.runtime.retention import purges_left_undone

    recorded, undone = purges_left_undone(runner.store, Views(runner.views), PURGES_CHECKED)
    for purge in undone:
        problems.append(f"session {purge.id}: its purge is recorded but its log is still in "
                        f"the store — run `terret sessions purge {purge.id} --yes` to finish it")
    if recorded and not undone:
        checks.append("every purge recorded is done" if recorded <= PURGES_CHECKED else
                      f"the last {PURGES_CHECKED} of {recorded} purges recorded are done")


def _check_states(runner: ProjectionRunner, problems: list[str], reached: int | None
                  ) -> set[str]:
    """Each projection halted or behind the head it was caught up to (``reached``: events
    appended since, by a process writing beside doctor, are no lag) is a problem; the names of
    the halted ones."""
    halted = set()
    other = runner.other_versions()  # another release's to maintain: said by _check_rebuild
    for state in runner.states(reached):
        if state.fault:
            halted.add(state.name)
            problems.append(
                f"projection {state.name} halted at {state.fault[0]}: {state.fault[1]} — "
                f"fix the event's reader or run `terret projections skip {state.name}`")
        elif state.lag and state.name not in other:
            problems.append(f"projection {state.name} lags by {state.lag}")
    return halted


def _check_unloaded(runner: ProjectionRunner, checks: list[str], problems: list[str]) -> None:
    """Projections the views file tracks that this process does not load (a custom one whose
    module it has not imported): not checked here, and a problem if it is halted."""
    for state in runner.unloaded():
        how = (f"give --extensions the module that registers it to check it, or to run "
               f"`terret projections skip {state.name}`")
        if state.fault:
            problems.append(f"projection {state.name} halted at {state.fault[0]}: "
                            f"{state.fault[1]} — it is not loaded in this process: {how}")
        else:
            checks.append(f"projection {state.name} (position {state.position}) not checked:"
                          f" it is not loaded in this process; {how}")


def _check_rebuild(runner: ProjectionRunner, halted: set[str], checks: list[str],
                   problems: list[str]) -> None:
    """Every projection against a rebuild from the log, in one pass over it."""
    equal = []
    from terret.projections._operations import REPLAY_HALTS

    other = runner.other_versions()
    for name, theirs in other.items():
        version = runner.projection(name).version
        problems.append(f"projection {name}: {_other_release(name, theirs, version)} — check it "
                        "from a process of that release, or restart this one on it")
    mine = [p.name for p in runner.projections if p.name not in other]
    for name, diffs in runner.verify_all(mine).items():
        if diffs and diffs[0].startswith(REPLAY_HALTS):
            # A rebuild would halt the live view there too: the event's reader is the fix.
            problems.append(f"projection {name} differs from a rebuild, whose replay halts "
                            f"at{diffs[0].removeprefix(REPLAY_HALTS)} — fix the event's reader "
                            f"(its class, an upcaster) here; `terret projections rebuild "
                            f"{name}` would halt the live view there too")
        elif diffs:
            problems.append(f"projection {name} differs from a rebuild — run "
                            f"`terret projections rebuild {name}`")
        elif name not in halted:  # a halted one equals a rebuild that halts alike
            equal.append(name)
    if len(equal) == len(runner.projections):
        checks.append("every projection equals a rebuild from the log" if not
                      runner.unloaded() else
                      "every projection loaded here equals a rebuild from the log")
    elif len(equal) == len(mine) and not other.keys() & halted:
        checks.append("every projection of this release's versions equals a rebuild from the "
                      "log")
    elif equal:  # never claim more than was found: the others are problems above
        checks.append(f"projections {', '.join(equal)} equal a rebuild from the log")


def register(cli: click.Group) -> None:
    cli.add_command(projections)
    cli.add_command(doctor)
