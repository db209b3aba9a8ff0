"""Append rules (wire notes §3.1), positions (§3.2) and reads (§2.2-2.5), via esdbclient."""

from __future__ import annotations

import asyncio
import datetime
import os
import time
from collections.abc import Callable
from typing import Any

import pytest
from esdbclient import AsyncEventStoreDBClient, EventStoreDBClient, NewEvent, StreamState
from esdbclient.exceptions import (
    GrpcDeadlineExceeded,
    GrpcError,
    MaximumAppendSizeExceededError,
    NotFound,
    WrongCurrentVersion,
)

from .helpers import new_event, positioned


def test_positions_are_positive_increasing_and_batches_return_the_last(
    client: EventStoreDBClient, stream_name: str
) -> None:
    commit_position0 = client.get_commit_position()
    e1, e2, e3 = new_event(), new_event(), new_event()
    commit_position1 = client.append_to_stream(
        stream_name, current_version=StreamState.NO_STREAM, events=e1
    )
    assert commit_position1 > commit_position0 >= 0
    commit_position3 = client.append_to_stream(stream_name, current_version=0, events=[e2, e3])
    events = client.get_stream(stream_name)
    assert [e.id for e in events] == [e1.id, e2.id, e3.id]
    assert [e.stream_position for e in events] == [0, 1, 2]
    positions = [positioned(e) for e in events]
    assert positions[0] == commit_position1
    assert positions[1] < positions[2] == commit_position3
    assert all(e.prepare_position == e.commit_position for e in events)
    assert client.get_commit_position() == commit_position3


@pytest.mark.parametrize("batch", [False, True], ids=["Append", "BatchAppend"])
def test_reappending_with_an_old_revision_is_idempotent(
    client: EventStoreDBClient, stream_name: str, batch: bool
) -> None:
    e1, e2, e3 = new_event(), new_event(), new_event()

    def append(version: int | StreamState, *events: NewEvent) -> int:
        payload = list(events) if batch or len(events) > 1 else events[0]
        return client.append_to_stream(stream_name, current_version=version, events=payload)

    p1 = append(StreamState.NO_STREAM, e1)
    p2 = append(0, e2)
    p3 = append(1, e3)
    # Re-appending returns exactly the original position and writes nothing.
    assert append(StreamState.NO_STREAM, e1) == p1
    assert append(0, e2) == p2
    assert append(1, e3) == p3
    assert append(StreamState.NO_STREAM, e1, e2) == p2
    assert append(0, e2, e3) == p3
    assert len(client.get_stream(stream_name)) == 3
    # Running past the end after matching is "corrupted idempotency": a version error.
    with pytest.raises(WrongCurrentVersion):
        append(0, e2, e3, new_event())
    assert [e.id for e in client.get_stream(stream_name)] == [e1.id, e2.id, e3.id]


@pytest.mark.parametrize("batch", [False, True], ids=["Append", "BatchAppend"])
def test_wrong_version_messages_carry_the_current_revision(
    client: EventStoreDBClient, stream_name: str, batch: bool
) -> None:
    def append(version: int | StreamState) -> int:
        event = new_event()
        payload = [event] if batch else event
        return client.append_to_stream(stream_name, current_version=version, events=payload)

    with pytest.raises(WrongCurrentVersion, match=f"Stream '{stream_name}' does not exist"):
        append(0)
    with pytest.raises(WrongCurrentVersion, match="does not exist"):
        append(StreamState.EXISTS)
    append(StreamState.NO_STREAM)
    with pytest.raises(
        WrongCurrentVersion, match="Stream position of last event is 0 not StreamState.NO_STREAM"
    ):
        append(StreamState.NO_STREAM)
    with pytest.raises(WrongCurrentVersion, match="Stream position of last event is 0 not 5"):
        append(5)
    append(StreamState.EXISTS)
    append(1)
    assert client.get_current_version(stream_name) == 2


def test_any_and_exists_deduplicate_by_event_id(
    client: EventStoreDBClient, stream_name: str
) -> None:
    e1, e2 = new_event(), new_event()
    client.append_to_stream(stream_name, current_version=StreamState.ANY, events=[e1, e2])
    p2 = client.get_stream(stream_name)[1].commit_position
    any_version, exists = StreamState.ANY, StreamState.EXISTS
    assert client.append_to_stream(stream_name, current_version=any_version, events=[e1, e2]) == p2
    assert client.append_to_stream(stream_name, current_version=exists, events=e2) == p2
    with pytest.raises(WrongCurrentVersion):  # first id known, the next one not
        client.append_to_stream(
            stream_name, current_version=StreamState.ANY, events=[e1, new_event()]
        )
    assert len(client.get_stream(stream_name)) == 2
    # An id known only in another stream is not a duplicate here.
    other = f"{stream_name}-other"
    client.append_to_stream(other, current_version=StreamState.ANY, events=e1)
    assert [e.id for e in client.get_stream(other)] == [e1.id]


