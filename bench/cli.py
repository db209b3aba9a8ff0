"""Start-up of the ``terret`` command line, as a user pays it: whole processes.

Each round runs, in a shuffled order, a bare ``python -c pass`` and the everyday commands as
real processes — ``terret --version``, ``terret --help``, ``terret sessions list`` (a SQLite
store of ``--sessions`` sessions, its views already caught up: the steady state, as when a
``terret serve`` on the store keeps them current) and ``terret approve`` (a fresh parked session
each round, in a store of its own so that its appends do not put the listed store's views
behind: the command loads the session, checks the call is pending and appends
``approval/resolved``). The wall-clock time of each process, from spawn to exit, is measured; a
command's figure is its median minus the median of ``python -c pass`` in the same run, so the
interpreter's own start-up (and the machine's speed) cancels out. Printed beside the figures,
not in them: ``sessions list`` right after an append to its store (it catches the views up
first, loading the projection runner and the payload classes), and a bare import of the stack
``approve`` is built on (click, pydantic, eventsourcing), and the same with one payload
validated: its floor.

The commands run through the ``terret`` console script installed beside the interpreter (what
a user types), or ``python -m terret`` where there is none. Byte-code caching is on, as for an
installed package (pip compiles it at install): ``PYTHONDONTWRITEBYTECODE`` is dropped, the
cache goes to the bench's directory (``PYTHONPYCACHEPREFIX``, nothing is written to the source
tree), and a first round that is not measured fills it.

Usage: ``python bench/cli.py [--rounds N] [--sessions N] [--dir DIR]``. It prints one line per
command, then the figure line last: ``cli_startup_over_python_ms``, the slowest command's
median over ``python -c pass`` (target <= 120 ms).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TARGET_MS = 120.0

FLOOR = "(stack imports only)"
"""Not a figure: a process that only imports what ``approve`` cannot do without — click, pydantic
(the event payloads) and eventsourcing (the aggregate and the recorder interfaces) — to show how
much of a command's time is the chosen stack's own start-up."""

FLOOR_VALIDATING = "(stack, one payload read)"
"""Not a figure: the same imports, then one pydantic model (configured as Terret's payloads are)
defined and one JSON payload validated — what any command that reads an event pays before it
does anything of its own: pydantic's lazily imported modules, its plugin discovery (which imports
``importlib.metadata``) and one validator built. ``approve`` reads a session's events, so this is
its floor with the chosen stack."""

_VALIDATE_ONE = """
import click, eventsourcing.persistence, eventsourcing.domain
from pydantic import BaseModel, ConfigDict, Field
class Payload(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)
    count: int = Field(ge=0)
