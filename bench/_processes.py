"""Helpers the bench scripts share for running other processes: the environment a `terret`
subprocess gets, and the EventStoreDB wire emulator in a process of its own."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def clean_env(**extra: str) -> dict[str, str]:
    """This environment for a subprocess: the checkout importable, unbuffered output, and no
    TERRET_* defaults of the caller's that would point it elsewhere."""
    out = dict(os.environ)
    out["PYTHONPATH"] = str(ROOT) + os.pathsep + out.get("PYTHONPATH", "")
    out["PYTHONUNBUFFERED"] = "1"
    for name in ("TERRET_STORE", "TERRET_VIEWS", "TERRET_APP"):
        out.pop(name, None)
    out.update(extra)
    return out


@contextlib.contextmanager
def emulator() -> Iterator[str]:
    """The wire emulator in its own process (``python -m tests.support.esdb_emulator``);
    yields its URI and stops it on the way out."""
    proc = subprocess.Popen([sys.executable, "-m", "tests.support.esdb_emulator", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env=clean_env(), cwd=ROOT)
    try:
        assert proc.stdout is not None
        uri = proc.stdout.readline().strip()
        if not uri.startswith("esdb://"):
            raise RuntimeError(f"the emulator did not print its URI: {uri!r}")
        yield uri
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