def test_expected_version_equal_to_current_writes_duplicates(
    client: EventStoreDBClient, stream_name: str
) -> None:
    e1 = new_event()
    client.append_to_stream(stream_name, current_version=StreamState.NO_STREAM, events=e1)
    client.append_to_stream(stream_name, current_version=0, events=e1)
    assert [e.id for e in client.get_stream(stream_name)] == [e1.id, e1.id]


def test_exists_passes_for_a_stream_with_only_metadata(
    client: EventStoreDBClient, stream_name: str
) -> None:
    client.set_stream_metadata(stream_name, metadata={"custom": 1})
    client.append_to_stream(stream_name, current_version=StreamState.EXISTS, events=new_event())
    assert client.get_current_version(stream_name) == 0


def test_append_with_zero_timeout_writes_nothing(
    client: EventStoreDBClient, stream_name: str
) -> None:
    with pytest.raises(GrpcDeadlineExceeded):
        client.append_to_stream(
            stream_name, current_version=StreamState.ANY, events=new_event(), timeout=0
        )
    with pytest.raises(GrpcDeadlineExceeded):
        client.append_to_stream(
            stream_name, current_version=StreamState.ANY, events=[new_event()], timeout=0
        )
    assert client.get_current_version(stream_name) is StreamState.NO_STREAM


def test_recorded_events_round_trip(client: EventStoreDBClient, stream_name: str) -> None:
    binary = NewEvent(type="Binary", data=os.urandom(16), metadata=b"meta")
    text = NewEvent(type="Text", data=b"hello", content_type="application/octet-stream")
    client.append_to_stream(stream_name, current_version=StreamState.ANY, events=[binary, text])
    first, second = client.get_stream(stream_name)
    assert (first.id, first.type, first.data, first.metadata) == (
        binary.id,
        "Binary",
        binary.data,
        b"meta",
    )
    assert first.content_type == "application/json"  # data is not validated
    assert second.content_type == "application/octet-stream"
    assert first.stream_name == stream_name
    now = datetime.datetime.now(datetime.UTC)
    assert first.recorded_at is not None
    assert abs((now - first.recorded_at).total_seconds()) < 10


def test_read_stream_directions_and_limits(client: EventStoreDBClient, stream_name: str) -> None:
    events = [new_event() for _ in range(5)]
    client.append_to_stream(stream_name, current_version=StreamState.NO_STREAM, events=events)

    def ids(**kwargs: Any) -> list[int]:
        return [e.stream_position for e in client.get_stream(stream_name, **kwargs)]

    assert ids() == [0, 1, 2, 3, 4]
    assert ids(stream_position=2) == [2, 3, 4]
    assert ids(stream_position=2, limit=2) == [2, 3]
    assert ids(stream_position=9) == []
    assert ids(backwards=True) == [4, 3, 2, 1, 0]
    assert ids(stream_position=3, backwards=True, limit=2) == [3, 2]
    assert ids(stream_position=99, backwards=True, limit=2) == [4, 3]
    assert client.get_current_version(stream_name) == 4


def test_missing_stream_is_not_found(client: EventStoreDBClient, stream_name: str) -> None:
    with pytest.raises(NotFound):
        client.get_stream(stream_name)
    with pytest.raises(NotFound):
        list(client.read_stream(stream_name))
    assert client.get_current_version(stream_name) is StreamState.NO_STREAM


def test_read_all_positions_are_inclusive_forwards_and_exclusive_backwards(
    client: EventStoreDBClient, stream_name: str
) -> None:
    events = [new_event() for _ in range(4)]
    client.append_to_stream(stream_name, current_version=StreamState.NO_STREAM, events=events)
    positions = [positioned(e) for e in client.get_stream(stream_name)]
    assert positions == sorted(positions)
    p1 = positions[1]
    forwards = list(client.read_all(commit_position=p1, limit=3))
    assert [e.id for e in forwards] == [e.id for e in events[1:4]]
    backwards = list(client.read_all(commit_position=p1, backwards=True, limit=1))
    assert [e.id for e in backwards] == [events[0].id]
    latest = list(client.read_all(backwards=True, limit=2))
    assert [e.id for e in latest] == [events[3].id, events[2].id]
    assert list(client.read_all(commit_position=positions[-1] + 1)) == []


