"""A scoped runner (a pool member's): its views follow the sessions it watches, complete from
their first event, and it receives no other session's events — on every store."""

from __future__ import annotations

import threading

from terret import RecordedEvent
from terret.domain.store import session_stream
from terret.projections import ProjectionRunner, Views, ViewStore, default_projections
from tests.projections.conftest import OpenedStore
from tests.projections.logs import Writer

WAIT = 10.0


def _scoped(opened: OpenedStore, views: ViewStore) -> ProjectionRunner:
    runner = ProjectionRunner(opened.store, views, default_projections())
    opened.runners.append(runner)
    runner.scope_to()
    return runner.start()


def test_watched_session_views_are_complete_and_others_are_never_received(
        opened_store: OpenedStore, writer: Writer, view_store: ViewStore) -> None:
    views = Views(view_store)
    mine, other = writer.start(), writer.start()
    writer.turn(mine, "before the watch", "one")
    writer.turn(other, "not mine", "x")
    runner = _scoped(opened_store, view_store)
    seen: list[RecordedEvent] = []
    runner.add_listener(seen.append)
    runner.wait_until(opened_store.store.head_position(), WAIT)
    assert views.messages(mine) == [] and views.sessions() == []

    runner.watch(session_stream(mine))  # the history comes in before watch returns
    assert [m.text for m in views.messages(mine)] == ["before the watch", "one"]
    writer.turn(mine, "after", "two")
    writer.turn(other, "still not mine", "y")
    runner.wait_until(opened_store.store.head_position(), WAIT)
    assert [m.text for m in views.messages(mine)] == ["before the watch", "one", "after", "two"]
    assert views.messages(other) == []
    assert {e.session_id for e in seen} == {mine}
    assert [s.id for s in views.sessions()] == [str(mine)]


def test_a_session_unwatched_is_forgotten_and_replayed_whole_when_watched_again(
        opened_store: OpenedStore, writer: Writer, view_store: ViewStore) -> None:
    """A pool member's views hold the sessions it serves, not every one it ever served: a
    session let go leaves them, and watched again it is read from its first event."""
    views = Views(view_store)
    sid, kept = writer.start(), writer.start()
    runner = _scoped(opened_store, view_store)
    runner.watch(session_stream(sid))
    runner.watch(session_stream(kept))
    writer.turn(sid, "first", "a")
    writer.turn(kept, "stays", "k")
    runner.wait_until(opened_store.store.head_position(), WAIT)
    runner.unwatch(session_stream(sid))
    assert views.messages(sid) == [] and views.summary(sid) is None
    assert views.usage(sid).steps == 0
    assert [s.id for s in views.sessions()] == [str(kept)]
    assert [m.text for m in views.messages(kept)] == ["stays", "k"]
    writer.turn(sid, "while away", "b")
    runner.wait_until(opened_store.store.head_position(), WAIT)
    assert views.messages(sid) == []
    runner.watch(session_stream(sid))
    runner.watch(session_stream(sid))  # twice: harmless
    writer.turn(sid, "back", "c")
    runner.wait_until(opened_store.store.head_position(), WAIT)
    assert [m.text for m in views.messages(sid)] == ["first", "a", "while away", "b",
                                                     "back", "c"]
    assert views.usage(sid).steps == 3  # nothing applied twice
    assert views.status(sid).status == "idle"


def test_watching_while_events_arrive_loses_and_doubles_nothing(
        opened_store: OpenedStore, writer: Writer, view_store: ViewStore) -> None:
    """Sessions are watched one by one while others are written to: each ends with exactly
    its own log in its views."""
    views = Views(view_store)
    sessions = [writer.start() for _ in range(8)]
    runner = _scoped(opened_store, view_store)
    done = threading.Event()

    def write() -> None:
        for round_ in range(6):
            for sid in sessions:
                writer.turn(sid, f"q{round_}", f"a{round_}")
        done.set()

    thread = threading.Thread(target=write)
    thread.start()
    for sid in sessions:
        runner.watch(session_stream(sid))
    thread.join(60)
    assert done.is_set()
    runner.wait_until(opened_store.store.head_position(), WAIT)
    expected = [t for r in range(6) for t in (f"q{r}", f"a{r}")]
    for sid in sessions:
        assert [m.text for m in views.messages(sid)] == expected
        assert views.usage(sid).steps == 6
