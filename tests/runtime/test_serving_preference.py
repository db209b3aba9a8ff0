"""Who tries a free session first is chosen among the live workers that serve. A runtime that
does not serve — a web app's request worker, never started, that ran one turn and so beats —
was ranked too: the sessions it was preferred for waited two beat intervals (and a scan) for a
serving worker to take them, wakes and handoffs alike. On SQLite and on the EventStoreDB
emulator."""

from __future__ import annotations

import time

from terret import RuntimeConfig
from tests.runtime.conftest import MakeRuntime
from tests.runtime.kit import only, read_log, wait_until


def test_a_wake_is_taken_at_once_beside_a_request_worker_that_serves_nothing(
        make_runtime: MakeRuntime, store) -> None:
    config = RuntimeConfig(lease_ttl=20.0)
    web = make_runtime(config=config, start=False)  # a request worker: it never serves
    warm = web.create_session()
    assert web.run_turn(warm, "hello").status == "completed"  # it beats from now on
    serving = make_runtime(config=config)
    serving.serve_start()
    sessions = [web.create_session() for _ in range(8)]
    began = time.monotonic()
    for sid in sessions:
        web.inject(sid, "status please", wake=True)
    for sid in sessions:
        wait_until(lambda sid=sid: only(read_log(store, sid), "turn/end"),
                   what=f"the woken turn of {sid} to end")
    # Two beat intervals are 8 s at this TTL: a session the request worker was preferred for
    # waited that long.
    assert time.monotonic() - began < 5.0
    for sid in sessions:
        (attached,) = only(read_log(store, sid), "agent/attached")
        assert attached.data["worker"] == serving.lease.worker
