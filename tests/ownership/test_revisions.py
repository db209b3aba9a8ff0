"""R32 with real processes: a session's turns run under the revision of its agent definition
that the process running them defines, and the log says which. A release of another revision
records the change when it takes the session (``agent/revised``) — a deploy (newer), a rollback
(older), and an open turn handed over mid-way by a rolling deploy (``in_turn``). ``terret
serve`` workers, an embedded runtime and the CLI, on SQLite and the EventStoreDB emulator."""

from __future__ import annotations

import json
import signal
from typing import Any

import pytest

from terret import (
    Actor,
    AgentDefinition,
    Reply,
    Runtime,
    RuntimeConfig,
    ScriptedProvider,
    StaticResolver,
)
from tests.ownership.conftest import Pool
from tests.ownership.test_in_doubt import _cli

OPERATOR = Actor(actor="operator", id="revision-tests")
FAST = {"OWNERSHIP_TOOL_SECONDS": "0"}


def _revised(pool: Pool, sid: Any) -> list[dict[str, Any]]:
    return [d for n, d in pool.log(sid) if n == "agent/revised"]


def _stop(worker: Any) -> None:
    worker.signal(signal.SIGTERM)  # a graceful stop: the session is let go
    assert worker.wait(30) == 0


def _shown_revision(pool: Pool, sid: Any) -> int:
    shown = _cli(pool, "--json", "sessions", "show", str(sid))
    assert shown.returncode == 0, shown.stderr
    revision = json.loads(shown.stdout)["agent_revision"]
    text = _cli(pool, "sessions", "show", str(sid)).stdout
    assert f"agent     default (revision {revision})" in text.splitlines(), text
    return int(revision)


@pytest.mark.timeout(240)
def test_each_change_of_revision_is_recorded_before_the_release_runs_anything(
        pool: Pool) -> None:
    a = pool.serve("a", **FAST)
    sid = pool.new_session()
    pool.runtime().inject(sid, "first", wake=True)
    pool.wait_for(sid, "turn/end")
    _stop(a)
    assert _revised(pool, sid) == [] and _shown_revision(pool, sid) == 1  # nothing changed

    b = pool.serve("b", OWNERSHIP_REVISION="2", **FAST)  # a deploy
    pool.runtime().inject(sid, "second", wake=True)
    names = [n for n, _ in pool.wait_for(sid, "turn/end", 2)]
    assert _revised(pool, sid) == [{"previous": 1, "revision": 2, "turn": 1, "in_turn": False}]
    moved = names.index("agent/revised")  # with b's attach, before b's turn
    assert names[moved - 1] == "agent/attached" and names[moved + 1] == "turn/start"
    assert _shown_revision(pool, sid) == 2
    _stop(b)

    c = pool.serve("c", **FAST)  # a rollback: the old release again
    pool.runtime().inject(sid, "third", wake=True)
    pool.wait_for(sid, "turn/end", 3)
    assert _revised(pool, sid)[1:] == [{"previous": 2, "revision": 1, "turn": 2,
                                        "in_turn": False}]
    assert _shown_revision(pool, sid) == 1
    _stop(c)

    # An application process of its own (no serve), at revision 5, runs the next turn itself;
    # one at the same revision after it records nothing more.
    def embedded(revision: int) -> Runtime:
        provider = ScriptedProvider(name="scripted", default=Reply(text="embedded"))
        return Runtime(pool.store, resolver=StaticResolver({"scripted": provider}),
                       agents=[AgentDefinition(revision=revision)],
                       config=RuntimeConfig(roles={"main": "scripted:default"}))

    for _ in range(2):
        rt = embedded(5)
        assert rt.run_turn(sid, "fourth").status == "completed"
        rt.close()
    assert _revised(pool, sid)[2:] == [{"previous": 1, "revision": 5, "turn": 3,
                                        "in_turn": False}]
    assert _shown_revision(pool, sid) == 5


@pytest.mark.timeout(240)
def test_a_turn_handed_over_mid_way_by_a_rolling_deploy_says_so(pool: Pool) -> None:
    """Revision 1 parks the turn on an approval and stops; revision 2 runs the rest of the
    turn after the verdict, and the log says the turn changed revision in the middle."""
    a = pool.serve("a", **FAST)
    sid = pool.new_session()
    pool.runtime().inject(sid, "gated please", wake=True)
    pool.wait_for(sid, "approval/requested")
    _stop(a)
    pool.serve("b", OWNERSHIP_REVISION="2", **FAST)
    pool.runtime().approve(sid, "c-1", by=OPERATOR)
    log = pool.wait_for(sid, "turn/end")
    names = [n for n, _ in log]
    assert _revised(pool, sid) == [{"previous": 1, "revision": 2, "turn": 1, "in_turn": True}]
    assert names.index("approval/requested") < names.index("agent/revised") \
        < names.index("tool/result")
    assert [d["status"] for n, d in log if n == "turn/end"] == ["completed"]
    assert _shown_revision(pool, sid) == 2
