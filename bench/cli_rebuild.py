"""Rebuild speed as the user gets it: ``terret projections rebuild`` end to end.

``cli_rebuild_vs_ceiling``: the real CLI run as a subprocess (``python -m terret --store S
--views V projections rebuild``: start the interpreter, import, open the store and the views,
drop every projection's view and replay the log once for all of them, exit) on a SQLite store
of 100,000 events (bench/projections.py's log: 100 sessions of 1,000 events, interleaved), its
rate (events / wall-clock seconds) against the ceiling: a bare read-and-decode loop over the
same events in this process (``store.read_all`` pages of 1,000 and
``terret.domain.codec.decode``), measured in the same run. Rounds alternate the two; the figure
is the median over rounds of bare time / CLI time (1.0: the CLI rebuilds as fast as events can
merely be read and decoded).

Printed beside it: ``terret projections verify`` and ``terret doctor`` measured the same way
(both read the log once for all projections too), and the interpreter's bare start-up
(``python -c pass``).

Usage: ``python bench/cli_rebuild.py [--dir DIR] [--rounds 5]``; files go to a temporary
directory under DIR, removed afterwards.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from projections import build_sessions, read_and_decode  # bench/projections.py

TARGET = 0.4
REPO = Path(__file__).resolve().parents[1]


PYCACHE: Path | None = None
"""Where the CLI's byte-code goes. An installed package has its modules compiled (pip does it),
so the CLI measured must too: ``PYTHONDONTWRITEBYTECODE`` (set on the development machines) is
dropped, the cache is the bench's own (nothing is written to the source tree), and the warm-up
run fills it; otherwise every module edited since the venv was built is compiled each run."""


def run_cli(store: Path, views: Path, *args: str) -> float:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = str(REPO)
    if PYCACHE is not None:
        env["PYTHONPYCACHEPREFIX"] = str(PYCACHE)
    began = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "terret", "--store", str(store), "--views",
                           str(views), *args], capture_output=True, text=True, env=env,
                          cwd=REPO)
    spent = time.perf_counter() - began
    if done.returncode != 0:
        raise SystemExit(f"terret {' '.join(args)} failed ({done.returncode}):\n"
                         f"{done.stdout}\n{done.stderr}")
    return spent


def python_start() -> float:
    began = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", default=None)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="terret-bench-cli-rebuild-", dir=args.dir))
    global PYCACHE
    PYCACHE = workdir / "pycache"
    try:
        store = workdir / "events.db"
        began = time.perf_counter()
        head = build_sessions(store)
        print(f"built {head} events in {time.perf_counter() - began:.1f} s")
        views = workdir / "events.views.db"
        read_and_decode(store)  # warm the page cache
        run_cli(store, views, "projections", "rebuild")  # warm up, and create the views
        bare: list[float] = []
        rebuild: list[float] = []
        ratios: list[float] = []
        for _ in range(args.rounds):
            count, spent = read_and_decode(store)
            assert count == head
            bare.append(spent)
            rebuild.append(run_cli(store, views, "projections", "rebuild"))
            ratios.append(bare[-1] / rebuild[-1])
        verify = [run_cli(store, views, "projections", "verify") for _ in range(3)]
        doctor = [run_cli(store, views, "doctor") for _ in range(3)]
        start = statistics.median(python_start() for _ in range(5))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    bare_s = statistics.median(bare)
    print(f"bare read + decode: {head / bare_s:9.0f} events/s ({bare_s:.2f} s; runs: "
          + ", ".join(f"{b:.2f}" for b in bare) + ")")
    for name, times in (("projections rebuild", rebuild), ("projections verify", verify),
                        ("doctor", doctor)):
        median = statistics.median(times)
        print(f"terret {name:20} {head / median:9.0f} events/s ({median:.2f} s end to end; "
              f"{bare_s / median:.2f} x the ceiling; runs: "
              + ", ".join(f"{t:.2f}" for t in times) + ")")
    print(f"python -c pass: {start * 1e3:.0f} ms")
    ratio = statistics.median(ratios)
    print(f"figure: cli_rebuild_vs_ceiling = {ratio:.2f} x (target >= {TARGET})")


if __name__ == "__main__":
    main()
