"""Open a store from a URI: ``sqlite:///path/terret.db`` (or a bare path), ``memory:``,
``esdb://…`` / ``esdb+discover://…`` (EventStoreDB).

The one place that parses store URIs (``store_kind``, ``sqlite_path``) and masks their
credentials (``mask_credentials``): the adapters and the CLI call these.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from terret.domain.errors import InvalidStoreURI
from terret.domain.store import EventStore

StoreKind = Literal["sqlite", "memory", "eventstoredb"]

DEFAULT_SQLITE_PATH = "terret.db"
"""The file a bare ``sqlite://`` names."""

_ESDB_PREFIXES = ("esdb://", "esdb+discover://")
_MEMORY_URIS = ("memory:", "memory://")
_SQLITE_PREFIX = "sqlite://"


# --- credentials ------------------------------------------------------------------------------

_QUERY_START = re.compile(r"\?[A-Za-z]+=")
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")


def userinfo_bounds(uri: str) -> tuple[int, int] | None:
    """Where ``user:password`` sits in a URI: from after ``://`` (or a bare ``scheme:``) to the
    ``@`` that ends it.

    That ``@`` is the *last* one before the query string, not the first one, and not the first
    one after a ``/`` or ``?``: a password may contain ``@``, ``/``, ``?`` or ``:`` even though
    it should be percent-encoded, and a mask must not leak its tail."""
    start = uri.find("://")
    if start >= 0:
        start += 3
    else:  # "scheme:user:pass@host", a mistyped URI an error message will show
        scheme = _SCHEME.match(uri)
        if scheme is None:
            return None
        start = scheme.end()
    at = uri.rfind("@")
    # An "@" inside the query (e.g. in a TlsCaFile path) does not end the user-info.
    while at >= start:
        query = _QUERY_START.search(uri, start, at)
        if query is None:
            return start, at
        at = uri.rfind("@", start, query.start())
    return None


def mask_credentials(uri: str) -> str:
    """The URI with its user-info replaced by ``***``, so it can be logged or shown:
    ``esdb://user:pass@host:2113?Tls=true`` → ``esdb://***@host:2113?Tls=true``."""
    bounds = userinfo_bounds(uri)
    if bounds is None:
        return uri
    start, at = bounds
    return uri[:start] + "***" + uri[at:]


# --- parsing ----------------------------------------------------------------------------------


def store_kind(uri: str) -> StoreKind:
    """Which adapter a store URI names; ``InvalidStoreURI`` (credentials masked) if none."""
    if uri.startswith(_ESDB_PREFIXES):
        return "eventstoredb"
    if uri in _MEMORY_URIS:
        return "memory"
    if uri.startswith(_SQLITE_PREFIX):
        return "sqlite"
    if "://" in uri or uri.startswith(("esdb:", "esdb+discover:")):
        raise InvalidStoreURI(
            f"unsupported store URI {mask_credentials(uri)!r}: "
            "use a SQLite path, sqlite:///path, memory:, esdb:// or esdb+discover://"
        )
    return "sqlite"  # a bare path


def sqlite_path(uri: str) -> str | None:
    """The SQLite file a store URI names (a bare path, ``sqlite://path``, or
    ``DEFAULT_SQLITE_PATH`` for a bare ``sqlite://``); None for the other stores.
    Raises ``InvalidStoreURI`` as ``store_kind`` does."""
    if store_kind(uri) != "sqlite":
        return None
    return uri.removeprefix(_SQLITE_PREFIX) or DEFAULT_SQLITE_PATH


def open_store(
    uri: str, *, retry_timeout: float | None = None, call_timeout: float | None = None
) -> EventStore:
    """The store ``uri`` names. ``retry_timeout`` / ``call_timeout`` (None: the adapter's
    defaults) bound EventStoreDB's retries of an unreachable server; the embedded stores do
    not retry and ignore them."""
    kind = store_kind(uri)
    if kind == "eventstoredb":
        from terret.adapters.stores.eventstoredb import EventStoreDBStore

        options: dict[str, Any] = {}
        if retry_timeout is not None:
            options["retry_timeout"] = retry_timeout
        if call_timeout is not None:
            options["call_timeout"] = call_timeout
        return EventStoreDBStore(uri, **options)
    if kind == "memory":
        from terret.adapters.stores.memory import MemoryStore

        return MemoryStore()
    path = sqlite_path(uri)
    assert path is not None
    from terret.adapters.stores.sqlite import SQLiteStore

    return SQLiteStore(path)
