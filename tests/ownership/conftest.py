"""Fixtures for the ownership tests: ``terret serve`` workers as real processes on one store (a
SQLite file, or an EventStoreDB emulator of the test's own, or ``TERRET_ESDB_URI``), serving
``tests.ownership.app:app``, and a runtime in the test process acting as an operator."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from terret import Runtime, StaticResolver
from terret.adapters.stores import open_store
from terret.domain.store import EventStore, session_stream
from tests.support.esdb_emulator import EsdbEmulator
from tests.support.esdb_fixtures import real_server_uri

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.ownership.app:app"
DEADLINE = 60.0


@dataclass
class Worker:
    """One ``terret serve`` process."""

    name: str
    popen: subprocess.Popen[str]
    err: list[str] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def signal(self, signum: int) -> None:
        self.popen.send_signal(signum)

    def wait(self, timeout: float = 30.0) -> int:
        return self.popen.wait(timeout)


@dataclass
class Pool:
    kind: str
    uri: str
    store: EventStore
    tmp: Path
    runs: Path
    env: dict[str, str]
    workers: list[Worker] = field(default_factory=list)
    operator: Runtime | None = None
    emulator: EsdbEmulator | None = None
    """The test's own emulator (None on SQLite or a real server)."""

    def serve(self, name: str, *args: str, **env: str) -> Worker:
        """Start a worker (``args``: more options of ``serve``) and wait until it serves."""
        popen = subprocess.Popen(
            [sys.executable, "-m", "terret", "--store", self.uri,
             "--views", str(self.tmp / f"views-{name}.db"), "serve", "--app", APP,
             "--grace", "20", *args],
            cwd=ROOT, env={**self.env, **env}, stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL, text=True)
        worker = Worker(name, popen)
        threading.Thread(target=_pump, args=(popen, worker.err), daemon=True).start()
        self.workers.append(worker)
        wait_until(lambda: any("serving " in line for line in worker.err),
                   f"{name} serving", lambda: "".join(worker.err))
        return worker

    def runtime(self) -> Runtime:
        """The operator's runtime in this process (never started: no agents, no serving)."""
        if self.operator is None:
            self.operator = Runtime(self.store, resolver=StaticResolver())
        return self.operator

    def new_session(self) -> UUID:
        return self.runtime().create_session()

    def log(self, sid: UUID) -> list[tuple[str, dict[str, Any]]]:
        return [(r.wire_name, json.loads(r.data))
                for r in self.store.read_stream(session_stream(sid))]

    def names(self, sid: UUID) -> list[str]:
        return [name for name, _ in self.log(sid)]

    def executions(self, session: UUID | None = None) -> list[tuple[str, str, int]]:
        """``(start|end, call id, pid)`` per line the tools wrote (of one session, or all)."""
        if not self.runs.exists():
            return []
        out = []
        for line in self.runs.read_text().splitlines():
            what, sid, call_id, pid = line.split()
            if session is None or sid == str(session):
                out.append((what, call_id, int(pid)))
        return out

    def wait_for(self, sid: UUID, name: str, count: int = 1,
                 timeout: float = DEADLINE) -> list[tuple[str, dict[str, Any]]]:
        wait_until(lambda: self.names(sid).count(name) >= count, f"{count} × {name}",
                   lambda: f"{self.names(sid)}\n" + self.stderr(), timeout)
        return self.log(sid)

    def stderr(self) -> str:
        return "\n".join(f"--- {w.name}\n{''.join(w.err)}" for w in self.workers)


def _pump(popen: subprocess.Popen[str], sink: list[str]) -> None:
    assert popen.stderr is not None
    for line in popen.stderr:
        sink.append(line)


def wait_until(condition: Callable[[], Any], what: str,
               details: Callable[[], str] = lambda: "", timeout: float = DEADLINE) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}\n{details()}")


@pytest.fixture(params=["sqlite", "esdb"])
def pool(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Pool]:
    emulator: EsdbEmulator | None = None
    if request.param == "sqlite":
        uri = str(tmp_path / "events.db")
    elif real_server_uri() is not None:
        uri = real_server_uri()  # type: ignore[assignment]
    else:
        emulator = EsdbEmulator().start(host="127.0.0.1", port=0)
        uri = emulator.uri
    store = open_store(uri)
    env = dict(os.environ)
    env.update({"PYTHONPATH": str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
                "PYTHONUNBUFFERED": "1", "OWNERSHIP_RUNS": str(tmp_path / "runs.txt")})
    for key in ("TERRET_STORE", "TERRET_VIEWS", "TERRET_APP"):
        env.pop(key, None)
    pool = Pool(request.param, uri, store, tmp_path, tmp_path / "runs.txt", env,
                emulator=emulator)
    try:
        yield pool
    finally:
        for worker in pool.workers:
            if worker.popen.poll() is None:
                worker.signal(signal.SIGCONT)
                worker.popen.kill()
                worker.popen.wait(10)
        if pool.operator is not None:
            pool.operator.close(grace=0)
        store.close()
        if emulator is not None:
            emulator.stop(grace=0.5)
