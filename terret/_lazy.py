"""Lazy package exports: a package names its public objects in a table of ``module:attribute``
(or a bare module) and imports each on first use, so ``import terret`` — and every CLI command
that needs only a little of it — pays for what it uses (PEP 562)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(namespace: dict[str, Any], table: Mapping[str, str]
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of a package whose globals are ``namespace``."""
    package = namespace["__name__"]

    def __getattr__(name: str) -> Any:
        target = table.get(name)
        if target is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, _, attr = target.partition(":")
        value = importlib.import_module(module)
        if attr:
            value = getattr(value, attr)
        namespace[name] = value  # the next lookup is an ordinary global
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(table))

    return __getattr__, __dir__
