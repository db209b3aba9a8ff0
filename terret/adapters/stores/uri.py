"""Open a store from a URI: ``sqlite:///path/terret.db`` (or a bare path), ``memory:``,
``esdb://…`` / ``esdb+discover://…`` (EventStoreDB)."""

from __future__ import annotations

import re

from terret.domain.errors import InvalidStoreURI
from terret.domain.store import EventStore


def mask_credentials(uri: str) -> str:
    """Replace ``user:password@`` in a URI with ``***@`` so it can be logged or shown."""
    return re.sub(r"(?<=://)[^/@]*@", "***@", uri)


def open_store(uri: str) -> EventStore:
    if uri.startswith(("esdb://", "esdb+discover://")):
        from terret.adapters.stores.eventstoredb import EventStoreDBStore

        return EventStoreDBStore(uri)
    if uri in ("memory:", "memory://"):
        from terret.adapters.stores.memory import MemoryStore

        return MemoryStore()
    if uri.startswith("sqlite://"):
        path = uri[len("sqlite://") :] or "terret.db"
    elif "://" in uri or uri.startswith("esdb:"):
        raise InvalidStoreURI(
            f"unsupported store URI {mask_credentials(uri)!r}: "
            "use a SQLite path, sqlite:///path, memory:, esdb:// or esdb+discover://"
        )
    else:
        path = uri
    from terret.adapters.stores.sqlite import SQLiteStore

    return SQLiteStore(path)
