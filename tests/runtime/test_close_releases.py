"""A session closed by any process is let go by the started runtime that owns it: the close
arrives through its subscription (like a cancel), the owner records its release
(``agent/detached``, reason ``session closed``: the one event that follows ``session/closed``)
and drops its agent, so it no longer counts the session among those it serves. On SQLite and on
the EventStoreDB adapter."""

from __future__ import annotations

import time

from terret.domain.events import Actor
from terret.domain.store import EventStore, session_stream
from terret.runtime.commands import SessionCommands
from tests.runtime.conftest import MakeRuntime


def test_a_close_from_elsewhere_releases_the_owner(make_runtime: MakeRuntime,
                                                   store: EventStore) -> None:
    rt = make_runtime()
    sid = rt.create_session()
    assert rt.run_turn(sid, "hello").status == "completed"
    agent = rt.agent_for_session(sid)
    assert agent is not None and sid in rt.agent_host.session_ids()

    SessionCommands.on(store).close(sid, by=Actor(actor="operator"), reason="done")
    deadline = time.monotonic() + 10
    while rt.agent_for_session(sid) is not None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert rt.agent_for_session(sid) is None
    assert sid not in rt.agent_host.session_ids()
    records = store.read_stream(session_stream(sid))
    assert [r.wire_name for r in records][-2:] == ["session/closed", "agent/detached"]
    assert b"session closed" in records[-1].data
    assert rt.writer.load(sid).state.owner is None


def test_close_session_here_releases_once(make_runtime: MakeRuntime, store: EventStore) -> None:
    rt = make_runtime()
    sid = rt.create_session()
    rt.run_turn(sid, "hello")
    rt.close_session(sid, by=Actor(actor="operator"))
    assert rt.agent_for_session(sid) is None
    rt.catch_up_views()
    time.sleep(0.2)  # the listener's let-go finds nothing left to do
    types = [r.wire_name for r in store.read_stream(session_stream(sid))]
    assert types[-2:] == ["session/closed", "agent/detached"]
    assert types.count("agent/detached") == 1


def test_a_purge_right_after_the_close_releases_the_owner_that_never_saw_the_close(
        make_runtime: MakeRuntime, store: EventStore) -> None:
    """Close and purge back to back from another process (a retention script): on SQLite the
    purge deleted the ``session/closed`` before the owner's subscription read it, and the owner
    kept the session — in its beats, in ``terret workers`` — until it stopped. The purge, which
    the subscription does read, lets it go."""
    import threading

    from terret.domain.events import TurnEnded

    rt = make_runtime()
    sid = rt.create_session()
    held, go = threading.Event(), threading.Event()

    def hold(event: object) -> None:  # the subscription, held right after the turn's end
        held.set()
        go.wait(30)

    rt.runner.add_listener(hold, {TurnEnded.wire_name})
    assert rt.run_turn(sid, "hello").status == "completed"
    assert held.wait(10)
    commands = SessionCommands.on(store)
    commands.close(sid, by=Actor(actor="operator"), reason="done")
    commands.purge(sid, by=Actor(actor="operator"), reason="retention")
    go.set()
    deadline = time.monotonic() + 10
    while rt.agent_for_session(sid) is not None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert rt.agent_for_session(sid) is None
    assert sid not in rt.agent_host.session_ids()
    assert store.read_stream(session_stream(sid)) == []  # nothing written after the purge
