"""Fixtures for driving the ``terret`` CLI as a user would.

* ``target`` — one backend per test (SQLite file, and the shared EventStoreDB emulator), with
  helpers: ``invoke`` runs a command in-process through ``click.testing.CliRunner``;
  ``run`` runs it as a real subprocess (``python -m terret``); ``snapshot`` reads every event
  of the store (to prove a refused command changed nothing); ``parked``/``finished`` build
  sessions in known states directly through the aggregate (fast and deterministic).
* Subprocesses get ``--store`` and ``--views`` explicitly and run in the test's tmp dir, so
  nothing leaks into the working tree.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from click.testing import CliRunner, Result

from terret.adapters.stores.uri import open_store
from terret.cli import cli
from terret.domain.codec import RecordedEvent, decode
from terret.domain.events import Actor, ToolCallData, UsageData
from terret.domain.repository import SessionRepository
from terret.domain.session import Session
from terret.domain.store import EventStore, session_stream
from terret.runtime.writer import SessionWriter
from tests.support.esdb_emulator import EsdbEmulator
from tests.support.esdb_fixtures import real_server_uri

ROOT = Path(__file__).resolve().parents[2]
DEMO_APP = "terret.cli.demo_app:demo_app"
DEPLOY_ARGS = {"service": "checkout", "version": "v2"}
MISSING = "00000000-0000-4000-8000-000000000000"
"""A well-formed session id that no test ever creates."""

EventKey = tuple[str, int, str, str]


def subprocess_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("TERRET_STORE", None)
    env.pop("TERRET_VIEWS", None)
    env.pop("TERRET_APP", None)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    return env


@dataclass
class Target:
    """A store the CLI is pointed at: ``kind`` is ``sqlite`` or ``esdb``."""

    kind: str
    uri: str
    views: str
    cwd: Path
    since: int = 0
    """Snapshots read the events after this position (the shared emulator holds other
    tests' events; anything a command appends or deletes in this test comes later)."""
    _store: EventStore | None = None
    _closers: list[Callable[[], None]] = field(default_factory=list)

    # --- running the CLI -------------------------------------------------------------------

    def args(self, *args: str) -> list[str]:
        return ["--store", self.uri, "--views", self.views, *args]

    def invoke(self, *args: str, input: str | None = None) -> Result:
        """Run ``terret --store … --views … ARGS`` in this process."""
        return invoke_cli(*self.args(*args), input=input)

    def json(self, *args: str) -> Any:
        result = self.invoke("--json", *args)
        assert result.exit_code == 0, result.stderr
        return json.loads(result.stdout)

    def run(self, *args: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        """Run ``python -m terret --store … --views … ARGS`` as a real subprocess."""
        return subprocess.run([sys.executable, "-m", "terret", *self.args(*args)],
                              capture_output=True, text=True, timeout=timeout, cwd=self.cwd,
                              env=subprocess_env())

    # --- reading the store -----------------------------------------------------------------

    def store(self) -> EventStore:
        if self._store is None:
            self._store = open_store(self.uri)
            self._closers.append(self._store.close)
        return self._store

    def snapshot(self) -> list[EventKey]:
        """Every event of the store, in global order (stream, seq, id, type)."""
        if self.kind == "sqlite" and not Path(self.uri).exists():
            return []
        store = self.store()
        out: list[EventKey] = []
        after = self.since
        while True:
            page = store.read_all(after=after, limit=1000)
            out.extend((r.stream, r.seq, str(r.event_id), r.wire_name) for r in page)
            if len(page) < 1000:
                return out
            after = page[-1].position

    def events(self, sid: UUID) -> list[RecordedEvent]:
        return [decode(r) for r in self.store().read_stream(session_stream(sid))]

    def types(self, sid: UUID) -> list[str]:
        return [r.wire_name for r in self.store().read_stream(session_stream(sid))]

    def wait_for(self, sid: UUID, test: Callable[[RecordedEvent], bool], what: str,
                 timeout: float = 20.0) -> RecordedEvent:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for event in self.events(sid):
                if test(event):
                    return event
            time.sleep(0.02)
        raise AssertionError(f"timed out waiting for {what}; log: {self.types(sid)}")

    # --- sessions in known states ----------------------------------------------------------

    def writer(self) -> SessionWriter:
        return SessionWriter(SessionRepository(self.store()))

    def new_session(self, agent: str = "demo") -> UUID:
        session = Session.start(agent=agent, roles={"main": "demo:ops-model-1"})
        self.writer().create(session)
        return session.id

    def parked(self, sid: UUID | None = None) -> UUID:
        """A session whose open turn (1, unless ``sid`` already had turns) is parked on
        approval ``call-deploy`` (no process serves it)."""
        writer = self.writer()
        sid = sid or self.new_session()
        writer.execute(sid, lambda s: s.start_turn(trigger="user", text="deploy v2"))
        writer.execute(sid, lambda s: s.start_step("demo:ops-model-1"))
        writer.execute(sid, lambda s: s.record_assistant(
            "", [ToolCallData(id="call-deploy", name="deploy", args=DEPLOY_ARGS)]))
        writer.execute(sid, lambda s: s.request_approval("call-deploy", "deploy", DEPLOY_ARGS))
        return sid

    def finished(self, *, title: str | None = "Release checkout v2") -> UUID:
        """A session with one completed turn: a tool call, two steps with usage, a title."""
        writer = self.writer()
        sid = self.new_session()
        writer.execute(sid, lambda s: s.start_turn(trigger="user", text="status please"))
        writer.execute(sid, lambda s: s.start_step("demo:ops-model-1"))
        writer.execute(sid, lambda s: s.record_assistant(
            "Checking.", [ToolCallData(id="c1", name="service_status",
                                       args={"service": "checkout"})]))
        writer.execute(sid, lambda s: s.record_tool_result("c1", "service_status", "ok"))
        writer.execute(sid, lambda s: s.end_step(
            UsageData(prompt_tokens=100, completion_tokens=10, cost=0.5)))
        writer.execute(sid, lambda s: s.start_step("demo:ops-model-2"))
        writer.execute(sid, lambda s: s.record_assistant("All green."))
        writer.execute(sid, lambda s: s.end_step(
            UsageData(prompt_tokens=200, completion_tokens=20, cost=0.25)))
        writer.execute(sid, lambda s: s.end_turn("completed"))
        if title is not None:
            writer.execute(sid, lambda s: s.title(title, automatic=True))
        return sid

    def closed(self) -> UUID:
        sid = self.new_session()
        self.writer().execute(sid, lambda s: s.close(by=Actor(actor="operator"), reason="done"))
        return sid

    def close(self) -> None:
        for close in reversed(self._closers):
            close()
        self._closers.clear()


RUNNER = CliRunner()


def invoke_cli(*args: str, input: str | None = None) -> Result:
    return RUNNER.invoke(cli, list(args), input=input, catch_exceptions=True)


def one_line_error(stderr: str) -> str:
    """The single ``Error:`` line of a failed command (click may add a usage hint above it for
    usage errors); no traceback."""
    assert "Traceback" not in stderr, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, stderr
    others = [line for line in stderr.splitlines()
              if line and not line.startswith(("Error:", "Usage:", "Try "))]
    assert not others, stderr
    return errors[0]


def is_type(wire_name: str, **fields: object) -> Callable[[RecordedEvent], bool]:
    def test(event: RecordedEvent) -> bool:
        if event.wire_name != wire_name:
            return False
        return all(getattr(event.payload, k, None) == v for k, v in fields.items())

    return test


@pytest.fixture
def own_esdb_uri(request: pytest.FixtureRequest) -> str:
    """The real server when ``TERRET_ESDB_URI`` is set, else an emulator of the test's own: no
    other suite's events (or damaged records) in the log the CLI's views replay."""
    if real_server_uri() is not None:
        return str(request.getfixturevalue("esdb_uri"))
    emulator = EsdbEmulator().start(host="127.0.0.1", port=0)
    request.addfinalizer(emulator.stop)
    return emulator.uri


@pytest.fixture(params=["sqlite", "esdb"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Target]:
    if request.param == "sqlite":
        uri = str(tmp_path / "terret.db")
        t = Target("sqlite", uri, str(tmp_path / "views.db"), tmp_path)
        t.store()  # the file exists: commands other than `sessions new`/`serve` need it
    else:
        uri = request.getfixturevalue("own_esdb_uri")
        t = Target("esdb", uri, str(tmp_path / "views.db"), tmp_path)
        t.since = t.store().head_position()
    yield t
    t.close()


@pytest.fixture
def sqlite_target(tmp_path: Path) -> Iterator[Target]:
    t = Target("sqlite", str(tmp_path / "terret.db"), str(tmp_path / "views.db"), tmp_path)
    t.store()
    yield t
    t.close()


def badfloor_app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """An app (``badfloor_app:app``, importable from ``tmp_path``, the working directory) whose
    agent ``ops`` has a malformed allow-list floor: refused when the app is loaded (its
    ``AgentDefinition`` raises ``ConfigurationError`` naming ``allow``)."""
    (tmp_path / "badfloor_app.py").write_text(
        "from terret.cli import App\n"
        "from terret.cli.demo_app import demo_app\n"
        "from terret.runtime.definition import AgentDefinition\n"
        "def app() -> App:\n"
        "    base = demo_app()\n"
        "    base.agents = [AgentDefinition(name='ops', allow=['deploy!'])]\n"
        "    return base\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "badfloor_app:app"


@pytest.fixture
def chat_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a `terret chat` on a pty: its own history file, a terminal type."""
    env = subprocess_env()
    env["TERRET_CHAT_HISTORY"] = str(tmp_path / "history")
    env["TERM"] = "xterm"
    env.pop("NO_COLOR", None)
    return env
