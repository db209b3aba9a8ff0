"""Store adapters. ``open_store(uri)`` picks one from a URI.

Names are imported on first use (PEP 562): importing the package costs nothing, and
``EventStoreDBStore`` loads esdbclient and gRPC only when it is used."""

from __future__ import annotations

from typing import TYPE_CHECKING

from terret._lazy import lazy_exports

if TYPE_CHECKING:
    from terret.adapters.stores.eventstoredb import EventStoreDBStore
    from terret.adapters.stores.memory import MemoryStore
    from terret.adapters.stores.sqlite import SQLiteStore
    from terret.adapters.stores.uri import open_store

_LAZY: dict[str, str] = {
    "EventStoreDBStore": "terret.adapters.stores.eventstoredb:EventStoreDBStore",
    "MemoryStore": "terret.adapters.stores.memory:MemoryStore",
    "SQLiteStore": "terret.adapters.stores.sqlite:SQLiteStore",
    "open_store": "terret.adapters.stores.uri:open_store",
}
"""Each public name and where it lives: ``module:attribute``, or a submodule."""

__all__ = ["EventStoreDBStore", "MemoryStore", "SQLiteStore", "open_store"]


__getattr__, __dir__ = lazy_exports(globals(), _LAZY)
