"""Cross-process wake-up and listing figures for the ``terret`` CLI.

(a) ``approve_to_resume_{sqlite,esdb}_ms``: a turn is parked on an approval in a ``terret
    serve`` process (the demo app: ``deploy`` needs a human). The bench process then runs the
    ``terret approve`` command's own code path in-process (``terret.cli.cli.main``: parse the
    command line, open the store, check the session, append ``approval/resolved``, close) and
    polls the log every 2 ms until the serving process's ``tool/result`` for that call is
    readable — the parked turn has resumed and run the call. The clock starts just before the
    command runs and stops when the result is readable: the median over the rounds is the
    figure. Not included, and printed separately: the start of a Python process that imports
    ``terret`` (``python -m terret --version``), which a user typing ``terret approve`` pays
    on top. SQLite: a file store (WAL, synchronous=FULL). EventStoreDB: the wire emulator in
    its own process (``python -m tests.support.esdb_emulator --port 0``).
(b) ``sessions_list_10k_s``: ``terret sessions list`` (text table) over 10,000 sessions, again
    the command's code path in-process, views already caught up with the log (the steady state:
    any earlier command or a serving process keeps them current). The first run, which also
    catches the views up with the 10,000 new sessions, is printed separately, as is ``--json``.

Usage: ``python bench/wake.py [--rounds N] [--sessions N] [--dir DIR]``. The last three lines
are the figures, in the order above.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from uuid import UUID

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _processes import clean_env as env  # noqa: E402
from _processes import emulator  # noqa: E402

from terret.adapters.stores.sqlite import SQLiteStore  # noqa: E402
from terret.adapters.stores.uri import open_store  # noqa: E402
from terret.cli import cli  # noqa: E402
from terret.domain.repository import SessionRepository  # noqa: E402
from terret.domain.session import Session  # noqa: E402
from terret.domain.store import EventStore, session_stream  # noqa: E402
from terret.runtime.writer import SessionWriter  # noqa: E402

APP = "terret.cli.demo_app:demo_app"
PROMPT = "Check the checkout service and deploy v2"
POLL = 0.002
TARGET_SQLITE_MS = 250.0
TARGET_ESDB_MS = 100.0
TARGET_LIST_S = 0.5


def run_cli(*args: str) -> float:
    """Run a `terret` command in this process; return its duration in seconds."""
    sink = io.StringIO()
    started = time.perf_counter()
    with contextlib.redirect_stdout(sink):
        cli.main(list(args), prog_name="terret", standalone_mode=False)
    return time.perf_counter() - started


def python_startup_ms(runs: int = 3) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "terret", "--version"], check=True, env=env(),
                       stdout=subprocess.DEVNULL, cwd=ROOT)
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


class Server:
    """``terret serve`` in its own process; its stderr is read as it comes."""

    def __init__(self, uri: str, views: Path) -> None:
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "terret", "--store", uri, "--views", str(views), "serve",
             "--app", APP], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            env=env(), cwd=ROOT)
        threading.Thread(target=self._pump, daemon=True).start()
        self.wait_line("serving ", 60)

    def _pump(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)

    def wait_line(self, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(text in line for line in self.lines):
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.005)
        raise RuntimeError(f"serve: no line with {text!r}: {''.join(self.lines)}")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def wait_for_result(store: EventStore, sid: UUID, call_id: str, timeout: float = 30) -> None:
    stream = session_stream(sid)
    seen = 0
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for record in store.read_stream(stream, from_seq=seen + 1):
            seen = record.seq
            if record.wire_name == "tool/result" and call_id.encode() in record.data:
                return
        time.sleep(POLL)
    raise RuntimeError(f"no tool/result for {call_id} in {sid}")


def approve_to_resume(name: str, uri: str, workdir: Path, rounds: int, warmup: int = 2
                      ) -> tuple[float, list[float], list[float]]:
    """Median ms from `terret approve` to the resumed call's result; per-round latencies and
    the approve command's own durations (ms)."""
    store = open_store(uri)
    writer = SessionWriter(SessionRepository(store))
    server = Server(uri, workdir / f"serve-{name}.views.db")
    cli_views = str(workdir / f"cli-{name}.views.db")
    latencies: list[float] = []
    commands: list[float] = []
    try:
        for i in range(warmup + rounds):
            session = Session.start(agent="demo", roles={"main": "demo:ops-model-1"})
            writer.create(session)
            sid = session.id
            writer.execute(sid, lambda s: s.queue(PROMPT, wake=True))
            server.wait_line(f"session {sid} parked on an approval", 30)
            # The parked call is now waiting for its verdict. A random pause: the serving
            # process polls SQLite for other processes' events every 50 ms, and a fixed pause
            # after its own last write would always land at the same phase of that poll.
            time.sleep(0.1 + random.random() * 0.05)
            started = time.perf_counter()
            command = run_cli("--store", uri, "--views", cli_views, "approve", str(sid),
                              "call-deploy")
            wait_for_result(store, sid, "call-deploy")
            elapsed = (time.perf_counter() - started) * 1000
            if i >= warmup:
                latencies.append(elapsed)
                commands.append(command * 1000)
    finally:
        server.stop()
        store.close()
    return statistics.median(latencies), latencies, commands


