"""``sessions list``/``show``'s last activity is the session's, not its workers': a serve that
stops lets go of every session it held (``agent/detached``), idle ones too, and a rolling deploy
made them all look active at the deploy — first in ``sessions list``, inside any ``--since``.
The event count still counts those events. On SQLite and on the EventStoreDB emulator."""

from __future__ import annotations

import time

from tests.cli.conftest import Target, is_type
from tests.cli.docs_app import new_session, serving, write_app


def test_a_worker_letting_go_of_a_session_is_not_its_activity(target: Target) -> None:
    write_app(target)
    sid = new_session(target, "--agent", "ops")
    with serving(target):
        assert target.invoke("inject", str(sid), "status please", "--wake").exit_code == 0
        asked = target.wait_for(sid, is_type("approval/requested"), "the deploy to park")
        assert target.invoke("approve", str(sid), asked.payload.call_id).exit_code == 0
        target.wait_for(sid, is_type("turn/end"), "the turn to end")
        time.sleep(1.0)  # the serve's stop comes well after the turn's end
        before = target.json("sessions", "show", str(sid))
    log = target.events(sid)
    assert log[-1].wire_name == "agent/detached"  # the serve let it go when it stopped
    activity = [e for e in log if e.wire_name not in ("agent/attached", "agent/detached")]
    shown = target.json("sessions", "show", str(sid))
    assert shown["events"] == len(log) == before["events"] + 1
    assert shown["last_activity"] == before["last_activity"] == activity[-1].recorded_at
    assert log[-1].recorded_at - shown["last_activity"] >= 1.0
    since = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(log[-1].recorded_at - 0.5 + 1))
    listed = target.json("sessions", "list", "--since", since)
    assert str(sid) not in [s["id"] for s in listed]
