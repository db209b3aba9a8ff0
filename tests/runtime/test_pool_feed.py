"""How a pool member settles what its consumer group gives it (terret/runtime/pool.py): acked
once handled, retried when the store could not be read or the member is stopping, and only
the events that ask for a worker offered."""

from __future__ import annotations

import logging
import threading
from uuid import UUID, uuid4

import pytest

from terret.domain.codec import encode
from terret.domain.errors import SessionNotFound, StoreUnavailable
from terret.domain.events import AgentDetached, InboxQueued, StepStarted, TurnStarted
from terret.domain.groups import GroupMessage, GroupReader
from terret.domain.store import StoredRecord, session_stream
from terret.runtime.pool import GroupFeed


class Message(GroupMessage):
    def __init__(self, record: StoredRecord) -> None:
        self.record = record
        self.settled: list[str] = []

    def ack(self) -> None:
        self.settled.append("ack")

    def retry(self, reason: str) -> None:
        self.settled.append(f"retry: {reason}")


class Reader(GroupReader):
    def __init__(self, messages: list[Message]) -> None:
        self.messages = list(messages)
        self.stopped = False

    def __next__(self) -> GroupMessage:
        if self.stopped or not self.messages:
            raise StopIteration
        return self.messages.pop(0)

    def stop(self) -> None:
        self.stopped = True


def _message(sid: UUID, payload: object) -> Message:
    new = encode(payload)  # type: ignore[arg-type]
    return Message(StoredRecord(session_stream(sid), 1, 1, new.event_id, new.wire_name,
                                new.data, new.metadata, 0.0))


def _run(messages: list[Message], offer: object, stopping: bool = False) -> None:
    flag = threading.Event()
    if stopping:
        flag.set()
    feed = GroupFeed(Reader(messages), offer, flag)  # type: ignore[arg-type]
    feed.start()
    feed._thread.join(5)


def test_what_may_ask_for_a_worker_is_offered_and_acked_the_rest_only_acked() -> None:
    sid = uuid4()
    offered: list[tuple[UUID, str | None]] = []
    wake = _message(sid, InboxQueued(inbox_id="i1", text="hi", wake=True))
    quiet = _message(sid, InboxQueued(inbox_id="i2", text="later"))
    released = _message(sid, AgentDetached(agent_id="a", host="h", pid=1, reason="shutdown",
                                           worker="w1"))
    started = _message(sid, TurnStarted(turn=1, trigger="user"))
    other = _message(sid, StepStarted(turn=1, step=1, model="m"))
    _run([wake, quiet, released, started, other],
         lambda s, leaving: offered.append((s, leaving)))
    assert offered == [(sid, None), (sid, "w1"), (sid, None)]
    assert [m.settled for m in (wake, quiet, released, started, other)] == [["ack"]] * 5


def test_a_store_that_cannot_be_read_retries_and_a_stopping_member_hands_back() -> None:
    sid = uuid4()

    def unreadable(s: UUID, leaving: str | None) -> None:
        raise StoreUnavailable("down")

    failing = _message(sid, InboxQueued(inbox_id="i1", text="hi", wake=True))
    _run([failing], unreadable)
    assert len(failing.settled) == 1 and failing.settled[0].startswith("retry: ")
    handed = _message(sid, InboxQueued(inbox_id="i1", text="hi", wake=True))
    offered: list[UUID] = []
    _run([handed], lambda s, leaving: offered.append(s), stopping=True)
    assert offered == [] and handed.settled == ["retry: this worker is stopping"]


def test_a_failing_offer_is_logged_and_acked_not_redelivered_forever() -> None:
    sid = uuid4()

    def broken(s: UUID, leaving: str | None) -> None:
        raise RuntimeError("a bug")

    message = _message(sid, InboxQueued(inbox_id="i1", text="hi", wake=True))
    _run([message], broken)
    assert message.settled == ["ack"]


def test_a_purged_session_is_passed_over_without_a_traceback(
        caplog: pytest.LogCaptureFixture) -> None:
    """A new group replays wakes from the start of the log, those of sessions purged since
    among them: each is passed over in one INFO line, never an ERROR with a traceback."""
    sid = uuid4()

    def purged(s: UUID, leaving: str | None) -> None:
        raise SessionNotFound(f"no session {s}")

    message = _message(sid, InboxQueued(inbox_id="i1", text="hi", wake=True))
    with caplog.at_level(logging.INFO, logger="terret"):
        _run([message], purged)
    assert message.settled == ["ack"]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    assert any("was passed over" in r.getMessage() for r in caplog.records)
