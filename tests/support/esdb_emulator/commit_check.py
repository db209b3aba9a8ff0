"""The server's expected-version and idempotency rules (`IndexWriter.CheckCommit`).

Transcribed rule by rule from esdb-wire-notes.md §3.1, in the same order, because clients
(and esdbclient's own test-suite) depend on the exact outcome of each edge case: e.g.
re-appending the first event of a stream with NO_STREAM returns the *original* position.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from .records import (
    DELETED_STREAM,
    EXPECTED_ANY,
    EXPECTED_NO_STREAM,
    EXPECTED_STREAM_EXISTS,
    NO_EVENTS,
    Record,
)


class Decision(enum.Enum):
    OK = "ok"  # write the events at current+1...
    IDEMPOTENT = "idempotent"  # write nothing, report the earlier write's position
    WRONG_VERSION = "wrong-expected-version"
    CORRUPTED_IDEMPOTENCY = "corrupted-idempotency"  # reported to clients as WRONG_VERSION
    STREAM_DELETED = "stream-deleted"


@dataclass(frozen=True, slots=True)
class CommitCheck:
    decision: Decision
    # For IDEMPOTENT: the record of the last event of the earlier write.
    last_record: Record | None = None

    @property
    def is_wrong_version(self) -> bool:
        return self.decision in (Decision.WRONG_VERSION, Decision.CORRUPTED_IDEMPOTENCY)


class StreamView(Protocol):
    """What the rules need to know about one stream."""

    name: str

    @property
    def current(self) -> int:
        """Last event number, NO_EVENTS, or DELETED_STREAM when tombstoned."""
        ...

    def event(self, number: int) -> Record | None: ...


def check_commit(  # noqa: C901 - the wire notes' §3.1 rules, one return each, in their order
    stream: StreamView,
    expected: int,
    event_ids: Sequence[str],
    committed: Mapping[str, Record],
    *,
    soft_deleted: bool,
    has_metadata: bool,
) -> CommitCheck:
    """Apply §3.1 rules 1-6 in order.

    `committed` maps event id -> the latest record written with that id (ids are not unique).
    `has_metadata` says whether the `$$` metastream has any events.
    """
    current = stream.current
    # Rule 1: a tombstoned stream rejects everything.
    if current == DELETED_STREAM:
        return CommitCheck(Decision.STREAM_DELETED)
    # Rule 2: StreamExists. A stream with no events but with metadata passes.
    if expected == EXPECTED_STREAM_EXISTS:
        if soft_deleted:
            return CommitCheck(Decision.STREAM_DELETED)
        if current == NO_EVENTS and not has_metadata:
            return CommitCheck(Decision.WRONG_VERSION)
    if not event_ids:
        # Nothing to write or deduplicate: only the version itself matters.
        if expected >= 0 and expected != current:
            return CommitCheck(Decision.WRONG_VERSION)
        if expected == EXPECTED_NO_STREAM and current != NO_EVENTS:
            return CommitCheck(Decision.WRONG_VERSION)
        return CommitCheck(Decision.OK)
    # Rule 3: Any / StreamExists deduplicate by event id.
    if expected in (EXPECTED_ANY, EXPECTED_STREAM_EXISTS):
        return _idempotency_by_id(stream.name, event_ids, committed)
    # Rule 4: an expected version behind the stream deduplicates by position.
    if expected < current:
        return _idempotency_by_position(stream, expected, event_ids, soft_deleted)
    # Rule 5: ahead of the stream.
    if expected > current:
        return CommitCheck(Decision.WRONG_VERSION)
    # Rule 6: exactly current. No idempotency check: the same ids may be written again.
    return CommitCheck(Decision.OK)


def _idempotency_by_id(
    stream_name: str, event_ids: Sequence[str], committed: Mapping[str, Record]
) -> CommitCheck:
    last: Record | None = None
    for i, event_id in enumerate(event_ids):
        record = committed.get(event_id)
        if record is None or record.stream != stream_name:
            if i == 0:
                return CommitCheck(Decision.OK)
            return CommitCheck(Decision.CORRUPTED_IDEMPOTENCY)
        last = record
    return CommitCheck(Decision.IDEMPOTENT, last)


def _idempotency_by_position(
    stream: StreamView, expected: int, event_ids: Sequence[str], soft_deleted: bool
) -> CommitCheck:
    last: Record | None = None
    for i, event_id in enumerate(event_ids, start=1):
        record = stream.event(expected + i)
        if record is not None and record.event_id == event_id:
            last = record
            continue
        if i > 1:
            return CommitCheck(Decision.CORRUPTED_IDEMPOTENCY)
        # First id differs: recreating a soft-deleted stream with NO_STREAM is allowed.
        if expected == EXPECTED_NO_STREAM and soft_deleted:
            return CommitCheck(Decision.OK)
        return CommitCheck(Decision.WRONG_VERSION)
    return CommitCheck(Decision.IDEMPOTENT, last)
