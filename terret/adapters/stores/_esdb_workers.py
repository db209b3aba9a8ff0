"""The EventStoreDB worker registry (see ``workers``): beats appended to one capped stream,
through the store's connection."""

from __future__ import annotations

import time
from collections.abc import Sequence

from esdbclient import NewEvent, RecordedEvent, StreamState

from terret.adapters.stores._esdb import WORKER_EVENT_TYPE
from terret.adapters.stores._esdb_connection import EsdbConnection, Refused
from terret.adapters.stores.workers import LEFT
from terret.domain.errors import StoreError
from terret.domain.workers import WorkerBeat, WorkerRegistry

WORKERS_STREAM = "terret-workers"
WORKERS_MAX_COUNT = 1024
"""Beats kept: a crashed worker's last beat must outlive its TTL while the others beat (five
per TTL each) and claim (a beat each): 1,024 covers 50 workers claiming 50 sessions a second at
the default TTL."""


class EsdbWorkers(WorkerRegistry):
    """Beats appended to one capped stream; the latest beat of each worker is found by reading
    the stream backwards (at most ``WORKERS_MAX_COUNT`` events)."""

    def __init__(self, connection: EsdbConnection) -> None:
        self.connection = connection
        self._capped = False

    def beat(self, beat: WorkerBeat) -> None:
        self._append(beat)

    def leave(self, worker: str) -> None:
        gone = WorkerBeat(worker=worker, host="", pid=0, started=0.0, at=time.time(), ttl=LEFT)
        self._append(gone)

    def _append(self, beat: WorkerBeat) -> None:
        if not self._capped:
            self.connection.update_metadata(WORKERS_STREAM, {"$maxCount": WORKERS_MAX_COUNT})
            self._capped = True
        event = NewEvent(type=WORKER_EVENT_TYPE, data=beat.to_json(),
                         content_type="application/json")
        try:
            self.connection.call(f"beat {beat.worker}", "append_to_stream", WORKERS_STREAM,
                                 current_version=StreamState.ANY, events=[event])
        except Refused as refused:
            raise StoreError(f"{WORKERS_STREAM}: beat {beat.worker} refused: {refused}") \
                from None

    def _read(self) -> Sequence[RecordedEvent]:
        try:
            events: Sequence[RecordedEvent] = self.connection.call(
                f"read {WORKERS_STREAM}", "get_stream", WORKERS_STREAM, backwards=True,
                limit=WORKERS_MAX_COUNT)
        except Refused as refused:
            if refused.kind != "missing":
                raise StoreError(f"{WORKERS_STREAM}: read refused: {refused}") from None
            return ()
        return events

    def beats(self) -> list[WorkerBeat]:
        latest: dict[str, WorkerBeat] = {}
        for event in self._read():  # newest first: the first beat of a worker is its latest
            try:
                beat = WorkerBeat.from_json(event.data)
            except (ValueError, KeyError, TypeError):
                continue
            latest.setdefault(beat.worker, beat)
        return sorted((b for b in latest.values() if b.ttl != LEFT), key=lambda b: b.worker)

    def latest(self, worker: str) -> WorkerBeat | None:
        return next((b for b in self.beats() if b.worker == worker), None)
