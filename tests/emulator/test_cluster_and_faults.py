"""Gossip, discovery, persistent-subscription listing and fault injection (wire notes §1)."""

from __future__ import annotations

import grpc
import pytest
from esdbclient import EventStoreDBClient, StreamState
from esdbclient.exceptions import (
    GrpcError,
    NodeIsNotLeader,
    ServiceUnavailable,
)
from esdbclient.gossip import NODE_STATE_LEADER

from tests.support.esdb_emulator import EsdbEmulator

from .helpers import is_caught_up, new_event, take_until


def test_gossip_advertises_one_leader_at_the_emulator(
    esdb_faults: EsdbEmulator, client: EventStoreDBClient
) -> None:
    (member,) = client.read_gossip()
    assert member.state == NODE_STATE_LEADER
    assert (member.address, member.port) == (esdb_faults.host, esdb_faults.port)


def test_list_subscriptions_is_empty(client: EventStoreDBClient) -> None:
    assert client.list_subscriptions() == []


@pytest.mark.parametrize("uri_kind", ["cluster_uri", "discover_uri"])
def test_discovery_finds_the_emulator(
    esdb_faults: EsdbEmulator, stream_name: str, uri_kind: str
) -> None:
    client = EventStoreDBClient(getattr(esdb_faults, uri_kind))
    try:
        assert client.connection_target == esdb_faults.target
        client.append_to_stream(stream_name, current_version=StreamState.ANY, events=new_event())
        assert len(client.get_stream(stream_name)) == 1
    finally:
        client.close()


def test_unavailable_is_retried_by_the_client(
    esdb_faults: EsdbEmulator, client: EventStoreDBClient, stream_name: str
) -> None:
    # @retrygrpc around @autoreconnect: up to 4 attempts for one call.
    esdb_faults.fail_next(3, methods=["BatchAppend"])
    client.append_to_stream(stream_name, current_version=StreamState.ANY, events=[new_event()])
    assert len(client.get_stream(stream_name)) == 1
    esdb_faults.fail_next(4, methods=["Append"])
    with pytest.raises(ServiceUnavailable):
        client.append_to_stream(stream_name, current_version=StreamState.ANY, events=new_event())
    assert len(client.get_stream(stream_name)) == 1


def test_fail_next_honours_codes_and_methods(
    esdb_faults: EsdbEmulator, client: EventStoreDBClient, stream_name: str
) -> None:
    client.append_to_stream(stream_name, current_version=StreamState.ANY, events=new_event())
    esdb_faults.fail_next(1, code=grpc.StatusCode.PERMISSION_DENIED, methods=["Read"])
    client.append_to_stream(stream_name, current_version=StreamState.ANY, events=new_event())
    with pytest.raises(GrpcError):  # read_stream has no retry decorator
        list(client.read_stream(stream_name))
    assert len(client.get_stream(stream_name)) == 2
    esdb_faults.fail_next(5)
    esdb_faults.reset_faults()
    assert len(client.get_stream(stream_name)) == 2
    with pytest.raises(ValueError):
        esdb_faults.fail_next(1, methods=["Apend"])


def test_cut_subscriptions_raises_in_the_iterating_client(
    esdb_faults: EsdbEmulator, client: EventStoreDBClient, stream_name: str
) -> None:
    subscription = client.subscribe_to_stream(stream_name, include_caught_up=True)
    take_until(subscription, is_caught_up)
    assert esdb_faults.cut_subscriptions() >= 1
    with pytest.raises(ServiceUnavailable):
        next(subscription)
    # New subscriptions are unaffected.
    event = new_event()
    client.append_to_stream(stream_name, current_version=StreamState.ANY, events=event)
    with client.subscribe_to_stream(stream_name) as fresh:
        assert next(fresh).id == event.id


def test_not_leader_reaches_a_single_target_client(
    esdb_faults: EsdbEmulator, client: EventStoreDBClient, stream_name: str
) -> None:
    esdb_faults.not_leader(1, "10.0.0.9", 2113)
    with pytest.raises(NodeIsNotLeader) as raised:
        client.append_to_stream(stream_name, current_version=StreamState.ANY, events=new_event())
    assert raised.value.leader_grpc_target == "10.0.0.9:2113"
    assert client.get_current_version(stream_name) is StreamState.NO_STREAM


def test_not_leader_on_a_cluster_uri_reconnects_to_the_leader(
    esdb_faults: EsdbEmulator, stream_name: str
) -> None:
    client = EventStoreDBClient(esdb_faults.cluster_uri)
    try:
        esdb_faults.not_leader(1)  # the leader endpoint defaults to the emulator itself
        client.append_to_stream(stream_name, current_version=StreamState.ANY, events=new_event())
        assert client.connection_target == esdb_faults.target
        assert len(client.get_stream(stream_name)) == 1
    finally:
        client.close()


def test_not_leader_only_hits_calls_that_require_a_leader(
    esdb_faults: EsdbEmulator, stream_name: str
) -> None:
    # With NodePreference=follower reads send `requires-leader: false`; writes still true.
    client = EventStoreDBClient(esdb_faults.uri + "&NodePreference=follower")
    try:
        esdb_faults.not_leader(1)
        assert client.get_current_version(stream_name) is StreamState.NO_STREAM
        with pytest.raises(NodeIsNotLeader):
            client.append_to_stream(
                stream_name, current_version=StreamState.ANY, events=new_event()
            )
    finally:
        client.close()
