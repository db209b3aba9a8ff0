"""A group's own streams in the store: `$persistentsubscription-<key>-checkpoint` and `-parked`.

They are real streams, as on the server (PersistentSubscriptionCheckpointWriter and
PersistentSubscriptionMessageParker), so clients can read them:
* a checkpoint is a `$SubscriptionCheckpoint` event whose data is the position text as a
  JSON string; the stream's metadata keeps the last two ($maxCount 2);
* a parked message is a `$>` link (`<event number>@<stream>`) with metadata naming the
  reason; replaying moves the parked stream's `$tb` past what was replayed, which is also
  how the parked-message count goes down.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime

from .convert import JSON, OCTET_STREAM
from .persistent_model import (
    CHECKPOINT_EVENT_TYPE,
    LINK_EVENT_TYPE,
    Message,
    checkpoint_stream,
    parked_stream,
)
from .records import EXPECTED_ANY, METADATA_EVENT_TYPE, ProposedEvent, Record, metastream_of
from .store import EventStore

CHECKPOINT_STREAM_METADATA = {"$maxCount": 2}


def _event(event_type: str, data: bytes, *, is_json: bool, metadata: bytes = b"") -> ProposedEvent:
    content_type = JSON if is_json else OCTET_STREAM
    return ProposedEvent(str(uuid.uuid4()), event_type, content_type, data, metadata)


def _json(value: object) -> bytes:
    return json.dumps(value).encode("utf8")


class GroupStreams:
    def __init__(self, store: EventStore, key: str) -> None:
        self._store = store
        self.parked = parked_stream(key)
        self.checkpoint = checkpoint_stream(key)
        self._checkpoint_configured = False

    def write_checkpoint(self, position_text: str) -> None:
        if not self._checkpoint_configured:
            self._store.append(
                metastream_of(self.checkpoint),
                EXPECTED_ANY,
                [_event(METADATA_EVENT_TYPE, _json(CHECKPOINT_STREAM_METADATA), is_json=True)],
            )
            self._checkpoint_configured = True
        self._store.append(
            self.checkpoint,
            EXPECTED_ANY,
            [_event(CHECKPOINT_EVENT_TYPE, _json(position_text), is_json=True)],
        )

    def park(self, message: Message, reason: str) -> None:
        target = message.record
        metadata = {
            "Added": datetime.now(UTC).isoformat(),
            "Reason": reason,
            "SubscriptionEventNumber": message.original.number,
        }
        link = _event(
            LINK_EVENT_TYPE,
            f"{target.number}@{target.stream}".encode(),
            is_json=False,
            metadata=_json(metadata),
        )
        self._store.append(self.parked, EXPECTED_ANY, [link])

    def parked_count(self) -> int:
        snapshot = self._store.stream_snapshot(self.parked)
        if not snapshot.found:
            return 0
        return max(0, snapshot.last - snapshot.floor + 1)

    def parked_links(self, stop_at: int | None) -> tuple[list[Record], int | None]:
        """The parked links to replay (below event number `stop_at`, if given) and the
        event number the parked stream is to be truncated before afterwards."""
        snapshot = self._store.stream_snapshot(self.parked)
        if not snapshot.found:
            return [], None
        end = snapshot.last + 1 if stop_at is None else min(stop_at, snapshot.last + 1)
        if end <= snapshot.floor:
            return [], None
        return [snapshot.records[n] for n in range(snapshot.floor, end)], end

    def mark_replayed(self, end: int) -> None:
        self._store.append(
            metastream_of(self.parked),
            EXPECTED_ANY,
            [_event(METADATA_EVENT_TYPE, _json({"$tb": end}), is_json=True)],
        )

    def delete(self) -> None:
        """Soft-delete both streams (a group created again with the name starts afresh)."""
        for stream in (self.parked, self.checkpoint):
            self._store.delete(stream, EXPECTED_ANY)
