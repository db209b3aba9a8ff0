"""Ownership figures (R28, R29): real ``terret serve`` workers on one store, as a deployment
runs them (the app is ``tests.ownership.app:app``: a scripted model and a tool that records its
executions).

* ``handoff_ms`` — a turn parked on an approval in worker A, worker B serving beside it: the
  clock starts when A gets SIGTERM and stops when B's ``agent/attached`` for the session is
  readable in the log (A released the session, B took it and parked the call again). Median over
  the rounds. Default TTL (15 s): a graceful stop does not wait for the lease.
* ``failover_s`` — the same, but A gets SIGKILL while its tool runs: until B's attach is
  readable. On one host a dead owner is seen at once (its pid is gone); beside it the script
  prints ``frozen_takeover_s``, an owner frozen with SIGSTOP (alive by its pid), which only the
  lease's expiry tells: that is the figure of a worker on another machine that died. Both with
  the default TTL of 15 s; target ``TTL + 2 s``.
* ``pool_balance`` — three workers, 60 sessions woken by ``inject --wake``: the sessions of the
  busiest worker divided by the mean (1.0 = perfectly even).

Usage: ``python bench/ownership.py [--store esdb|sqlite] [--rounds N]``. The store defaults to
the EventStoreDB wire emulator in its own process (the pool case); the last three lines are the
figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from uuid import UUID

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _processes import clean_env, emulator  # noqa: E402

from terret import Runtime, StaticResolver  # noqa: E402
from terret.adapters.stores import open_store  # noqa: E402
from terret.domain.store import EventStore, session_stream  # noqa: E402

APP = "tests.ownership.app:app"
TTL = 15.0
POLL = 0.005


def _env(runs: Path, **extra: str) -> dict[str, str]:
    return clean_env(OWNERSHIP_RUNS=str(runs), OWNERSHIP_TTL=str(TTL), **extra)


class Deployment:
    def __init__(self, uri: str, workdir: Path, **env: str) -> None:
        self.uri, self.workdir = uri, workdir
        self.runs = workdir / "runs.txt"
        self.env = _env(self.runs, **env)
        self.store: EventStore = open_store(uri)
        self.operator = Runtime(self.store, resolver=StaticResolver())
        self.workers: list[subprocess.Popen[str]] = []
        self._n = 0

    def serve(self) -> subprocess.Popen[str]:
        self._n += 1
        proc = subprocess.Popen(
            [sys.executable, "-m", "terret", "--store", self.uri, "--views",
             str(self.workdir / f"views-{self._n}.db"), "serve", "--app", APP],
            cwd=ROOT, env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            text=True)
        assert proc.stderr is not None
        for line in proc.stderr:  # wait for the serving line; the rest of stderr is dropped
            if line.startswith("serving "):
                break
        else:
            raise RuntimeError(f"a worker did not start (exit {proc.wait()})")
        threading.Thread(target=proc.stderr.read, daemon=True).start()  # keep draining it
        self.workers.append(proc)
        return proc

    def log(self, sid: UUID) -> list[tuple[str, dict[str, object]]]:
        return [(r.wire_name, json.loads(r.data))
                for r in self.store.read_stream(session_stream(sid))]

    def wait(self, sid: UUID, test: object, timeout: float = 60.0) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if test(self.log(sid)):  # type: ignore[operator]
                return time.monotonic()
            time.sleep(POLL)
        raise RuntimeError(f"timed out on session {sid}: {[n for n, _ in self.log(sid)]}")

    def started(self, sid: UUID) -> bool:
        return self.runs.exists() and str(sid) in self.runs.read_text()

    def close(self) -> None:
        for proc in self.workers:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
                proc.wait(10)
        self.operator.close(grace=0)
        self.store.close()


def _attached(pid: int) -> object:
    return lambda log: any(n == "agent/attached" and d["pid"] == pid for n, d in log)


def _owner(log: list[tuple[str, dict[str, object]]]) -> int:
    return int([d["pid"] for n, d in log if n == "agent/attached"][-1])  # type: ignore[call-overload]


def takeover(uri: str, workdir: Path, how: str) -> float:
    """Seconds from the owner's SIGTERM / SIGKILL / SIGSTOP to the survivor's attach."""
    d = Deployment(uri, workdir, OWNERSHIP_TOOL_SECONDS="30")
    try:
        a = d.serve()
        sid = d.operator.create_session()
        d.operator.inject(sid, "gated deploy" if how == "term" else "work", wake=True)
        if how == "term":
            d.wait(sid, lambda log: any(n == "approval/requested" for n, _ in log))
        else:
            d.wait(sid, lambda log: d.started(sid))
        b = d.serve()
        assert _owner(d.log(sid)) == a.pid
        sig = {"term": signal.SIGTERM, "kill": signal.SIGKILL, "stop": signal.SIGSTOP}[how]
        start = time.monotonic()
        a.send_signal(sig)
        return d.wait(sid, _attached(b.pid), timeout=TTL * 3) - start
    finally:
        d.close()


def balance(uri: str, workdir: Path, sessions: int = 60) -> tuple[float, Counter[int]]:
    d = Deployment(uri, workdir, OWNERSHIP_TOOL_SECONDS="0.05")
    try:
        workers = [d.serve() for _ in range(3)]
        sids = [d.operator.create_session() for _ in range(sessions)]
        for sid in sids:
            d.operator.inject(sid, "work", wake=True)
        owners: Counter[int] = Counter()
        for sid in sids:
            d.wait(sid, lambda log: any(n == "turn/end" for n, _ in log), timeout=120)
            owners[_owner(d.log(sid))] += 1
        assert set(owners) <= {w.pid for w in workers}
        mean = sessions / len(workers)
        return max(owners.values()) / mean, owners
    finally:
        d.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", choices=("esdb", "sqlite"), default="esdb")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="terret-bench-ownership-") as tmp:
        with contextlib.ExitStack() as stack:
            def store_uri(name: str) -> str:
                if args.store == "sqlite":
                    return str(Path(tmp) / f"{name}.db")
                return stack.enter_context(emulator())

            def workdir(name: str) -> Path:
                path = Path(tmp) / name
                path.mkdir()
                return path

            handoffs = [takeover(store_uri(f"h{i}"), workdir(f"h{i}"), "term")
                        for i in range(args.rounds)]
            failovers = [takeover(store_uri(f"f{i}"), workdir(f"f{i}"), "kill")
                         for i in range(args.rounds)]
            frozen = [takeover(store_uri(f"z{i}"), workdir(f"z{i}"), "stop") for i in range(2)]
            ratio, owners = balance(store_uri("pool"), workdir("pool"))
    print(f"store: {args.store}; TTL {TTL:g} s; {args.rounds} rounds")
    print(f"handoff ms: {[round(h * 1000) for h in handoffs]}")
    print(f"failover s (SIGKILL, same host): {[round(f, 2) for f in failovers]}")
    print(f"frozen_takeover_s (SIGSTOP: the lease decides): {[round(z, 2) for z in frozen]} "
          f"(target <= {TTL + 2:g})")
    print(f"pool: sessions per worker {sorted(owners.values())}")
    print(f"figure: handoff_ms = {statistics.median(handoffs) * 1000:.0f} ms (target <= 1000)")
    print(f"figure: failover_s = {statistics.median(failovers):.2f} s "
          f"(target <= {TTL + 2:g})")
    print(f"figure: pool_balance = {ratio:.2f} x (target <= 1.5)")


if __name__ == "__main__":
    main()
