"""What a persistent subscription group reads: one stream, or $all with an optional filter.

A source is read through a cursor (an event number for a stream, an index into the global
log for $all) over the store's append-only lists, so new appends are seen without copying.
Unlike catch-up subscriptions, a persistent subscription's start is inclusive: from
revision N (or position P) the event at N (at P) is delivered.
"""

from __future__ import annotations

from dataclasses import dataclass

from .persistent_model import ALL_STREAM, LINK_EVENT_TYPE, GroupError
from .reads import End, EventFilter, Origin, Start, resolve_link
from .records import Record, is_metastream, original_stream
from .store import EventStore

# The server's "default $all filter" keeps a group's own bookkeeping out of $all groups.
HIDDEN_ALL_STREAM_PREFIX = "$persistentsubscription-$all::"
HIDDEN_ALL_STREAM_SUFFIXES = ("-checkpoint", "-parked")
EPOCH_STREAM = "$epoch-information"


@dataclass(frozen=True, slots=True)
class SourceItem:
    """One record read from a source."""

    record: Record  # as delivered (the link target when a link was resolved)
    link: Record | None
    position: int  # the source position of the original record
    matches: bool  # False: filtered out (it still counts towards checkpoints)
    visible: bool = True  # False: hidden from $all groups (not even counted)


def _resolved(
    store: EventStore, record: Record, resolve_links: bool
) -> tuple[Record, Record | None]:
    if resolve_links and record.type == LINK_EVENT_TYPE:
        target = resolve_link(store, record)
        if target is not None:
            return target, record
    return record, None


class StreamSource:
    """Events of one stream; positions are event numbers."""

    is_all = False
    event_filter: EventFilter | None = None

    def __init__(self, stream: str) -> None:
        self.name = stream

    def start_cursor(self, store: EventStore, origin: Origin) -> int:
        records, _ = store.stream_progress(self.name)
        if origin is End:
            return len(records)
        first = 0 if origin is Start else origin
        assert isinstance(first, int)
        # Reads honour $tb / $maxCount, so truncated events are never delivered.
        return max(first, store.stream_start_floor(self.name))

    def cursor_after(self, store: EventStore, position: int) -> int:
        return max(position + 1, store.stream_start_floor(self.name))

    def at_end(self, store: EventStore, cursor: int) -> bool:
        records, tombstoned = store.stream_progress(self.name)
        return tombstoned or cursor >= len(records)

    def read(self, store: EventStore, cursor: int, resolve_links: bool) -> SourceItem | None:
        records, tombstoned = store.stream_progress(self.name)
        if tombstoned or cursor >= len(records):
            return None
        original = records[cursor]
        record, link = _resolved(store, original, resolve_links)
        return SourceItem(record, link, original.number, matches=True)


class AllSource:
    """Every event in the log; positions are commit positions."""

    is_all = True
    name = ALL_STREAM

    def __init__(self, event_filter: EventFilter | None) -> None:
        self.event_filter = event_filter

    def start_cursor(self, store: EventStore, origin: Origin) -> int:
        if origin is End:
            return store.event_count
        if origin is Start:
            return 0
        assert isinstance(origin, int)
        return store.index_at_or_after(origin)

    def cursor_after(self, store: EventStore, position: int) -> int:
        return store.index_after(position)

    def at_end(self, store: EventStore, cursor: int) -> bool:
        return cursor >= store.event_count

    def read(self, store: EventStore, cursor: int, resolve_links: bool) -> SourceItem | None:
        log = store.log
        if cursor >= len(log):
            return None
        original = log[cursor]
        if _hidden_from_all(original):
            return SourceItem(original, None, original.position, matches=False, visible=False)
        record, link = _resolved(store, original, resolve_links)
        matches = self.event_filter is None or self.event_filter.matches(original)
        return SourceItem(record, link, original.position, matches)


def _hidden_from_all(record: Record) -> bool:
    # A group's checkpoints must not count as progress of the group itself: it would
    # checkpoint again because it checkpointed. Their metadata ($$...) is hidden too.
    stream = original_stream(record.stream) if is_metastream(record.stream) else record.stream
    if stream == EPOCH_STREAM:
        return True
    return stream.startswith(HIDDEN_ALL_STREAM_PREFIX) and stream.endswith(
        HIDDEN_ALL_STREAM_SUFFIXES
    )


Source = StreamSource | AllSource


def validate_all_start(store: EventStore, origin: Origin) -> None:
    """The server refuses a start beyond the last written position."""
    if isinstance(origin, int):
        log = store.log
        last = log[-1].position if log else 0
        if origin > last:
            raise GroupError(
                "Invalid Start From position: commit position must be less than or equal"
                " to the last commit position in the transaction file."
            )
