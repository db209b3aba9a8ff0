"""Standalone emulator: ``python -m tests.support.esdb_emulator --host 127.0.0.1 --port 2113``.

The first line on stdout is the URI to connect with (flushed at once, so a parent process
can read it); the server then runs until SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from types import FrameType

from .server import EsdbEmulator


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.support.esdb_emulator",
        description="EventStoreDB gRPC wire emulator (insecure, in-memory).",
    )
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=2113, help="port; 0 picks a free one")
    args = parser.parse_args(argv)

    stopped = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stopped.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    emulator = EsdbEmulator().start(args.host, args.port)
    print(emulator.uri, flush=True)
    print(f"cluster: {emulator.cluster_uri}", flush=True)
    try:
        while not stopped.wait(0.5):
            pass
    finally:
        emulator.stop(grace=0.5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
