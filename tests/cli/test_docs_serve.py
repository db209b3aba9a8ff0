"""docs/cli.md, *The app*: the ``myapp.py`` block is written to a directory of its own and
served as the page says (``terret serve --app myapp:app``, by the installed entry point, from
that directory), and the shell session shown after it runs line by line against it, on SQLite
and on EventStoreDB. Sessions of an agent the app does not define are left alone, with a
warning line naming the session and the reason, never a traceback."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from uuid import UUID

from tests.cli.conftest import ROOT, Target, is_type, subprocess_env

DOC = ROOT / "docs" / "cli.md"
EXAMPLE = re.compile(r"<!-- example: myapp\.py -->\s*```python\n(.*?)```\n(.*?)```sh\n(.*?)```",
                     re.S)


def documented() -> tuple[str, list[list[str]]]:
    """The app's source and the shell lines shown after it (``terret …`` split, comments
    dropped)."""
    found = EXAMPLE.search(DOC.read_text())
    assert found, "docs/cli.md has no `<!-- example: myapp.py -->` block followed by a sh block"
    source, _, shell = found.groups()
    lines = [shlex.split(line, comments=True) for line in shell.splitlines()]
    return source, [line for line in lines if line]


def terret() -> list[str]:
    """The installed entry point (its sys.path[0] is its bin directory, not the working
    directory: the case `--app` must handle), else ``python -m terret``."""
    script = Path(sys.executable).with_name("terret")
    return [str(script)] if script.exists() else [sys.executable, "-m", "terret"]


def env() -> dict[str, str]:
    out = subprocess_env()
    out.pop("OPS_MODEL", None)  # the page's app then answers with its scripted model
    return out


def wait(what: str, test: Callable[[], object], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if test():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_the_documented_app_serves_the_documented_session(target: Target, tmp_path: Path
                                                          ) -> None:
    source, lines = documented()
    assert all(line[0] == "terret" for line in lines), lines
    assert lines[0][1:] == ["serve", "--app", "myapp:app"], lines[0]
    appdir = tmp_path / "app"
    appdir.mkdir()
    (appdir / "myapp.py").write_text(source)

    # Sessions of an agent this app does not define: one with an open turn, one woken, and
    # one parked on a call (it needs no worker before its verdict: not even a warning).
    other_open = target.new_session(agent="other")
    target.writer().execute(other_open, lambda s: s.start_turn(trigger="user", text="hello"))
    other_woken = target.new_session(agent="other")
    target.invoke("inject", str(other_woken), "wake up", "--wake")
    other_parked = target.parked(target.new_session(agent="other"))
    other_before = {sid: target.types(sid) for sid in (other_open, other_woken, other_parked)}

    def run(args: list[str]) -> subprocess.CompletedProcess[str]:
        """A documented line, with the store put in front of the command (global options go
        before it)."""
        done = subprocess.run([*terret(), *target.args(*args[1:])], cwd=appdir, env=env(),
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, (args, done.stderr)
        assert "Traceback" not in done.stderr, done.stderr
        return done

    stderr_path = tmp_path / "serve.err"
    with open(stderr_path, "w") as err:
        server = subprocess.Popen([*terret(), *target.args(*lines[0][1:])], cwd=appdir,
                                  env=env(), stdout=subprocess.DEVNULL, stderr=err)
    try:
        wait("serve to be ready", lambda: "serving " in stderr_path.read_text())
        session = UUID(run(lines[1]).stdout.strip())
        assert target.events(session)[0].payload.agent == "ops"  # type: ignore[union-attr]

        def line(args: list[str]) -> list[str]:
            return [str(session) if part == "SESSION_ID" else part for part in args]

        run(line(lines[2]))  # inject … --wake: the server starts a turn
        target.wait_for(session, is_type("approval/requested", call_id="call-deploy"),
                        "the deploy to park on an approval")
        listed = run(line(lines[3])).stdout
        assert str(session) in listed and "call-deploy" in listed and "deploy" in listed
        run(line(lines[4]))  # approve
        end = target.wait_for(session, is_type("turn/end"), "the turn to end")
        assert end.payload.status == "completed"  # type: ignore[union-attr]
        log = run(line(lines[5])).stdout
        assert "tool/result" in log and "deploy#call-deploy" in log
        assert "turn 1 completed" in log
        assert len(lines) == 6, lines

        # A waking inbox entry for another app's agent arrives while serving: it was said
        # already (once for the session, as cli.md says: another app's busy sessions would
        # fill the log with a line per wake), and nothing of it is taken.
        seen = stderr_path.read_text().count(f"session {other_woken}: ")
        assert seen == 1, stderr_path.read_text()
        before = len(target.events(other_woken))
        target.invoke("inject", str(other_woken), "again", "--wake")
        time.sleep(1.5)  # serve hears of the wake within a scan
        assert stderr_path.read_text().count(f"session {other_woken}: ") == 1
        assert len(target.events(other_woken)) == before + 1  # the entry, and nothing else
    finally:
        server.send_signal(signal.SIGTERM)
        code = server.wait(timeout=30)
    stderr = stderr_path.read_text()
    assert code == 0, stderr
    assert "Traceback" not in stderr, stderr
    mentions = [entry for entry in stderr.splitlines()
                if str(other_open) in entry or str(other_woken) in entry]
    assert any(str(other_open) in m for m in mentions), stderr
    for mention in mentions:  # one warning line each time, naming the session and the reason
        assert " WARNING " in mention, mention
        assert mention.endswith("no agent definition named 'other'"), mention
    # Left alone: nothing written to them but the second inbox entry.
    assert target.types(other_open) == other_before[other_open]
    assert target.types(other_parked) == other_before[other_parked]
    assert str(other_parked) not in stderr, stderr
    assert target.types(other_woken) == [*other_before[other_woken], "inbox/queued"]
    assert os.path.exists(appdir / "myapp.py")
