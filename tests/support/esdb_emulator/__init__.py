"""EventStoreDB gRPC wire emulator for tests (esdbclient 1.1.7 semantics).

Test support only: nothing in `terret/` may import it. Behaviour follows
/work/shared/design/esdb-wire-notes.md; see `EsdbEmulator` for the public API and
`python -m tests.support.esdb_emulator --help` for the standalone server.
"""

from .server import EsdbEmulator

__all__ = ["EsdbEmulator"]
