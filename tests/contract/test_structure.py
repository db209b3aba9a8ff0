"""The shape of the persistence code (issue 12): no import cycle through the stores or the
projections (imports inside functions included), one retry policy for the stores and the model
providers, and the EventStoreDB subscription and worker registry working through the
connection, never through the store."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from terret.adapters.providers.config import RetryConfig
from terret.adapters.providers.retry import policy_for
from terret.adapters.retry import RetryPolicy
from terret.adapters.stores._esdb_connection import EsdbConnection
from terret.adapters.stores.eventstoredb import EventStoreDBStore

ROOT = Path(__file__).resolve().parents[2] / "terret"
OURS = ("terret.adapters.stores", "terret.adapters.retry", "terret.projections",
        "terret.domain.store", "terret.testing")


def _module_of(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    modules = {_module_of(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found: set[str] = set()
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1]
                                    + ([base] if base else []))
                found.add(base)
                found.update(f"{base}.{alias.name}" for alias in node.names)
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def _cycle_through(graph: dict[str, set[str]], start: str) -> list[str] | None:
    stack = [(start, [start])]
    seen: set[str] = set()
    while stack:
        node, path = stack.pop()
        for nxt in graph.get(node, ()):
            if nxt == start:
                return [*path, start]
            if nxt not in seen:
                seen.add(nxt)
                stack.append((nxt, [*path, nxt]))
    return None


def test_no_import_cycle_runs_through_the_stores_or_the_projections() -> None:
    graph = _imports()
    # a package imports its own submodules lazily (PEP 562): not a cycle of the code
    for name in list(graph):
        graph[name] = {m for m in graph[name] if not m.startswith(f"{name}.")}
    cycles = [cycle for name in sorted(graph) if name.startswith(OURS)
              if (cycle := _cycle_through(graph, name)) is not None]
    assert cycles == []


def test_one_retry_policy_for_the_stores_and_the_providers() -> None:
    store = EventStoreDBStore("esdb://localhost:2113?Tls=false", retry_timeout=3.0)
    try:
        assert type(store.retry) is RetryPolicy
        assert store.retry.timeout == 3.0
    finally:
        store.close()
    provider = policy_for(RetryConfig(max_retries=2))
    assert type(provider) is RetryPolicy and provider.max_retries == 2


@pytest.mark.parametrize("module", ["_esdb_subscription", "_esdb_workers", "_esdb"])
def test_the_esdb_parts_beside_the_store_never_reach_into_it(module: str) -> None:
    source = (ROOT / "adapters" / "stores" / f"{module}.py").read_text(encoding="utf-8")
    assert "eventstoredb" not in {
        alias.name.rpartition(".")[2] for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ImportFrom) for alias in node.names} | {
        (node.module or "").rpartition(".")[2] for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ImportFrom)}
    assert "store._" not in source


def test_the_store_its_subscriptions_and_its_workers_share_one_connection() -> None:
    store = EventStoreDBStore("esdb://localhost:2113?Tls=false")
    try:
        assert isinstance(store.connection, EsdbConnection)
        assert store.log.connection is store.connection
        assert store.workers().connection is store.connection  # type: ignore[attr-defined]
        sub = store.open_subscription(after=0)
        assert sub._connection is store.connection  # type: ignore[attr-defined]
        sub.stop()
    finally:
        store.close()
