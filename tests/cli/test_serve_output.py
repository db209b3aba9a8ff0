"""``terret serve`` prints ``serving <store>; resumed N open turn(s); pid P`` when ready, then
one log line per lifecycle transition (docs/cli.md, ``terret serve``): with open turns to
resume at start, their ``turn 1 resumed`` lines come after the serving line, every time — at a
first start and at a restart after a SIGKILL (the parked calls decided meanwhile). On SQLite
and on the EventStoreDB emulator.
"""

from __future__ import annotations

from uuid import UUID

from tests.cli.conftest import Target, is_type
from tests.cli.docs_app import AppServer, new_session, run, serving, write_app

OPEN_TURNS = 3


def _check_order(server: AppServer, sessions: list[UUID], pooled_resumed: int,
                 until: str = "parked on an approval") -> None:
    """``pooled_resumed``: what a pool member (EventStoreDB) counts — the open turns of
    crashed workers it took at start; turns nobody owned come from the group after the line.
    ``until``: what each resumed turn says last."""
    server.wait_for(f"every open turn to resume and say {until!r}",
                    lambda text: all(f"session {sid} {until}" in text for sid in sessions))
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
    sessions = [new_session(target, "--agent", "ops") for _ in range(OPEN_TURNS)]
    writer = target.writer()
    for sid in sessions:  # open turns nobody owns (a turn parked on a call needs no worker)
        writer.execute(sid, lambda s: s.start_turn(trigger="user", text="deploy checkout v2"))
    first = AppServer(target, "first").start()
    try:
        _check_order(first, sessions, pooled_resumed=0)  # never owned: from the group
    finally:
        first.kill()  # the turns stay open, parked, owned by a dead worker
    for sid in sessions:  # decided meanwhile: each needs a worker again
        assert run(target, "approve", str(sid), "call-deploy").returncode == 0
    second = AppServer(target, "second").start()
    try:
        _check_order(second, sessions, pooled_resumed=OPEN_TURNS,  # the first's beat
                     until="turn 1 ended completed")
    finally:
        code = second.stop()
    assert code == 0, second.text()
    assert "Traceback" not in second.text(), second.text()


def test_a_woken_turn_that_fails_is_one_line_and_the_session_stays_served(
        target: Target) -> None:
    """serve logs one line per record: a woken turn whose model raises (an error of the app's,
    or a provider's) is one ``the woken turn failed`` line, not a traceback nor "not serving"
    — serve keeps the session, and the next ``inject --wake`` from another shell runs a turn."""
    sid = new_session(target, "--agent", "demo")
    with serving(target, app="tests.cli.chat_app:app") as server:
        for turn, (text, said) in enumerate(
                [("explode now", "RuntimeError: the model blew up while answering"),
                 ("unavailable again", "ProviderError: demo: 503 service unavailable")], 1):
            done = run(target, "inject", str(sid), text, "--wake")
            assert done.returncode == 0, done.stderr
            server.wait_for(f"turn {turn}'s failure",
                            lambda log, said=said: f"the woken turn failed: {said}" in log)
            target.wait_for(sid, is_type("turn/end", turn=turn, status="failed"),
                            f"turn {turn} ended failed")
        done = run(target, "inject", str(sid), "hello", "--wake")
        assert done.returncode == 0, done.stderr
        target.wait_for(sid, is_type("turn/end", turn=3, status="completed"),
                        "turn 3 completed by the same server")
        # A tool's SystemExit stops its turn, not the server: said in one line too.
        done = run(target, "inject", str(sid), "give up", "--wake")
        assert done.returncode == 0, done.stderr
        target.wait_for(sid, is_type("turn/end", turn=4, status="failed"), "turn 4 failed")
        server.wait_for("turn 4's failure", lambda log: "SystemExit: the tool" in log)
        failed = [line for line in server.lines() if "turn failed" in line]
        assert [line.split("failed: ", 1)[1] for line in failed] == [
            "RuntimeError: the model blew up while answering",
            "ProviderError: demo: 503 service unavailable",
            "SystemExit: the tool gave up",
        ], server.text()
        assert "Traceback" not in server.text(), server.text()
        assert "not serving" not in server.text(), server.text()
        assert all(line[:4].isdigit() for line in server.lines()[1:]), server.text()
