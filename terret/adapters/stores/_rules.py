"""Expected-version and idempotency rules shared by the embedded stores.

They follow EventStoreDB's ``CheckCommit`` so that every adapter behaves the same (R7): a retry
of an append whose outcome was unknown succeeds without writing twice.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from uuid import UUID

from terret.domain.errors import PayloadTooLarge, WrongExpectedVersion
from terret.domain.store import ExpectedVersion, NewRecord, StreamState, record_size


@dataclass(frozen=True, slots=True)
class Write:
    """Write the records at ``first_seq``…"""

    first_seq: int


@dataclass(frozen=True, slots=True)
class AlreadyWritten:
    """Every record is already in the stream; ``last_seq`` is the last of them."""

    last_seq: int


Decision = Write | AlreadyWritten


def check_size(records: Sequence[NewRecord], limit: int) -> None:
    for record in records:
        size = record_size(record)
        if size > limit:
            raise PayloadTooLarge(record.wire_name, size, limit)


def decide(
    stream: str,
    records: Sequence[NewRecord],
    expected: ExpectedVersion,
    current: int,
    id_at: Callable[[int], UUID | None],
    seq_of: Callable[[UUID], int | None],
) -> Decision:
    """Decide an append. ``current`` is the stream's version (0 = no stream); ``id_at(seq)`` gives
    the event id stored at a seq; ``seq_of(id)`` the seq of an id in this stream."""
    if expected is StreamState.NO_STREAM:
        expected = 0
    if expected is StreamState.ANY:
        first = seq_of(records[0].event_id) if records else None
        if first is None:
            return Write(current + 1)
        seqs = [seq_of(r.event_id) for r in records]
        if all(s is not None for s in seqs):
            return AlreadyWritten(max(s for s in seqs if s is not None))
        raise WrongExpectedVersion(stream, "any", current)
    assert isinstance(expected, int)
    if expected == current:
        return Write(current + 1)
    if expected < current:
        matched = 0
        for offset, record in enumerate(records, start=1):
            if id_at(expected + offset) != record.event_id:
                break
            matched += 1
        if records and matched == len(records):
            return AlreadyWritten(expected + matched)
    raise WrongExpectedVersion(stream, expected, current)
