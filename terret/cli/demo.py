"""``terret demo``: the lifecycle, live, on the embedded store — including a SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from uuid import UUID

import click

from terret.adapters.stores.sqlite import SQLiteStore, refuse_foreign_file
from terret.cli._context import default_views_path
from terret.cli._params import SECONDS
from terret.domain.errors import TerretError, shown
from terret.domain.store import StoredRecord, session_stream
from terret.projections.base import refuse_foreign_views


class DemoFailed(TerretError):
    """A step of the demo did not do what the demo shows (a command failed, or timed out)."""

APP = "terret.cli.demo_app:demo_app"


class Demo:
    """The narration is in order every time: a command's output is printed as soon as it
    returns, and the serving process's log lines are held and printed after it, under the
    heading of the stage that caused them (``flush`` waits for the line that says the stage's
    effect happened, then for the log to go quiet)."""

    QUIET = 0.2

    def __init__(self, path: Path, timeout: float) -> None:
        self.path = path
        self.timeout = timeout
        self.store = SQLiteStore(path)
        self.serve: subprocess.Popen[str] | None = None
        self._lines: list[str] = []
        self._seen: list[str] = []  # every line of the current serving process
        self._arrived = threading.Condition()
        self._last_line = 0.0

    def say(self, text: str) -> None:
        self.flush()
        click.secho(f"\n▶ {text}", bold=True)

    def tell(self, text: str, *, expect: str | None = None) -> None:
        """A line of narration, after what the serving process said up to now."""
        self.flush(*([expect] if expect else []))
        click.echo(f"  {text}")

    def flush(self, *expect: str) -> None:
        """Print the serving process's lines so far: once it said each of ``expect`` (if
        given), and its log has been quiet for a moment."""
        deadline = time.monotonic() + self.timeout
        with self._arrived:
            while not all(any(e in line for line in self._seen) for e in expect):
                if not self._arrived.wait(max(0.0, deadline - time.monotonic())):
                    break
            while time.monotonic() - self._last_line < self.QUIET:
                self._arrived.wait(self.QUIET)
            lines, self._lines = self._lines, []
        for line in lines:
            click.secho(line, dim=True)

    def terret(self, *args: str) -> str:
        argv = ["terret", "--store", str(self.path), *args]
        click.secho("  $ " + " ".join(a if " " not in a else repr(a) for a in argv), fg="cyan")
        done = subprocess.run([sys.executable, "-m", "terret", "--store", str(self.path), *args],
                              capture_output=True, text=True, timeout=self.timeout)
        for line in (done.stdout + done.stderr).rstrip().splitlines():
            click.echo(f"    {line}")
        if done.returncode != 0:
            raise DemoFailed(f"`terret {args[0]}` failed ({done.returncode})")
        return done.stdout

    def start_server(self, *expect: str) -> None:
        cmd = [sys.executable, "-m", "terret", "--store", str(self.path), "serve", "--app", APP]
        click.secho("  $ terret --store " + str(self.path) + f" serve --app {APP} &", fg="cyan")
        self.serve = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                      text=True)
        proc = self.serve

        def pump() -> None:
            assert proc.stderr is not None
            for line in proc.stderr:
                message = line.rstrip().split(" INFO ", 1)[-1]
                with self._arrived:
                    self._lines.append(f"    [serve {proc.pid}] {message}")
                    self._seen.append(message)
                    self._last_line = time.monotonic()
                    self._arrived.notify_all()

        with self._arrived:
            self._seen = []
        threading.Thread(target=pump, daemon=True).start()
        self.flush("serving ", *expect)

    def wait_for(self, sid: UUID, what: str, test: Callable[[StoredRecord], bool]) -> StoredRecord:
        deadline = time.monotonic() + self.timeout
        seen = 0
        while time.monotonic() < deadline:
            for record in self.store.read_stream(session_stream(sid), from_seq=seen + 1):
                seen = record.seq
                if test(record):
                    return record
            time.sleep(0.05)
        raise DemoFailed(f"timed out waiting for {what}")

    def close(self) -> None:
        if self.serve is not None and self.serve.poll() is None:
            self.serve.terminate()
            self.serve.wait(self.timeout)
        self.store.close()


def _is(wire_name: str, **fields: object) -> Callable[[StoredRecord], bool]:
    from terret.domain.codec import decode

    def test(record: StoredRecord) -> bool:
        if record.wire_name != wire_name:
            return False
        payload = decode(record).payload
        return all(getattr(payload, k, None) == v for k, v in fields.items())

    return test


@click.command("demo")
@click.option("--path", type=click.Path(dir_okay=False, path_type=Path),
              default=Path("terret-demo.db"), show_default=True,
              callback=lambda ctx, param, value: _demo_path(value),
              help="Store file to create (replaced if it exists and is a Terret store).")
@click.option("--timeout", type=SECONDS, default=30.0, show_default=True,
              help="Seconds to wait for each stage.")
def demo(path: Path, timeout: float) -> None:
    """Walk through a session's lifecycle on the embedded store: a tool call, an approval
    that survives a SIGKILL of the serving process, resume, compaction, title, usage, log."""
    started = time.monotonic()
    _remove_store_files(path)
    run = Demo(path, timeout)
    try:
        sid = _start(run, path)
        call_id = _park_on_approval(run, sid)
        _kill_and_resume(run, sid)
        _approve(run, sid, call_id)
        _compact(run, sid)
        _show_views(run, sid)
        _stop(run)
    finally:
        run.close()
    click.secho(f"\nDone in {time.monotonic() - started:.1f}s. Explore the store:", bold=True)
    for example in (f"terret --store {path} sessions list",
                    f"terret --store {path} sessions show {sid}",
                    f"terret --store {path} log {sid} --type approval/resolved",
                    f"terret --store {path} projections verify"):
        click.echo(f"  {example}")


# The stages of the demo, in the order it runs them: each says what it shows, does it, and
# waits until the log (and the serving process's output) shows it happened.


def _demo_path(path: Path) -> Path:
    if not path.name or path.name in (".", ".."):
        raise click.BadParameter(f"{shown(str(path))} is not a file name",
                                 param_hint="'--path'")
    return path


def _remove_store_files(path: Path) -> None:
    """Only a Terret store (and its views) is replaced: another application's database, or a
    file that is not SQLite, is refused and left untouched, as ``--store`` refuses it."""
    refuse_foreign_file(str(path.resolve()))
    refuse_foreign_views(str(Path(default_views_path(str(path))).resolve()))
    for suffix in ("", "-wal", "-shm"):
        for file in (str(path) + suffix, default_views_path(str(path)) + suffix):
            if os.path.exists(file):
                os.remove(file)


def _start(run: Demo, path: Path) -> UUID:
    run.say(f"A session starts in {path} (SQLite, WAL, synchronous=FULL)")
    sid = UUID(run.terret("sessions", "new", "--agent", "demo", "--model",
                          "demo:ops-model-1").strip())

    run.say("A serving process starts (it runs the session's agent)")
    run.start_server()
    return sid


def _park_on_approval(run: Demo, sid: UUID) -> str:
    """A turn calls a tool, then parks on an approval; the id of the call it waits for."""
    from terret.domain import events as ev
    from terret.domain.codec import decode

    run.say("An operator asks for a deploy; the serving process wakes on the inbox")
    run.terret("inject", str(sid), "Check the checkout service and deploy v2", "--wake")
    run.wait_for(sid, "the status tool's result",
                 _is(ev.ToolResult.wire_name, name="service_status"))
    run.tell("the agent called service_status (no approval needed)", expect=" turn 1 started")
    record = run.wait_for(sid, "the approval request", _is(ev.ApprovalRequested.wire_name))
    requested = decode(record).payload
    assert isinstance(requested, ev.ApprovalRequested)
    call_id = requested.call_id
    run.tell(f"deploy is mutating: it parked on approval {call_id}, durably in the log",
             expect=" parked on an approval")
    run.terret("approvals", "list", str(sid))
    return call_id


def _kill_and_resume(run: Demo, sid: UUID) -> None:
    run.say("The serving process is killed with SIGKILL (no cleanup runs)")
    assert run.serve is not None
    os.kill(run.serve.pid, signal.SIGKILL)
    run.serve.wait(run.timeout)
    run.tell(f"process {run.serve.pid} is gone; the parked approval is still in the log:")
    run.terret("sessions", "show", str(sid))

    run.say("A new serving process starts; the parked turn needs no worker until its verdict")
    run.start_server()
    run.tell("the turn stays open in the log; its verdict, from any process, gets it a worker")


def _approve(run: Demo, sid: UUID, call_id: str) -> None:
    from terret.domain import events as ev

    run.say("The approval is given from the CLI, another process again")
    run.terret("approve", str(sid), call_id, "--reason", "change window open")
    run.wait_for(sid, "the end of turn 1", _is(ev.TurnEnded.wire_name, turn=1))
    run.tell("the serving process took the turn without asking again: the parked call ran, "
             "the turn resumed and completed", expect=" turn 1 ended")


def _compact(run: Demo, sid: UUID) -> None:
    from terret.cli.demo_app import COMPACTION_BUDGET
    from terret.domain import events as ev

    run.say(f"A second turn passes the compaction budget ({COMPACTION_BUDGET} prompt tokens)")
    run.terret("inject", str(sid), "Write the release notes", "--wake")
    run.wait_for(sid, "the end of turn 2", _is(ev.TurnEnded.wire_name, turn=2))
    run.wait_for(sid, "the compaction", _is(ev.SessionCompacted.wire_name))
    run.tell("compacted: the model's next request starts from the summary",
             expect=" compacted up to")


def _show_views(run: Demo, sid: UUID) -> None:
    from terret.domain import events as ev

    run.say("Title and usage (projections of the log)")
    run.wait_for(sid, "the title", _is(ev.SessionTitled.wire_name))
    run.terret("title", str(sid))
    run.terret("usage", str(sid), "--by", "model")

    run.say("The log: every state recorded")
    run.terret("log", str(sid))


def _stop(run: Demo) -> None:
    run.say("The serving process stops gracefully (SIGTERM)")
    assert run.serve is not None
    run.serve.terminate()
    run.serve.wait(run.timeout)
    run.flush("stopped")


def register(cli: click.Group) -> None:
    cli.add_command(demo)
