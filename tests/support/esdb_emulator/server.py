"""EsdbEmulator: the public face of the wire emulator (server lifecycle + fault injection)."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType
from typing import Any

import grpc
from esdbclient.protos.Grpc import gossip_pb2_grpc, persistent_pb2_grpc, streams_pb2_grpc

from .cluster import GossipServicer
from .faults import FaultInjector, OpenCalls
from .persistent_registry import PersistentRegistry
from .persistent_service import PersistentSubscriptionsServicer
from .records import ProposedEvent
from .store import EventStore
from .streams_service import DEFAULT_MAX_APPEND_SIZE, StreamsServicer

# Every open subscription holds a worker thread of the sync server, and tests leave several
# open until garbage collection, so the pool is generous.
DEFAULT_MAX_WORKERS = 256
WILDCARD_HOSTS = {"", "0.0.0.0", "::", "[::]"}


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class EsdbEmulator:
    """An in-process EventStoreDB (gRPC, insecure) for esdbclient 1.1.7.

    Usage: ``with EsdbEmulator().start() as emulator: EventStoreDBClient(emulator.uri)``.
    """

    def __init__(
        self,
        *,
        max_workers: int = DEFAULT_MAX_WORKERS,
        max_append_size: int = DEFAULT_MAX_APPEND_SIZE,
    ) -> None:
        self._max_workers = max_workers
        self._max_append_size = max_append_size
        self._store = EventStore()
        self._store.seed_system_event()
        self._faults = FaultInjector()
        self._calls = OpenCalls()
        self._persistent = PersistentRegistry(self._store)
        self._server: grpc.Server | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._host = ""
        self._port = 0

    # -- lifecycle -------------------------------------------------------------------------

    def start(self, host: str = "127.0.0.1", port: int = 0) -> EsdbEmulator:
        """Serve on host:port (port 0 picks a free port). Returns self."""
        if self._server is not None:
            raise RuntimeError("EsdbEmulator already started")
        executor = ThreadPoolExecutor(
            max_workers=self._max_workers, thread_name_prefix="esdb-emulator"
        )
        # so_reuseport=0: a fixed port already in use must fail rather than be shared.
        server = grpc.server(executor, options=[("grpc.so_reuseport", 0)])
        streams_pb2_grpc.add_StreamsServicer_to_server(
            StreamsServicer(self._store, self._faults, self._calls, self._max_append_size),
            server,
        )
        gossip_pb2_grpc.add_GossipServicer_to_server(
            GossipServicer(lambda: (self.host, self.port), self._faults), server
        )
        persistent_pb2_grpc.add_PersistentSubscriptionsServicer_to_server(
            PersistentSubscriptionsServicer(self._persistent, self._faults, self._calls),
            server,
        )
        bound_port = server.add_insecure_port(_host_port(host, port))
        if bound_port == 0:
            executor.shutdown(wait=False)
            raise RuntimeError(f"EsdbEmulator could not bind {_host_port(host, port)}")
        server.start()
        self._server, self._executor = server, executor
        # Clients must be told an address they can dial, not a wildcard bind address.
        self._host = "127.0.0.1" if host in WILDCARD_HOSTS else host
        self._port = bound_port
        return self

    def stop(self, grace: float | None = None) -> None:
        """Stop serving; open calls are cancelled (clients see CANCELLED/UNAVAILABLE)."""
        server, self._server = self._server, None
        if server is not None:
            server.stop(grace).wait()
        self._persistent.close()
        self._store.wake_waiters()
        if self._executor is not None:
            self._executor.shutdown(wait=False)
            self._executor = None

    @property
    def is_running(self) -> bool:
        return self._server is not None

    def __enter__(self) -> EsdbEmulator:
        return self if self.is_running else self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- addresses ---------------------------------------------------------------------------

    @property
    def host(self) -> str:
        return self._host

    @property
    def port(self) -> int:
        return self._port

    @property
    def target(self) -> str:
        return _host_port(self._host, self._port)

    @property
    def uri(self) -> str:
        """Single-node URI: esdbclient connects directly, without gossip."""
        return f"esdb://{self.target}?Tls=false"

    @property
    def cluster_uri(self) -> str:
        """Two targets (both this emulator): esdbclient discovers the leader via gossip, and
        a NotLeader reply makes it reconnect to the named leader and retry."""
        return f"esdb://{self.target},{self.target}?Tls=false"

    @property
    def discover_uri(self) -> str:
        """`esdb+discover://` form of the cluster URI (gossip with round-robin channel)."""
        return f"esdb+discover://{self.target}?Tls=false"

    # -- fault injection -----------------------------------------------------------------------

    def fail_next(
        self,
        n: int,
        code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE,
        methods: Iterable[str] | None = None,
    ) -> None:
        """The next n calls (of `methods`, e.g. "Append", "BatchAppend", "Read", "Delete",
        "Tombstone", "List", "Gossip"; default all) abort with `code`."""
        self._faults.fail_next(n, code, methods)

    def not_leader(
        self,
        n: int,
        host: str | None = None,
        port: int | None = None,
        methods: Iterable[str] | None = None,
    ) -> None:
        """The next n calls sent with `requires-leader: true` answer NOT_FOUND "Leader info
        available" naming host:port as leader (default: this emulator, so that
        esdbclient's reconnect-to-leader-and-retry succeeds)."""
        self._faults.not_leader(
            n,
            self._host if host is None else host,
            self._port if port is None else port,
            methods,
        )

    def cut_subscriptions(self) -> int:
        """Abort every open Read call (catch-up and persistent subscriptions included) with
        UNAVAILABLE now. Returns how many calls were cut. New calls are unaffected."""
        count = self._calls.cut_all()
        self._store.wake_waiters()
        self._persistent.wake()
        return count

    def reset_faults(self) -> None:
        """Forget pending fail_next/not_leader rules."""
        self._faults.reset()

    def traces(self) -> list[set[str]]:
        """For each `$all` subscription served so far, the streams of the events sent to it:
        what a reader received (a pool member must receive its own sessions' only)."""
        return self._store.copy_traces()

    @property
    def open_reads(self) -> int:
        """Read calls (subscriptions included) currently being served."""
        return len(self._calls)

    # -- data ------------------------------------------------------------------------------------

    def append_raw(self, stream: str, events: Iterable[Any]) -> int | None:
        """Append in-process, at the end of `stream`, without version checks (bulk seeding).

        `events` are esdbclient `NewEvent`s or anything with `type` and `data` (optional
        `metadata`, `content_type`, `id`). Returns the last commit position (None if empty).
        """
        return self._store.append_unchecked(stream, (_proposed(e) for e in events))

    @property
    def event_count(self) -> int:
        """Records in $all, including the emulator's seeded system event."""
        return self._store.event_count

    @property
    def store(self) -> EventStore:
        return self._store


def _proposed(event: Any) -> ProposedEvent:
    if isinstance(event, ProposedEvent):
        return event
    return ProposedEvent(
        event_id=str(getattr(event, "id", None) or uuid.uuid4()),
        type=event.type,
        content_type=getattr(event, "content_type", "application/json"),
        data=event.data,
        custom_metadata=getattr(event, "metadata", b"") or b"",
    )
