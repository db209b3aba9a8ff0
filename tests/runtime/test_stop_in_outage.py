"""A stop while the store does not answer (an EventStoreDB outage): the releases and the
registry's leave were each retried for the store's timeout, one after another — a SIGTERM of
``serve`` took ~40 s with a grace of 10, past what a supervisor waits (Kubernetes: 30 s). The
stop's last writes are bounded by the grace and a margin; left undone, the lease expires and
other workers take the sessions over, as after a crash."""

from __future__ import annotations

import time

import pytest

from terret import AgentDefinition, Reply, Runtime, ScriptedProvider, StaticResolver
from terret.adapters.stores import open_store
from terret.runtime.stops import STOP_MARGIN
from tests.support.esdb_emulator import EsdbEmulator


@pytest.mark.timeout(120)
def test_a_stop_while_the_store_is_down_ends_within_the_grace_and_a_margin() -> None:
    emulator = EsdbEmulator().start(host="127.0.0.1", port=0)
    store = open_store(emulator.uri)  # each operation retried for 10 s by default
    rt = Runtime(store, resolver=StaticResolver({"scripted": ScriptedProvider(
        default=Reply(text="ok"))}), agents=[AgentDefinition()]).start()
    try:
        sessions = [rt.create_session() for _ in range(3)]
        for sid in sessions:
            assert rt.run_turn(sid, "hello").status == "completed"
    finally:
        emulator.stop(grace=0)
    started = time.monotonic()
    rt.close(grace=1.0)
    # docs/cli.md: at most 5 s (STOP_MARGIN) past the grace — the views' catch-up took its
    # own second before the margin began (a supervisor killing at grace + 5 s killed it).
    assert time.monotonic() - started < 1.0 + STOP_MARGIN + 0.5  # slack for a loaded host
    store.close()
