"""Shared fixtures. The EventStoreDB fixtures start the wire emulator on a free loopback port,
or use the real server named by ``TERRET_ESDB_URI``."""

pytest_plugins = ["tests.support.esdb_fixtures"]
