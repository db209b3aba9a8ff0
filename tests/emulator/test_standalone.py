"""`python -m tests.support.esdb_emulator` as a separate process."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from pathlib import Path

from esdbclient import EventStoreDBClient, StreamState

from .helpers import new_event

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def _first_line(process: subprocess.Popen[str], timeout: float) -> str:
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], timeout)
    assert ready, "the emulator printed nothing"
    return process.stdout.readline().strip()


def test_standalone_server_prints_its_uri_and_serves() -> None:
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
    command = [sys.executable, "-m", "tests.support.esdb_emulator", "--host", "127.0.0.1"]
    with subprocess.Popen(
        [*command, "--port", "0"], cwd=PROJECT_ROOT, env=env, stdout=subprocess.PIPE, text=True
    ) as process:
        try:
            uri = _first_line(process, timeout=20)
            assert uri.startswith("esdb://127.0.0.1:") and uri.endswith("?Tls=false")
            client = EventStoreDBClient(uri)
            try:
                event = new_event()
                position = client.append_to_stream(
                    "standalone", current_version=StreamState.NO_STREAM, events=event
                )
                (recorded,) = client.get_stream("standalone")
                assert (recorded.id, recorded.commit_position) == (event.id, position)
            finally:
                client.close()
        finally:
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=10) == 0
