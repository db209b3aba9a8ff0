"""Soft delete, tombstone and the `$$` metastream (wire notes §2.6-2.7, §3.5-3.6)."""

from __future__ import annotations

import time

import pytest
from esdbclient import EventStoreDBClient, StreamState
from esdbclient.exceptions import (
    FailedPrecondition,
    NotFound,
    StreamIsDeleted,
    WrongCurrentVersion,
)

from .helpers import new_event

MAX_LONG = 9223372036854775807


def _three_events(client: EventStoreDBClient, stream: str) -> None:
    events = [new_event() for _ in range(3)]
    client.append_to_stream(stream, current_version=StreamState.NO_STREAM, events=events)


def test_soft_delete_hides_the_stream_and_can_repeat(
    client: EventStoreDBClient, stream_name: str
) -> None:
    _three_events(client, stream_name)
    with pytest.raises(WrongCurrentVersion, match="Actual version: 2"):
        client.delete_stream(stream_name, current_version=1)
    client.delete_stream(stream_name, current_version=2)
    with pytest.raises(NotFound):
        client.get_stream(stream_name)
    assert client.get_current_version(stream_name) is StreamState.NO_STREAM
    assert client.get_stream_metadata(stream_name) == ({"$tb": MAX_LONG}, 0)
    client.delete_stream(stream_name, current_version=2)  # again, with the old revision
    client.delete_stream(stream_name, current_version=StreamState.ANY)
    assert client.get_stream_metadata(stream_name)[1] == 2
    with pytest.raises(StreamIsDeleted):
        client.delete_stream(stream_name, current_version=StreamState.EXISTS)
    with pytest.raises(StreamIsDeleted):
        client.append_to_stream(
            stream_name, current_version=StreamState.EXISTS, events=[new_event()]
        )


def test_deleting_a_missing_stream_is_not_found(
    client: EventStoreDBClient, stream_name: str
) -> None:
    for version in (StreamState.ANY, StreamState.NO_STREAM, StreamState.EXISTS):
        with pytest.raises(NotFound):
            client.delete_stream(stream_name, current_version=version)


@pytest.mark.parametrize("version", [StreamState.NO_STREAM, StreamState.ANY, 2])
def test_appending_after_soft_delete_recreates_the_stream(
    client: EventStoreDBClient, stream_name: str, version: int | StreamState
) -> None:
    _three_events(client, stream_name)
    client.delete_stream(stream_name, current_version=2)
    with pytest.raises(WrongCurrentVersion):
        client.append_to_stream(stream_name, current_version=1, events=new_event())
    event = new_event()
    client.append_to_stream(stream_name, current_version=version, events=event)
    (recreated,) = client.get_stream(stream_name)
    assert (recreated.id, recreated.stream_position) == (event.id, 3)
    metadata, _ = client.get_stream_metadata(stream_name)
    assert metadata == {"$tb": 3}
    assert client.get_current_version(stream_name) == 3


def test_writing_metadata_undeletes_a_soft_deleted_stream(
    client: EventStoreDBClient, stream_name: str
) -> None:
    client.append_to_stream(
        stream_name, current_version=StreamState.NO_STREAM, events=[new_event(), new_event()]
    )
    client.delete_stream(stream_name, current_version=1)
    _, version = client.get_stream_metadata(stream_name)
    assert isinstance(version, int)
    client.set_stream_metadata(stream_name, metadata={"foo": "bar"}, current_version=version)
    metadata, new_version = client.get_stream_metadata(stream_name)
    assert metadata == {"foo": "bar", "$tb": 2}
    assert new_version == version + 2


def test_tombstone_deletes_for_good(client: EventStoreDBClient, stream_name: str) -> None:
    _three_events(client, stream_name)
    with pytest.raises(WrongCurrentVersion):
        client.tombstone_stream(stream_name, current_version=0)
    client.tombstone_stream(stream_name, current_version=2)
    with pytest.raises(StreamIsDeleted):
        client.get_stream(stream_name)
    with pytest.raises(StreamIsDeleted):
        client.get_current_version(stream_name)
    with pytest.raises(StreamIsDeleted):
        client.get_stream_metadata(stream_name)
    with pytest.raises(FailedPrecondition, match="is deleted"):  # the Append RPC
        client.append_to_stream(stream_name, current_version=StreamState.ANY, events=new_event())
    with pytest.raises(StreamIsDeleted):  # the BatchAppend RPC
        client.append_to_stream(stream_name, current_version=StreamState.ANY, events=[new_event()])
    with pytest.raises(StreamIsDeleted):
        client.delete_stream(stream_name, current_version=StreamState.ANY)
    with pytest.raises(StreamIsDeleted):
        client.tombstone_stream(stream_name, current_version=StreamState.ANY)


