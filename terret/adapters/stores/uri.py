"""Open a store from a URI: ``sqlite:///path/terret.db`` (or a bare path), ``memory:``,
``esdb://…`` / ``esdb+discover://…`` (EventStoreDB).

The adapter is chosen by the URI's scheme (``ADAPTERS``) and its module imported only then, so
opening a SQLite store never loads the EventStoreDB client. The parsing and masking of store
URIs (``store_kind``, ``sqlite_path``, ``check_esdb_uri``, ``mask_credentials``,
``secret_uri``) live in ``_uri`` and are re-exported here: the adapters and the CLI call these.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from terret.adapters.stores._uri import (
    DEFAULT_SQLITE_PATH,
    StoreKind,
    check_esdb_uri,
    credentials,
    mask_credentials,
    secret_uri,
    sqlite_path,
    store_kind,
    userinfo_bounds,
)

if TYPE_CHECKING:  # the port imports the eventsourcing library: only for the adapter opened
    from terret.domain.store import EventStore

__all__ = [
    "ADAPTERS",
    "DEFAULT_SQLITE_PATH",
    "StoreKind",
    "check_esdb_uri",
    "credentials",
    "mask_credentials",
    "open_store",
    "secret_uri",
    "sqlite_path",
    "store_kind",
    "userinfo_bounds",
]

ADAPTERS: dict[StoreKind, str] = {
    "sqlite": "terret.adapters.stores.sqlite:SQLiteStore",
    "memory": "terret.adapters.stores.memory:MemoryStore",
    "eventstoredb": "terret.adapters.stores.eventstoredb:EventStoreDBStore",
}
"""The adapter class of each kind of store URI, as ``module:class``."""


def adapter(kind: StoreKind) -> type[EventStore]:
    module, _, name = ADAPTERS[kind].partition(":")
    found: type[EventStore] = getattr(importlib.import_module(module), name)
    return found


def open_store(
    uri: str, *, retry_timeout: float | None = None, call_timeout: float | None = None
) -> EventStore:
    """The store ``uri`` names. ``retry_timeout`` / ``call_timeout`` (None: the adapter's
    defaults) bound EventStoreDB's retries of an unreachable server; the embedded stores do
    not retry and ignore them."""
    kind = store_kind(uri)
    cls: Any = adapter(kind)
    if kind == "eventstoredb":
        options: dict[str, Any] = {}
        if retry_timeout is not None:
            options["retry_timeout"] = retry_timeout
        if call_timeout is not None:
            options["call_timeout"] = call_timeout
        return cls(uri, **options)  # type: ignore[no-any-return]
    if kind == "memory":
        return cls()  # type: ignore[no-any-return]
    path = sqlite_path(uri)
    assert path is not None
    return cls(path)  # type: ignore[no-any-return]
