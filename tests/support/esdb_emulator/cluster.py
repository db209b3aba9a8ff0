"""Gossip.Read: a one-node cluster, the minimum esdbclient asks of it. (Persistent subscriptions
are ``persistent_service.py``.)"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import grpc
from esdbclient.protos.Grpc import (
    gossip_pb2,
    gossip_pb2_grpc,
    shared_pb2,
)

from .faults import FaultInjector
from .records import now_ticks
from .streams_service import guard_call


class GossipServicer(gossip_pb2_grpc.GossipServicer):
    """Advertises a one-node cluster: a single Leader at the emulator's real address.

    With one member esdbclient keeps the channel it gossiped on; the address must still be
    real because reconnects after a NotLeader go to whatever the trailers name.
    """

    def __init__(self, endpoint: Callable[[], tuple[str, int]], faults: FaultInjector) -> None:
        self._endpoint = endpoint
        self._faults = faults
        self._instance_id = str(uuid.uuid4())

    def Read(  # noqa: N802 - gRPC method name
        self, request: shared_pb2.Empty, context: grpc.ServicerContext
    ) -> gossip_pb2.ClusterInfo:
        guard_call(context, self._faults, "Gossip.Read")
        host, port = self._endpoint()
        member = gossip_pb2.MemberInfo(
            instance_id=shared_pb2.UUID(string=self._instance_id),
            time_stamp=now_ticks(),
            state=gossip_pb2.MemberInfo.VNodeState.Leader,
            is_alive=True,
            http_end_point=gossip_pb2.EndPoint(address=host, port=port),
        )
        return gossip_pb2.ClusterInfo(members=[member])