def sessions_list(workdir: Path, count: int) -> tuple[float, float, float, list[float]]:
    path = workdir / "list.db"
    fast = SQLiteStore(path, synchronous="OFF")  # creation only; the measured reads are normal
    repository = SessionRepository(fast)
    for _ in range(count):
        repository.save(Session.start(agent="demo", roles={"main": "demo:ops-model-1"}))
    fast.close()
    args = ("--store", str(path), "--views", str(workdir / "list.views.db"))
    cold = run_cli(*args, "sessions", "list")
    warm = [run_cli(*args, "sessions", "list") for _ in range(7)]
    as_json = statistics.median(run_cli(*args, "--json", "sessions", "list") for _ in range(3))
    return statistics.median(warm), cold, as_json, warm


def describe(latencies: list[float], commands: list[float]) -> str:
    ordered = sorted(latencies)
    p90 = ordered[min(len(ordered) - 1, int(round(0.9 * (len(ordered) - 1))))]
    return (f"median {statistics.median(latencies):.1f} ms, p90 {p90:.1f}, "
            f"min {ordered[0]:.1f}, max {ordered[-1]:.1f}; the approve command itself: "
            f"median {statistics.median(commands):.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--dir", default=None)
    args = parser.parse_args()
    if args.rounds < 10:
        parser.error("--rounds must be at least 10")
    workdir = Path(tempfile.mkdtemp(prefix="terret-wake-", dir=args.dir))
    try:
        startup = python_startup_ms()
        print(f"python startup + `import terret` (python -m terret --version, own process): "
              f"{startup:.0f} ms — paid on top by a user typing `terret approve`; "
              "not in the figures below")

        sqlite_uri = str(workdir / "wake.db")
        SQLiteStore(sqlite_uri).close()
        sqlite_ms, lat, cmd = approve_to_resume("sqlite", sqlite_uri, workdir, args.rounds)
        print(f"approve -> resume, SQLite, `terret serve` in another process, {args.rounds} "
              f"rounds (approve run in-process via terret.cli.cli.main, result polled every "
              f"{POLL * 1000:.0f} ms): {describe(lat, cmd)}")
        print("  rounds (ms): " + ", ".join(f"{x:.0f}" for x in lat))

        with emulator() as esdb_uri:
            esdb_ms, lat, cmd = approve_to_resume("esdb", esdb_uri, workdir, args.rounds)
        print(f"approve -> resume, EventStoreDB emulator (own process), `terret serve` in "
              f"another, {args.rounds} rounds (same method): {describe(lat, cmd)}")
        print("  rounds (ms): " + ", ".join(f"{x:.0f}" for x in lat))

        list_s, cold, as_json, warm = sessions_list(workdir, args.sessions)
        print(f"sessions list over {args.sessions} sessions (SQLite, in-process command, views "
              f"caught up): median {list_s:.3f} s of "
              + ", ".join(f"{x:.3f}" for x in warm)
              + f"; first run incl. catching the views up with {args.sessions} new sessions "
              f"{cold:.3f} s; --json {as_json:.3f} s")

        print(f"figure: approve_to_resume_sqlite_ms = {sqlite_ms:.1f} ms "
              f"(target <= {TARGET_SQLITE_MS:g})")
        print(f"figure: approve_to_resume_esdb_ms = {esdb_ms:.1f} ms "
              f"(target <= {TARGET_ESDB_MS:g})")
        print(f"figure: sessions_list_10k_s = {list_s:.3f} s (target <= {TARGET_LIST_S:g})")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
