"""A session closed from another process lets go of its owner (docs/events.md, ``agent/detached``
and ``session/closed``): the close reaches the serving worker through its subscription, like a
cancel; it records its release (``agent/detached``, reason ``session closed``, the one event
that may follow ``session/closed``), drops its agent and stops listing the session as served —
also once the session is purged. ``sessions show``/``list`` never present a closed session as
owned. On SQLite and on the EventStoreDB emulator.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any
from uuid import UUID

from terret.domain.events import Actor, AgentDetached
from terret.domain.workers import WorkerBeat
from terret.runtime.ownership import process_start
from tests.cli.conftest import Target, is_type
from tests.cli.docs_app import new_session, serving, wait, write_app


def _worker(target: Target, worker: str) -> dict[str, Any] | None:
    return next((w for w in target.json("workers") if w["worker"] == worker), None)


def test_a_session_closed_elsewhere_is_released_by_its_live_owner(target: Target) -> None:
    write_app(target)
    sid = new_session(target, "--agent", "ops")
    with serving(target) as server:
        assert target.invoke("inject", str(sid), "deploy checkout v2", "--wake").exit_code == 0
        target.wait_for(sid, is_type("approval/requested", call_id="call-deploy"),
                        "the deploy to park")
        assert target.invoke("approve", str(sid), "call-deploy").exit_code == 0
        target.wait_for(sid, is_type("turn/end", status="completed"), "the turn to end")
        owner = target.json("sessions", "show", str(sid))["owner"]
        assert owner["lease"] == "live", owner
        worker = owner["worker"]
        wait("the worker to list the session",
             lambda: str(sid) in (_worker(target, worker) or {}).get("sessions", []))

        assert target.invoke("sessions", "close", str(sid), "--reason", "done").exit_code == 0
        detached = target.wait_for(sid, is_type("agent/detached"), "the owner's release")
        assert isinstance(detached.payload, AgentDetached)
        assert (detached.payload.reason, detached.payload.worker) == ("session closed", worker)
        types = target.types(sid)
        assert types[-2:] == ["session/closed", "agent/detached"], types

        shown = target.json("sessions", "show", str(sid))
        assert shown["closed"] is True and shown["owner"] is None, shown
        text = target.invoke("sessions", "show", str(sid)).stdout
        assert "owner     none (no worker owns it)" in text, text
        listed = next(s for s in target.json("sessions", "list") if s["id"] == str(sid))
        assert listed["owner"] is None, listed
        wait("the worker to stop listing the session",
             lambda: str(sid) not in (_worker(target, worker) or {}).get("sessions", []))

        assert target.invoke("sessions", "purge", str(sid), "--yes").exit_code == 0
        time.sleep(2 * 15.0 / 5)  # two beats: the purged id must not come back
        listed_worker = _worker(target, worker)
        assert listed_worker is not None and str(sid) not in listed_worker["sessions"]
        assert str(sid) not in target.invoke("workers").stdout
    assert "not released" not in server.text(), server.text()


def test_a_closed_session_is_never_shown_as_owned(target: Target) -> None:
    """Before its owner reacts (or if it never does: a dead or older worker), a closed session
    whose log still names a live owner is shown without one."""
    worker = f"{socket.gethostname()}:{os.getpid()}:feedc0de"
    target.store().workers().beat(WorkerBeat(
        worker=worker, host=socket.gethostname(), pid=os.getpid(), started=time.time(),
        at=time.time(), ttl=600.0, proc_start=process_start(os.getpid())))
    open_sid, closed_sid = target.new_session(), target.new_session()
    for sid in (open_sid, closed_sid):
        target.writer().execute(sid, lambda s: s.attach(
            "agent-x", socket.gethostname(), os.getpid(), worker=worker,
            lease_until=time.time() + 600))
    target.writer().execute(closed_sid, lambda s: s.close(by=Actor(actor="operator")))

    def owner(sid: UUID) -> Any:
        return target.json("sessions", "show", str(sid))["owner"]

    assert owner(open_sid)["lease"] == "live"  # the beat is live: the guard is the close's
    assert owner(closed_sid) is None
    listed = {s["id"]: s["owner"] for s in target.json("sessions", "list")}
    assert listed[str(open_sid)]["lease"] == "live" and listed[str(closed_sid)] is None
    assert "owner     none (no worker owns it)" in target.invoke(
        "sessions", "show", str(closed_sid)).stdout
    table = target.invoke("sessions", "list").stdout
    row = next(line for line in table.splitlines() if line.startswith(str(closed_sid)))
    assert " live " not in row, row
