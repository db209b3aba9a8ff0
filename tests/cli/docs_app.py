"""docs/cli.md's example app (``myapp.py``, agent ``ops`` only) served by ``terret serve`` in a
second process, for the tests of what an operator sees around it.

``write_app(target)`` writes the page's ``myapp.py`` into the target's working directory, so
that ``target.run(..., "--app", "myapp:app")`` and :class:`AppServer` find it as a user's shell
would. :class:`AppServer` runs ``terret serve --app myapp:app`` with views of its own, its
stderr collected in a file (read with ``text()``, waited on with ``wait_for``).
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from uuid import UUID

from tests.cli.conftest import Target, subprocess_env
from tests.cli.test_docs_serve import documented, wait

APP = "myapp:app"


def app_env() -> dict[str, str]:
    env = subprocess_env()
    env.pop("OPS_MODEL", None)  # the page's app then answers with its scripted model
    return env


def write_app(target: Target) -> Path:
    source, _ = documented()
    path = target.cwd / "myapp.py"
    path.write_text(source)
    return path


def run(target: Target, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """``python -m terret --store … --views … ARGS`` in the app's directory (a process of its
    own: not the serving one)."""
    return subprocess.run([sys.executable, "-m", "terret", *target.args(*args)],
                          capture_output=True, text=True, timeout=timeout, cwd=target.cwd,
                          env=app_env())


class AppServer:
    """``terret serve --app myapp:app`` (or ``app``) on the target's store."""

    def __init__(self, target: Target, name: str = "serve", app: str = APP) -> None:
        self.target = target
        self.app = app
        self.err_path = target.cwd / f"{name}.err"
        self.views = str(target.cwd / f"{name}-views.db")
        self.popen: subprocess.Popen[bytes] | None = None

    def start(self, *, ready: bool = True) -> AppServer:
        argv = ["--store", self.target.uri, "--views", self.views, "serve", "--app", self.app,
                "--grace", "5"]
        with open(self.err_path, "w") as err:
            self.popen = subprocess.Popen([sys.executable, "-m", "terret", *argv],
                                          cwd=self.target.cwd, env=app_env(),
                                          stdout=subprocess.DEVNULL, stderr=err)
        if ready:
            self.wait_for("the serving line", lambda text: "serving " in text)
        return self

    def text(self) -> str:
        return self.err_path.read_text() if self.err_path.exists() else ""

    def lines(self) -> list[str]:
        return self.text().splitlines()

    def wait_for(self, what: str, test: Callable[[str], object],
                 timeout: float = 30.0) -> None:
        def ready() -> object:
            assert self.popen is not None
            if self.popen.poll() is not None:
                raise AssertionError(f"serve exited ({self.popen.returncode}) before {what}: "
                                     f"{self.text()}")
            return test(self.text())

        wait(f"{what}; serve said: {self.text()!r}", ready, timeout)

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def stop(self) -> int:
        """SIGTERM (a graceful stop); the exit code."""
        assert self.popen is not None
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
        try:
            return self.popen.wait(30)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(10)
            raise

    def kill(self) -> None:
        """SIGKILL: the open turns stay open, as after a crash."""
        assert self.popen is not None
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait(10)


@contextmanager
def serving(target: Target, name: str = "serve", app: str = APP) -> Iterator[AppServer]:
    """The app served for the block; stopped (SIGTERM, exit 0, no traceback) after it."""
    server = AppServer(target, name, app).start()
    try:
        yield server
    except BaseException:
        if server.popen is not None and server.popen.poll() is None:
            server.popen.kill()
            server.popen.wait(10)
        raise
    code = server.stop()
    assert code == 0, server.text()
    assert "Traceback" not in server.text(), server.text()


def new_session(target: Target, *args: str) -> UUID:
    """``terret sessions new ARGS`` (in this process: it needs no app)."""
    done = target.invoke("sessions", "new", *args)
    assert done.exit_code == 0, done.stderr
    return UUID(done.stdout.strip())
