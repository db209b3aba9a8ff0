"""A runtime that stops while a claim is under way (R29): the sessions it owns are released,
and none is claimed after the release — a session claimed then would be owned by a worker that
is gone (a pool finds such a session only in a beat, which a worker that stops removes)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from terret.domain.errors import RuntimeStopping
from terret.domain.store import EventStore, StoredRecord, session_stream
from tests.runtime.conftest import MakeRuntime
from tests.runtime.kit import names, read_log, wait_until
from tests.support.stores import DelegatingStore


class HeldReads(DelegatingStore):
    """Holds up the first read of ``stream`` once armed, until ``go`` is set."""

    def __init__(self, inner: EventStore) -> None:
        super().__init__(inner)
        self.stream: str | None = None
        self.holding = threading.Event()
        self.go = threading.Event()
        self.done = threading.Event()

    def read_stream(self, stream: str, **kw: Any) -> list[StoredRecord]:
        if stream == self.stream and not self.holding.is_set():
            self.holding.set()
            self.go.wait(30)
            try:
                return self.inner.read_stream(stream, **kw)
            finally:
                self.done.set()
        return self.inner.read_stream(stream, **kw)


def test_a_wake_being_offered_when_close_begins_claims_nothing_after_the_release(
        make_runtime: MakeRuntime, store: EventStore) -> None:
    held = HeldReads(store)
    server = make_runtime(on_store=held)
    server.serve_start()
    operator = make_runtime()
    sid = operator.create_session()
    server.catch_up_views()
    held.stream = session_stream(sid)
    operator.inject(sid, "wake up", wake=True)
    # The server is reading the session to decide whether to claim it.
    assert held.holding.wait(15), "the server never read the woken session"
    release_all = server.agent_host.release_all

    def release_then_go_on(reason: str) -> None:
        release_all(reason)  # the sessions it owns (none yet) are released...
        held.go.set()  # ...and only then does the offer under way go on

    server.agent_host.release_all = release_then_go_on  # type: ignore[method-assign]
    server.close(grace=1.0)
    assert held.done.wait(15)
    time.sleep(0.5)  # time for a late claim to land, if one were made
    log = names(read_log(store, sid))
    assert "agent/attached" not in log, log
    assert "turn/start" not in log
    # The wake is still waiting in the log: another worker takes it up.
    replacement = make_runtime()
    replacement.serve_start()
    wait_until(lambda: "turn/end" in names(read_log(store, sid)), what="the wake served")


def test_a_runtime_that_stopped_takes_no_session(make_runtime: MakeRuntime) -> None:
    rt = make_runtime()
    sid = rt.create_session()
    rt.close()
    with pytest.raises(RuntimeStopping):
        rt.spawn_agent(sid)


def test_a_closed_runtime_starts_no_turn_and_writes_nothing(make_runtime: MakeRuntime,
                                                              store: EventStore) -> None:
    """Its agent for the session is still registered after ``close()`` (released): a turn
    asked of it is refused at once, with nothing written and nothing left to resume."""
    rt = make_runtime()
    sid = rt.create_session()
    assert rt.run_turn(sid, "one").status == "completed"
    rt.close()
    before = names(read_log(store, sid))
    for attempt in (lambda: rt.run_turn(sid, "two"), lambda: rt.resume_turn(sid),
                    lambda: rt.wake(sid)):
        began = time.monotonic()
        with pytest.raises(RuntimeStopping):
            attempt()
        assert time.monotonic() - began < 5  # refused, not left to wait on stopped views
    assert names(read_log(store, sid)) == before
    other = make_runtime()
    assert not other.resumable(sid)  # no half-started turn for another worker to pick up
    assert other.run_turn(sid, "two").status == "completed"



def _held_scan(server: Any) -> tuple[threading.Event, threading.Event]:
    """The server's next serving scan held up until ``go`` is set (once it runs); ``ended``
    is set when it has read the views."""
    scanning, go, ended = threading.Event(), threading.Event(), threading.Event()
    scan = server.supervisor.scan

    def held_scan() -> None:
        scanning.set()
        go.wait(30)
        try:
            scan()  # reads the views
        finally:
            ended.set()

    server.supervisor.scan = held_scan
    assert scanning.wait(15), "no scan ran"
    return go, ended


def test_a_scan_under_way_when_close_begins_is_waited_for_and_says_nothing(
        make_runtime: MakeRuntime, caplog: pytest.LogCaptureFixture) -> None:
    """The serving scan reads the views every second. One under way when the runtime closed
    (held up by a store or views that were slow, here by the test) went on after the views
    were closed and logged `the serving scan failed; retrying` with a traceback
    (sqlite3.ProgrammingError: Cannot operate on a closed database) after `stopped`. Close
    waits for it within the grace; one that outruns the grace ends without a word."""
    server = make_runtime()
    server.serve_start()
    go, ended = _held_scan(server)
    began = time.monotonic()
    threading.Timer(0.3, go.set).start()  # a scan that ends within the grace: waited for
    server.close(grace=5.0)
    assert ended.is_set() and time.monotonic() - began < 4.5
    assert "serving scan failed" not in caplog.text


def test_a_scan_that_outruns_the_grace_ends_without_a_word(
        make_runtime: MakeRuntime, caplog: pytest.LogCaptureFixture) -> None:
    server = make_runtime()
    server.serve_start()
    go, ended = _held_scan(server)
    server.close(grace=0.3)  # the views are closed under the scan
    go.set()
    assert ended.wait(15)
    time.sleep(0.2)
    assert "serving scan failed" not in caplog.text


def test_a_turn_that_overran_the_grace_starts_no_tool_call_once_close_returned(
        make_runtime: MakeRuntime, kit: Any, store: EventStore,
        gates: Any) -> None:
    """A turn held at its model request past ``close(grace)``: close returned (the session
    left to the lease's expiry), then the reply came and the tool ran — a side effect
    started after shutdown, which the worker taking the session over may run again. The
    reply is still recorded (its cost is the log's), but no call starts."""
    from terret.domain.errors import LostOwnership
    from tests.runtime.kit import Background, calls, final, only

    gate = gates()
    rt = make_runtime([calls(("status", {"env": "a"}), gate=gate), final()])
    sid = rt.create_session()
    job = Background(lambda: rt.run_turn(sid, "go"))
    wait_until(lambda: rt.agent_for_session(sid) is not None
               and rt.agent_for_session(sid).status == "running", what="the turn")  # type: ignore[union-attr]
    time.sleep(0.2)
    rt.close(grace=0.3)
    gate.set()
    with pytest.raises(LostOwnership, match="has stopped"):
        job.join()
    assert kit.ran == []
    log = read_log(store, sid)
    assert len(only(log, "assistant/message")) == 1  # the reply (and its cost) is kept
    assert "tool/result" not in names(log) and "turn/end" not in names(log)


def test_a_turn_asked_while_close_waits_for_the_others_claims_nothing(
        make_runtime: MakeRuntime, store: EventStore, gates: Any) -> None:
    """During close()'s grace (a turn still running), ``run_turn`` on another session was
    refused with RuntimeStopping — after its spawn had claimed the session: agent/attached,
    then the shutdown's agent/detached, for a call that wrote "nothing"."""
    from tests.runtime.kit import held_turn

    held = held_turn(make_runtime, gates)  # at its model request
    rt = held.rt
    fresh = rt.create_session()
    closing = threading.Thread(target=lambda: rt.close(grace=5.0))
    closing.start()
    wait_until(rt.stopping.is_set, what="close to begin")
    before = read_log(store, fresh)
    with pytest.raises(RuntimeStopping):
        rt.run_turn(fresh, "hello")
    held.gate.set()
    closing.join(15)
    assert held.job.join().status == "completed"  # within the grace
    assert read_log(store, fresh) == before
