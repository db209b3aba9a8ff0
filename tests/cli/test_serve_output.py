"""``terret serve`` prints ``serving <store>; resumed N open turn(s); pid P`` when ready, then
one log line per lifecycle transition (docs/cli.md, ``terret serve``): with open turns to
resume at start, their ``turn 1 resumed`` lines come after the serving line, every time — at a
first start and at a restart after a SIGKILL. On SQLite and on the EventStoreDB emulator.
"""

from __future__ import annotations

from uuid import UUID

from tests.cli.conftest import Target
from tests.cli.docs_app import AppServer, new_session, write_app

OPEN_TURNS = 3


def _check_order(server: AppServer, sessions: list[UUID], pooled_resumed: int) -> None:
    """``pooled_resumed``: what a pool member (EventStoreDB) counts — the open turns of
    crashed workers it took at start; turns nobody owned come from the group after the line."""
    server.wait_for("every open turn to resume and park again",
                    lambda text: all(f"session {sid} parked on an approval" in text
                                     for sid in sessions))
    lines = server.lines()
    assert lines[0].startswith("serving "), lines
    if server.target.kind == "sqlite":
        assert f"; resumed {OPEN_TURNS} open turn(s); pid {server.pid}" in lines[0], lines
    else:
        assert (f"; resumed {pooled_resumed} open turn(s); pid {server.pid}; pool terret-serve"
                in lines[0]), lines
    for sid in sessions:
        resumed = [i for i, line in enumerate(lines) if f"session {sid} turn 1 resumed" in line]
        assert len(resumed) == 1 and resumed[0] > 0, lines


def test_the_serving_line_comes_before_the_resumed_turns(target: Target) -> None:
    write_app(target)
    sessions = [target.parked(new_session(target, "--agent", "ops")) for _ in range(OPEN_TURNS)]
    first = AppServer(target, "first").start()
    try:
        _check_order(first, sessions, pooled_resumed=0)  # never owned: from the group
    finally:
        first.kill()  # the turns stay open, owned by a dead worker
    second = AppServer(target, "second").start()
    try:
        _check_order(second, sessions, pooled_resumed=OPEN_TURNS)  # the first's beat
    finally:
        code = second.stop()
    assert code == 0, second.text()
    assert "Traceback" not in second.text(), second.text()
