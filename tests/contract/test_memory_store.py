"""The store contract on the in-memory store (cross-process cases do not apply)."""

from __future__ import annotations

from terret.adapters.stores.memory import MemoryStore
from terret.domain.store import EventStore
from terret.testing.store_contract import StoreContract


class TestMemoryStore(StoreContract):
    def create_store(self) -> EventStore:
        return MemoryStore()

    def create_store_with_slow_poll(self) -> EventStore:
        return MemoryStore(poll_interval=5.0)

    def test_each_memory_store_is_a_store_of_its_own(self) -> None:
        assert MemoryStore().store_id() != MemoryStore().store_id()
