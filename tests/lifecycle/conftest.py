"""The lifecycle lane runs on the same stores as the runtime suite (SQLite, and EventStoreDB via
the emulator or ``TERRET_ESDB_URI``)."""

from tests.runtime.conftest import opened, store  # noqa: F401 - fixtures
