"""A store outage (or a full disk) met by a running turn: the turn closed ``failed`` once the
store came back — its end was the first write to land — and the user's message was never
answered, though docs/operations.md (*Crashes*) says the turn stops open and the worker resumes
it once the store takes writes again. Now it stays open: a serving worker resumes it, a caller
gets the store's error and may resume it. On SQLite and on the EventStoreDB emulator."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from terret.domain.errors import StoreUnavailable
from terret.domain.store import EventStore, NewRecord
from tests.runtime.conftest import MakeRuntime
from tests.runtime.kit import Kit, calls, final, only, read_log, wait_until


def _down_once_at_step_two(store: Any, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The store refuses, once, the append that opens step 2 (it carries step 1's tool result
    and end): an outage past the store's retries."""
    append = store.append
    refused: list[str] = []

    def flaky(stream: str, records: Sequence[NewRecord], expected: Any) -> Any:
        if not refused and any(r.wire_name == "step/start" and b'"step":2' in
                               r.data.replace(b" ", b"") for r in records):
            refused.append(stream)
            raise StoreUnavailable("the store is down (a test's outage)")
        return append(stream, records, expected)

    monkeypatch.setattr(store, "append", flaky)
    return refused


def test_a_turn_the_store_fails_stays_open_and_a_serving_worker_resumes_it(
        make_runtime: MakeRuntime, store, kit: Kit, monkeypatch: pytest.MonkeyPatch) -> None:
    rt = make_runtime([calls(("status", {"env": "prod"})), final("all green")])
    rt.serve_start()
    sid = rt.create_session()
    refused = _down_once_at_step_two(store, monkeypatch)
    rt.inject(sid, "check prod", wake=True)
    wait_until(lambda: only(read_log(store, sid), "turn/end"), what="the turn to end")
    assert refused
    (end,) = only(read_log(store, sid), "turn/end")
    assert end.data["status"] == "completed", end.data  # not failed by the outage
    assert only(read_log(store, sid), "assistant/message")[-1].data["text"] == "all green"
    # Its result, refused with the step's start, was logged on the way out (the store was
    # back): the resumed turn did not run the call again. (Had the outage lasted, it would
    # have: at least once, as after a crash.)
    assert kit.ran == [("status", {"env": "prod"})]
    assert len(only(read_log(store, sid), "tool/result")) == 1


def test_a_caller_gets_the_stores_error_and_the_turn_stays_resumable(
        make_runtime: MakeRuntime, store, kit: Kit, monkeypatch: pytest.MonkeyPatch) -> None:
    rt = make_runtime([calls(("status", {"env": "prod"})), final("all green")])
    sid = rt.create_session()
    _down_once_at_step_two(store, monkeypatch)
    with pytest.raises(StoreUnavailable):
        rt.run_turn(sid, "check prod")
    assert not only(read_log(store, sid), "turn/end")
    assert rt.resumable(sid)
    result = rt.resume_turn(sid)
    assert (result.status, result.text) == ("completed", "all green")


def test_a_runtime_that_does_not_serve_hands_the_turn_off_once_the_store_is_back(
        other_store: EventStore, make_runtime: MakeRuntime, store: EventStore, kit: Kit,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A web app's request worker (a runtime that does not serve) whose turn the store failed
    kept the session while it lived: a serving worker would not take a live worker's open turn,
    and the worker's own next run_turn was refused (the turn is open) — the user's message
    waited for the web worker's process to end. It hands the turn off now (agent/detached),
    and `serve`, in another process, resumes it."""
    from terret.runtime.runtime import HANDED_OFF

    web = make_runtime([calls(("status", {"env": "prod"})), final("unused")], start=False)
    sid = web.create_session()
    _down_once_at_step_two(store, monkeypatch)
    with pytest.raises(StoreUnavailable):
        web.run_turn(sid, "check prod")
    served = make_runtime([final("all green")], on_store=other_store, start=False)
    served.serve_start()
    wait_until(lambda: only(read_log(store, sid), "turn/end"), what="the turn to end")
    (end,) = only(read_log(store, sid), "turn/end")
    assert end.data["status"] == "completed"
    assert only(read_log(store, sid), "assistant/message")[-1].data["text"] == "all green"
    (detached,) = only(read_log(store, sid), "agent/detached")
    assert detached.data["reason"] == HANDED_OFF
    assert web.agent_for_session(sid) is None
