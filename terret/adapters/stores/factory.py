"""Terret's stores under an ``eventsourcing`` application: the library's infrastructure factory.

Set ``PERSISTENCE_MODULE=terret.adapters.stores.factory`` and ``TERRET_STORE`` to a store URI
(a SQLite path, ``memory:``, ``esdb://…``) in an ``Application``'s environment (prefixed with the
application's name, or not, as the library reads it): its events are recorded by the store
``open_store`` opens, which is an ``ApplicationRecorder`` with a working ``subscribe`` (live:
an append in this process wakes it at once, SQLite notices other processes by polling,
EventStoreDB pushes). Tracking recorders — the views of the library's ``ProjectionRunner`` —
are ``ViewStore`` subclasses in the SQLite file ``TERRET_VIEWS`` (default: in memory);
snapshots (``IS_SNAPSHOTTING_ENABLED``) go to the store's own snapshots.

The library's process recorders (events and tracking in one transaction) are not provided:
``process_recorder`` raises ``NotImplementedError`` (see docs/extending.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from uuid import UUID

from eventsourcing.persistence import (
    AggregateRecorder,
    InfrastructureFactory,
    InfrastructureFactoryError,
    ProcessRecorder,
    StoredEvent,
    TrackingRecorder,
)
from eventsourcing.utils import Environment

from terret.adapters.stores.uri import open_store
from terret.domain.store import EventStore
from terret.projections.base import ViewStore

__all__ = ["SnapshotRecorder", "TerretFactory"]


class TerretFactory(InfrastructureFactory[TrackingRecorder]):
    TERRET_STORE = "TERRET_STORE"
    TERRET_VIEWS = "TERRET_VIEWS"

    def __init__(self, env: Environment) -> None:
        super().__init__(env)
        uri = self.env.get(self.TERRET_STORE)
        if not uri:
            keys = ", ".join(self.env.create_keys(self.TERRET_STORE))
            raise InfrastructureFactoryError(f"set {keys} to a Terret store URI")
        self.uri: str = uri
        self._store: EventStore | None = None
        self._views: list[ViewStore] = []

    def store(self) -> EventStore:
        """The store this factory's recorders are (opened once)."""
        if self._store is None:
            self._store = open_store(self.uri)
        return self._store

    def aggregate_recorder(self, purpose: str = "events") -> AggregateRecorder:
        if purpose == "snapshots":
            return SnapshotRecorder(self.store())
        return self.store()

    def application_recorder(self) -> EventStore:
        return self.store()

    def tracking_recorder(self, tracking_recorder_class: type[TrackingRecorder] | None = None
                          ) -> TrackingRecorder:
        cls = tracking_recorder_class or ViewStore
        if not issubclass(cls, ViewStore):
            raise InfrastructureFactoryError(
                f"{cls.__name__} is no ViewStore: Terret's tracking recorders are views in its "
                "view store (subclass terret.projections.ViewStore)")
        views = cls(self.env.get(self.TERRET_VIEWS) or ":memory:")
        self._views.append(views)
        return views

    def process_recorder(self) -> ProcessRecorder:
        raise NotImplementedError("Terret's stores record no tracking with events")

    def close(self) -> None:
        for views in self._views:
            views.close()
        self._views.clear()
        if self._store is not None:
            self._store.close()
            self._store = None


class SnapshotRecorder(AggregateRecorder):
    """Snapshots of an application's aggregates in the store's snapshots (the latest one per
    aggregate: an older one is never written over a newer one)."""

    def __init__(self, store: EventStore) -> None:
        self.store = store

    def insert_events(self, stored_events: Sequence[StoredEvent], **kwargs: Any) -> None:
        for snapshot in stored_events:
            self.store.write_snapshot(str(snapshot.originator_id), snapshot.originator_version,
                                      snapshot.topic.encode() + b"\n" + snapshot.state)

    def select_events(self, originator_id: UUID | str, *, gt: int | None = None,
                      lte: int | None = None, desc: bool = False, limit: int | None = None
                      ) -> list[StoredEvent]:
        found = self.store.read_snapshot(str(originator_id))
        if found is None or limit == 0:
            return []
        version, data = found
        if (gt is not None and version <= gt) or (lte is not None and version > lte):
            return []
        topic, _, state = data.partition(b"\n")
        return [StoredEvent(originator_id, version, topic.decode(), state)]