Payload.model_validate_json('{"count": 1}')
"""


def _terret() -> list[str]:
    script = Path(sys.executable).with_name("terret")
    return [str(script)] if script.exists() else [sys.executable, "-m", "terret"]


PYCACHE: Path | None = None


def _env() -> dict[str, str]:
    env = dict(os.environ)
    for name in ("TERRET_STORE", "TERRET_VIEWS", "TERRET_APP", "PYTHONDONTWRITEBYTECODE"):
        env.pop(name, None)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    if PYCACHE is not None:
        env["PYTHONPYCACHEPREFIX"] = str(PYCACHE)
    return env


def _prepare(directory: Path, sessions: int, parked: int) -> tuple[str, list[str]]:
    """A store in ``directory`` with ``sessions`` finished sessions and ``parked`` ones waiting
    on an approval; the views caught up (one ``sessions list``)."""
    directory.mkdir(parents=True, exist_ok=True)
    from terret.adapters.stores.sqlite import SQLiteStore
    from terret.domain.events import ToolCallData, UsageData
    from terret.domain.session import Session
    from terret.runtime.commands import SessionCommands

    path = directory / "bench.db"
    store = SQLiteStore(path)
    commands = SessionCommands.on(store)
    writer = commands.writer
    for i in range(sessions):
        sid = commands.create(agent="demo", roles={"main": "demo:ops-model-1"})
        writer.execute(sid, partial(Session.start_turn, trigger="user", text=f"status {i}"))
        writer.execute(sid, lambda s: s.start_step("demo:ops-model-1"))
        writer.execute(sid, lambda s: s.record_assistant("All green."))
        writer.execute(sid, lambda s: s.end_step(UsageData(prompt_tokens=100,
                                                           completion_tokens=10, cost=0.01)))
        writer.execute(sid, lambda s: s.end_turn("completed"))
        writer.execute(sid, partial(Session.title, title=f"Session {i}", automatic=True))
    waiting = []
    args = {"service": "checkout", "version": "v2"}
    for _ in range(parked):
        sid = commands.create(agent="demo", roles={"main": "demo:ops-model-1"})
        writer.execute(sid, lambda s: s.start_turn(trigger="user", text="deploy v2"))
        writer.execute(sid, lambda s: s.start_step("demo:ops-model-1"))
        writer.execute(sid, lambda s: s.record_assistant(
            "", [ToolCallData(id="call-deploy", name="deploy", args=args)]))
        writer.execute(sid, lambda s: s.request_approval("call-deploy", "deploy", args))
        waiting.append(str(sid))
    store.close()
    done = subprocess.run([*_terret(), "--store", str(path), "sessions", "list"],
                          capture_output=True, text=True, env=_env(), cwd=directory)
    assert done.returncode == 0, done.stderr
    return str(path), waiting


def _time(argv: list[str], cwd: Path) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=_env(),
                          cwd=cwd)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {done.stderr.decode()}")
    return elapsed * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--dir", type=Path, default=None)
    options = parser.parse_args()
    directory = Path(options.dir or tempfile.mkdtemp(prefix="terret-bench-cli-"))
    directory.mkdir(parents=True, exist_ok=True)
    global PYCACHE
    PYCACHE = directory / "pycache"
    store, _ = _prepare(directory / "listed", options.sessions, 0)
    approvals, parked = _prepare(directory / "approved", options.sessions,
                                 options.rounds + 1)
    behind, stale = _prepare(directory / "behind", options.sessions, options.rounds + 1)
    terret = _terret()
    base = [*terret, "--store", store]
    commands: dict[str, list[str]] = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "terret --version": [*terret, "--version"],
        "terret --help": [*terret, "--help"],
        "terret sessions list": [*base, "sessions", "list"],
        FLOOR: [sys.executable, "-c", "import click, pydantic.main, eventsourcing.persistence"],
        FLOOR_VALIDATING: [sys.executable, "-c", _VALIDATE_ONE],
    }
    extra = "(sessions list, views behind)"
    times: dict[str, list[float]] = {name: [] for name in [*commands, "terret approve", extra]}
    rng = random.Random(15)
    for round_ in range(options.rounds + 1):  # round 0 fills the byte-code cache
        runs = [*commands.items(),
                ("terret approve", [*terret, "--store", approvals, "approve", parked[round_],
                                    "call-deploy"])]
        rng.shuffle(runs)
        for name, argv in runs:
            elapsed = _time(argv, directory)
            if round_:
                times[name].append(elapsed)
        # Not a figure: an append lands, then the list catches the views up.
        _time([*terret, "--store", behind, "approve", stale[round_], "call-deploy"], directory)
        elapsed = _time([*terret, "--store", behind, "sessions", "list"], directory)
        if round_:
            times[extra].append(elapsed)
    bare = statistics.median(times["python -c pass"])
    print(f"{'command':<30} {'median ms':>10} {'min ms':>8} {'over python ms':>15}")
    over: dict[str, float] = {}
    for name, samples in times.items():
        median = statistics.median(samples)
        over[name] = median - bare
        print(f"{name:<30} {median:>10.1f} {min(samples):>8.1f} {over[name]:>15.1f}")
    print(f"(rounds {options.rounds}, {options.sessions} sessions in the store, via "
          f"{' '.join(terret[-2:]) if len(terret) > 1 else terret[0]}, cpus {os.cpu_count()})")
    not_commands = ("python -c pass", extra, FLOOR, FLOOR_VALIDATING)
    worst = max((v, k) for k, v in over.items() if k not in not_commands)
    print(f"slowest: {worst[1]}")
    if options.dir is None:
        shutil.rmtree(directory, ignore_errors=True)
    print(f"figure: cli_startup_over_python_ms = {worst[0]:.1f} ms (target <= {TARGET_MS:.0f})")


if __name__ == "__main__":
    main()
