"""Plain data held by the emulator's store: log records, proposed events, stream metadata.

Numbers follow EventStoreDB's own conventions so that error texts and rules can be written
exactly as the server source states them (see /work/shared/design/esdb-wire-notes.md §3).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

# long.MaxValue: the event number of a tombstone record, and the `$tb` value of a soft delete.
DELETED_STREAM = 2**63 - 1

# ExpectedVersion values as the server encodes them (they appear verbatim in Delete/Tombstone
# error texts, e.g. "Expected version: -2").
EXPECTED_ANY = -2
EXPECTED_NO_STREAM = -1
EXPECTED_STREAM_EXISTS = -4

NO_EVENTS = -1  # a stream's "current revision" when it has no events

TICKS_PER_SECOND = 10_000_000  # .NET ticks (100 ns), the unit of the `created` read metadata

METADATA_EVENT_TYPE = "$metadata"
TOMBSTONE_EVENT_TYPE = "$streamDeleted"
METASTREAM_PREFIX = "$$"

# Real positions are byte offsets in the transaction log: strictly increasing with gaps.
# The emulator advances the position by an approximate record size so that clients never
# come to rely on positions being consecutive.
RECORD_HEADER_BYTES = 96


def now_ticks() -> int:
    return time.time_ns() // 100


def is_metastream(stream: str) -> bool:
    return stream.startswith(METASTREAM_PREFIX)


def original_stream(metastream: str) -> str:
    return metastream[len(METASTREAM_PREFIX) :]


def metastream_of(stream: str) -> str:
    return METASTREAM_PREFIX + stream


@dataclass(frozen=True, slots=True)
class ProposedEvent:
    """An event as a client proposes it in Append/BatchAppend, before it has a position."""

    event_id: str  # canonical UUID string form, which is also what reads send back
    type: str
    content_type: str
    data: bytes
    custom_metadata: bytes = b""


@dataclass(slots=True, eq=False)
class Record:
    """One record of the global log ($all). Immutable once written, except for `wire`."""

    position: int  # commit position == prepare position (single-prepare gRPC writes)
    stream: str
    number: int  # event number in `stream`; DELETED_STREAM for a tombstone
    event_id: str
    type: str
    is_json: bool
    data: bytes
    custom_metadata: bytes
    created: int  # ticks since the Unix epoch
    # Lazily built protobuf ReadResp for this record. Every reader (stream read, $all read,
    # subscription) sends the same message, so building it once keeps catch-up cheap.
    wire: Any = field(default=None, repr=False)

    @property
    def size(self) -> int:
        return (
            RECORD_HEADER_BYTES
            + len(self.stream)
            + len(self.type)
            + len(self.data)
            + len(self.custom_metadata)
        )


def json_object(data: bytes) -> dict[str, Any] | None:
    """`data` parsed as a JSON object, or None if it is not one."""
    try:
        value = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    return value if isinstance(value, dict) else None


@dataclass(frozen=True, slots=True)
class StreamMetadata:
    """Stream metadata as derived from the last event of the `$$` metastream."""

    raw: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, data: bytes) -> StreamMetadata:
        # Non-JSON or non-object metadata counts as empty, as in the server.
        return cls(json_object(data) or {})

    def _int(self, key: str) -> int | None:
        value = self.raw.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        return int(value)

    @property
    def truncate_before(self) -> int | None:
        return self._int("$tb")

    @property
    def max_count(self) -> int | None:
        value = self._int("$maxCount")
        return value if value is not None and value >= 1 else None

    @property
    def max_age_seconds(self) -> int | None:
        value = self._int("$maxAge")
        return value if value is not None and value >= 1 else None

    @property
    def soft_deleted(self) -> bool:
        return self.truncate_before == DELETED_STREAM

    def with_truncate_before(self, tb: int) -> bytes:
        return json.dumps({**self.raw, "$tb": tb}).encode("utf8")
