"""A session another process releases idle (``agent/detached`` with no open turn and nothing
waking) needs no worker: a running ``terret serve`` leaves it alone — it does not claim it (a
session of its app) and does not warn "not serving session …" (one of another app's agents),
as docs/cli.md's *The app* says it serves only sessions with work for a worker. The sessions
here are released by ``terret chat`` processes leaving. On SQLite and on the EventStoreDB
emulator.
"""

from __future__ import annotations

import subprocess
import sys
import time

from tests.cli.conftest import DEMO_APP, Target, is_type
from tests.cli.docs_app import APP, app_env, new_session, serving, write_app


def _chat_and_leave(target: Target, app: str, agent: str) -> str:
    done = subprocess.run([sys.executable, "-m", "terret",
                           *target.args("chat", "--app", app, "--agent", agent)],
                          input="/quit\n", capture_output=True, text=True, timeout=60,
                          cwd=target.cwd, env=app_env())
    assert done.returncode == 0, done.stderr
    sid = done.stdout.rsplit("terret chat ", 1)[1].split()[0]
    assert target.types(sid)[-1] == "agent/detached", target.types(sid)
    return sid


def test_serve_leaves_sessions_released_idle_alone(target: Target) -> None:
    write_app(target)
    with serving(target) as server:
        others = _chat_and_leave(target, DEMO_APP, "demo")  # an agent myapp does not define
        ours = _chat_and_leave(target, APP, "ops")
        # A later session's wake, served: the server has read past both releases.
        later = new_session(target, "--agent", "ops")
        assert target.invoke("inject", str(later), "deploy checkout v2", "--wake").exit_code == 0
        server.wait_for("the later session's turn to park",
                        lambda text: f"session {later} parked on an approval" in text)
        time.sleep(1.0)  # a claim, had one been made, lands within this
        assert f"not serving session {others}" not in server.text(), server.text()
        assert f"session {ours}" not in server.text(), server.text()
        for sid in (others, ours):
            types = target.types(sid)
            assert types[-1] == "agent/detached" and types.count("agent/attached") == 1, types
        assert target.wait_for(later, is_type("approval/requested"), "the later park")
