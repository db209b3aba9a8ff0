"""EventStoreDB gRPC wire emulator for tests (esdbclient 1.1.7 semantics).

Test support only: nothing in `terret/` may import it. Behaviour follows
/work/shared/design/esdb-wire-notes.md (the module docstrings cite its sections).

    with EsdbEmulator().start() as emulator:          # free loopback port
        client = EventStoreDBClient(emulator.uri)     # esdb://127.0.0.1:PORT?Tls=false
        EventStoreDBClient(emulator.cluster_uri)      # two targets: discovery via gossip
        emulator.fail_next(2, methods=["Append"])     # UNAVAILABLE, retried by esdbclient
        emulator.not_leader(1)                        # NotLeader naming the emulator itself
        emulator.cut_subscriptions()                  # open reads fail with UNAVAILABLE

Standalone: ``python -m tests.support.esdb_emulator --host 127.0.0.1 --port 0`` prints the
URI as its first line and serves until killed.

Emulated: the Streams service (Read, Append, BatchAppend, Delete, Tombstone, catch-up
subscriptions), Gossip.Read, and PersistentSubscriptions (Create, Update, Delete, GetInfo,
List, ReplayParked and the bidirectional Read: the DispatchToSingle, RoundRobin, Pinned and
PinnedByCorrelation strategies, ack, nack park/retry/skip/stop/unknown, message time-outs
and max retry count, max subscriber count, checkpoints, parked-message replay).

Modules: `store` (log, stream indexes, writes), `commit_check` (expected-version rules),
`reads` / `subscriptions` (Streams.Read), `streams_service` (the Streams servicer and its
error encodings), `cluster` (Gossip), `persistent_service` (the PersistentSubscriptions
servicer) over `persistent_registry` (groups, lock, clock), `persistent` (one group's state
machine), `persistent_strategies`, `persistent_source`, `persistent_streams` (checkpoint and
parked streams), `persistent_model`, `persistent_convert`; `faults`, `server`.
"""

from .server import EsdbEmulator

__all__ = ["EsdbEmulator"]
