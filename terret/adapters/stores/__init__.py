"""Store adapters. ``open_store(uri)`` picks one from a URI."""

from terret.adapters.stores.memory import MemoryStore
from terret.adapters.stores.sqlite import SQLiteStore
from terret.adapters.stores.uri import open_store

__all__ = ["MemoryStore", "SQLiteStore", "open_store"]
