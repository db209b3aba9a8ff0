"""An idle session moved to another process (``run_turn`` there: the caller chose it). The
worker that owned it before holds nothing any more: its agent is dropped, and while the new
owner runs a turn every call here is refused as for any other worker (docs/runtime.md, one
session, one executor) — ``SessionOwned``, never ``TurnOpenInLog``'s "resume it instead"."""

from __future__ import annotations

from pathlib import Path
from uuid import UUID

import pytest

from terret import Runtime
from terret.domain.errors import SessionOwned
from tests.runtime.conftest import MakeRuntime, OpenedStore
from tests.runtime.kit import (
    Background,
    final,
    only,
    other_process,
    read_log,
    wait_until,
)


def test_the_former_owner_of_a_moved_session_is_refused_as_any_worker(
        make_runtime: MakeRuntime, opened: OpenedStore, tmp_path: Path) -> None:
    former = make_runtime([final("one"), final("three")])
    sid = former.create_session()
    assert former.run_turn(sid, "one").status == "completed"
    assert former.agent_for_session(sid) is not None  # idle, and owning the session

    release = tmp_path / "release"
    moved = Background(lambda: other_process(opened.uri, "hold", str(sid), str(release)))
    try:
        _the_former_owner_is_refused(former, sid, opened, tmp_path)
    finally:
        release.touch()  # the other process ends whatever happened here
    assert moved.join()["status"] == "completed"
    # Idle again: the caller chose this process, so the session moves back.
    assert former.run_turn(sid, "three").status == "completed"
    agent = former.agent_for_session(sid)
    assert agent is not None and agent.status == "idle"


def _the_former_owner_is_refused(former: Runtime, sid: UUID, opened: OpenedStore,
                                 tmp_path: Path) -> None:
    store = opened.store
    wait_until((tmp_path / "release.started").exists, what="the held tool")
    owner = former.writer.load(sid).state.owner
    assert owner is not None and owner.worker != former.lease.worker

    before = read_log(store, sid)
    with pytest.raises(SessionOwned, match="whose lease is live"):
        former.run_turn(sid, "two")
    with pytest.raises(SessionOwned):
        former.resume_turn(sid)
    with pytest.raises(SessionOwned):
        former.spawn_agent(sid)
    assert former.agent_for_session(sid) is None  # dropped: it owns nothing here
    assert read_log(store, sid) == before  # the refusals wrote nothing


def test_the_former_owner_drops_its_agent_when_the_move_reaches_it(
        make_runtime: MakeRuntime, opened: OpenedStore, tmp_path: Path) -> None:
    """Without being asked anything: the subscription brings the other process's
    ``agent/attached`` and the idle agent here, which owns nothing now, is let go."""
    store = opened.store
    former = make_runtime([final("one")])
    sid = former.create_session()
    former.run_turn(sid, "one")
    stale = former.agent_for_session(sid)
    assert stale is not None
    release = tmp_path / "release"
    moved = Background(lambda: other_process(opened.uri, "hold", str(sid), str(release)))
    try:
        wait_until((tmp_path / "release.started").exists, what="the held tool")
        wait_until(lambda: former.agent_for_session(sid) is None,
                   what="the stale agent dropped")
    finally:
        release.touch()
    assert moved.join()["status"] == "completed"
    # Dropped, not released again: the move recorded its detach, once.
    detached = [e.data["agent_id"] for e in only(read_log(store, sid), "agent/detached")]
    assert detached.count(stale.id) == 1, detached


def test_a_runtime_never_started_does_not_show_an_agent_for_a_moved_session(
        make_runtime: MakeRuntime, opened: OpenedStore, tmp_path: Path) -> None:
    """No subscription brings it the move: it looks in the log when asked."""
    former = make_runtime([final("one")], start=False)
    sid = former.create_session()
    former.run_turn(sid, "one")
    assert former.agent_for_session(sid) is not None
    release = tmp_path / "release"
    moved = Background(lambda: other_process(opened.uri, "hold", str(sid), str(release)))
    try:
        wait_until((tmp_path / "release.started").exists, what="the held tool")
        assert former.agent_for_session(sid) is None
    finally:
        release.touch()
    assert moved.join()["status"] == "completed"