def test_all_starts_with_a_system_event_hidden_by_the_default_filter(
    client: EventStoreDBClient,
) -> None:
    (first,) = client.read_all(filter_exclude=[], limit=1)
    assert first.type.startswith("$")
    assert first.commit_position is not None and first.commit_position >= 0
    assert all(not e.type.startswith("$") for e in client.read_all(limit=50))


def test_get_commit_position_ignores_system_events(
    client: EventStoreDBClient, stream_name: str
) -> None:
    position = client.append_to_stream(
        stream_name, current_version=StreamState.ANY, events=new_event()
    )
    client.set_stream_metadata(stream_name, metadata={"x": 1})  # a `$metadata` event
    assert client.get_commit_position() == position
    assert client.get_commit_position(filter_exclude=[]) > position


def test_filters_use_search_semantics(
    client: EventStoreDBClient, stream_name: str, unique_type: Callable[[str], str]
) -> None:
    created, updated, deleted = unique_type("Created"), unique_type("Updated"), unique_type("X")
    client.append_to_stream(
        stream_name,
        current_version=StreamState.NO_STREAM,
        events=[new_event(created), new_event(updated), new_event(deleted)],
    )
    start = client.get_stream(stream_name)[0].commit_position
    assert start is not None

    def types(**kwargs: Any) -> set[str]:
        return {e.type for e in client.read_all(commit_position=start, **kwargs)}

    assert types(filter_include=[created]) == {created}
    # "^A|B$" matches anything starting with A or ending with B.
    assert types(filter_include=[created, deleted]) == {created, deleted}
    assert types(filter_include=[created[:-3]]) == set()
    assert types(filter_include=[unique_type("") + ".*"]) == {created, updated, deleted}
    own = types(filter_exclude=[r"\$.+", created])
    assert updated in own and deleted in own and created not in own
    by_stream = list(
        client.read_all(
            commit_position=start, filter_include=[stream_name], filter_by_stream_name=True
        )
    )
    assert [e.type for e in by_stream] == [created, updated, deleted]
    assert [e.type for e in client.read_all(commit_position=start, limit=2)] == [created, updated]


def test_read_all_deadline_is_honoured(client: EventStoreDBClient) -> None:
    events = client.read_all(timeout=0.001)
    time.sleep(0.5)
    with pytest.raises(GrpcDeadlineExceeded):
        list(events)


def test_appends_over_the_maximum_size_are_rejected_whole(
    client: EventStoreDBClient, stream_name: str
) -> None:
    big = NewEvent(type="Big", data=b"x" * 1_048_577)
    with pytest.raises(MaximumAppendSizeExceededError):
        client.append_to_stream(
            stream_name, current_version=StreamState.ANY, events=[new_event(), big]
        )
    with pytest.raises(GrpcError):  # the Append RPC answers INVALID_ARGUMENT
        client.append_to_stream(stream_name, current_version=StreamState.ANY, events=big)
    assert client.get_current_version(stream_name) is StreamState.NO_STREAM


def test_links_are_resolved_on_request(client: EventStoreDBClient, stream_name: str) -> None:
    target = new_event("Target")
    client.append_to_stream(stream_name, current_version=StreamState.ANY, events=target)
    links = f"{stream_name}-links"
    client.append_to_stream(
        links,
        current_version=StreamState.ANY,
        events=NewEvent(type="$>", data=b"0@" + stream_name.encode()),
    )
    (unresolved,) = client.get_stream(links)
    assert unresolved.type == "$>" and unresolved.link is None
    (resolved,) = client.get_stream(links, resolve_links=True)
    assert (resolved.id, resolved.stream_name) == (target.id, stream_name)
    assert resolved.link is not None and resolved.link.stream_name == links


def test_async_client_appends_through_batch_append(esdb_uri: str, stream_name: str) -> None:
    async def scenario() -> list[str]:
        client = AsyncEventStoreDBClient(esdb_uri)
        await client.connect()
        try:
            await client.append_to_stream(
                stream_name, current_version=StreamState.NO_STREAM, events=new_event("One")
            )
            await client.set_stream_metadata(stream_name, metadata={"k": "v"})
            await client.append_to_stream(stream_name, current_version=0, events=[new_event("Two")])
            return [e.type for e in await client.get_stream(stream_name)]
        finally:
            await client.close()

    assert asyncio.run(scenario()) == ["One", "Two"]