def test_tombstoned_metastream_accepts_writes_at_its_own_version(
    client: EventStoreDBClient, stream_name: str
) -> None:
    client.append_to_stream(stream_name, current_version=StreamState.ANY, events=new_event())
    client.set_stream_metadata(stream_name, metadata={"a": 1})
    client.set_stream_metadata(stream_name, metadata={"a": 2}, current_version=0)
    client.tombstone_stream(stream_name, current_version=StreamState.ANY)
    client.set_stream_metadata(stream_name, metadata={"a": 3}, current_version=1)
    client.set_stream_metadata(stream_name, metadata={"a": 4})
    with pytest.raises(StreamIsDeleted):
        client.get_stream_metadata(stream_name)


def test_tombstone_of_a_missing_stream(client: EventStoreDBClient, stream_name: str) -> None:
    with pytest.raises(NotFound):
        client.tombstone_stream(stream_name, current_version=StreamState.EXISTS)
    client.tombstone_stream(stream_name, current_version=StreamState.NO_STREAM)
    client.tombstone_stream(f"{stream_name}-2", current_version=StreamState.ANY)
    with pytest.raises(StreamIsDeleted):
        client.get_stream(stream_name)


def test_all_keeps_events_of_deleted_streams(client: EventStoreDBClient, stream_name: str) -> None:
    _three_events(client, stream_name)
    client.tombstone_stream(stream_name, current_version=2)
    records = list(
        client.read_all(filter_exclude=[], filter_include=[stream_name], filter_by_stream_name=True)
    )
    assert [r.stream_position for r in records] == [0, 1, 2, MAX_LONG]
    assert records[-1].type == "$streamDeleted"


def test_metadata_round_trip_and_versions(client: EventStoreDBClient, stream_name: str) -> None:
    client.append_to_stream(stream_name, current_version=StreamState.ANY, events=new_event())
    assert client.get_stream_metadata(stream_name) == ({}, StreamState.NO_STREAM)
    client.set_stream_metadata(
        stream_name, metadata={"custom": "x"}, current_version=StreamState.NO_STREAM
    )
    client.set_stream_metadata(stream_name, metadata={"custom": "y"}, current_version=0)
    assert client.get_stream_metadata(stream_name) == ({"custom": "y"}, 1)
    with pytest.raises(WrongCurrentVersion):
        client.set_stream_metadata(stream_name, metadata={}, current_version=0)
    # A metastream is read with $maxCount 1: forwards shows only the latest event.
    (latest,) = client.get_stream(f"$${stream_name}")
    assert latest.stream_position == 1


def test_max_count_and_truncate_before_limit_stream_reads(
    client: EventStoreDBClient, stream_name: str
) -> None:
    events = [new_event() for _ in range(5)]
    client.append_to_stream(stream_name, current_version=StreamState.NO_STREAM, events=events)
    client.set_stream_metadata(stream_name, metadata={"$maxCount": 2})
    assert [e.stream_position for e in client.get_stream(stream_name)] == [3, 4]
    client.set_stream_metadata(stream_name, metadata={"$tb": 1})
    assert [e.stream_position for e in client.get_stream(stream_name)] == [1, 2, 3, 4]
    assert [e.stream_position for e in client.get_stream(stream_name, backwards=True, limit=2)] == [
        4,
        3,
    ]
    client.set_stream_metadata(stream_name, metadata={"$tb": 10})
    assert client.get_stream(stream_name) == ()  # truncated, not "not found"
    with pytest.raises(IndexError):  # esdbclient's own quirk on an empty read
        client.get_current_version(stream_name)
    # Truncation does not affect expected-version checks or $all.
    client.append_to_stream(stream_name, current_version=4, events=new_event())
    assert len(list(client.read_all(filter_include=[stream_name], filter_by_stream_name=True))) == 6


def test_max_age_hides_old_events(client: EventStoreDBClient, stream_name: str) -> None:
    client.append_to_stream(stream_name, current_version=StreamState.ANY, events=new_event())
    client.set_stream_metadata(stream_name, metadata={"$maxAge": 1})
    time.sleep(1.1)
    fresh = new_event()
    client.append_to_stream(stream_name, current_version=0, events=fresh)
    assert [e.id for e in client.get_stream(stream_name)] == [fresh.id]
