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

Modules: `store` (log, stream indexes, writes), `commit_check` (expected-version rules),
`reads` / `subscriptions` (Streams.Read), `streams_service` (the Streams servicer and its
error encodings), `cluster` (Gossip, PersistentSubscriptions.List), `faults`, `server`.
"""

from .server import EsdbEmulator

__all__ = ["EsdbEmulator"]
