"""Store adapters. ``open_store(uri)`` picks one from a URI.

Names are imported on first use (PEP 562): importing the package costs nothing."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from terret.adapters.stores.memory import MemoryStore
    from terret.adapters.stores.sqlite import SQLiteStore
    from terret.adapters.stores.uri import open_store

_LAZY: dict[str, str] = {
    "MemoryStore": "terret.adapters.stores.memory:MemoryStore",
    "SQLiteStore": "terret.adapters.stores.sqlite:SQLiteStore",
    "open_store": "terret.adapters.stores.uri:open_store",
}
"""Each public name and where it lives: ``module:attribute``, or a submodule."""

__all__ = ["MemoryStore", "SQLiteStore", "open_store"]


def __getattr__(name: str) -> Any:
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, _, attr = target.partition(":")
    value = importlib.import_module(module)
    if attr:
        value = getattr(value, attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
