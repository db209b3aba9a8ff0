"""Catch-up subscriptions (Streams.Read with `subscription{}`), wire notes §2.8-2.9, §3.4.

Message order: confirmation, catch-up events, one `caught_up`, live events. Catch-up and
live read the same append-only list through one cursor, so the switch can neither skip
nor repeat an event. Subscriptions never end by themselves: only the client (cancel,
deadline), `cut_subscriptions()` or a tombstone on the subscribed stream end them.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Generator, Iterator
from typing import NamedTuple

from .convert import ReadResp, caught_up_resp, checkpoint_resp, confirmation_resp
from .reads import UNFILTERED_PAGE, End, ReadRequest, Start, record_resp, resolve_origin
from .scope import CallScope
from .store import EventStore, StreamDeletedError


def subscribe_all(store: EventStore, request: ReadRequest, scope: CallScope) -> Iterator[ReadResp]:
    """A `$all` subscription, with checkpoints when filtered.

    Start is exclusive: from position P the first event delivered is the first one after P
    (P == 0 means "from the start", and every real position is > 0).
    """
    origin = request.origin
    # Fix the start before confirming, so that `from_end` sees every event written after
    # the client received the confirmation.
    if origin is Start:
        cursor = 0
    elif origin is End:
        cursor = store.event_count
    else:
        assert isinstance(origin, int)
        cursor = store.index_after(origin)
    yield confirmation_resp(str(uuid.uuid4()))
    trace = store.trace_subscription()
    for resp in _all(store, request, scope, cursor):
        if isinstance(resp, Delivered):
            store.traced(trace, resp.stream)
            resp = resp.resp
        yield resp


class Delivered(NamedTuple):
    """An event sent to a `$all` subscriber (its stream is traced: ``EsdbEmulator.traces``)."""

    stream: str
    resp: ReadResp


def _all(store: EventStore, request: ReadRequest, scope: CallScope, cursor: int
         ) -> Iterator[ReadResp | Delivered]:
    cursor = yield from _catch_up_all(store, request, scope, cursor)
    yield caught_up_resp()
    yield from _live_all(store, request, scope, cursor)


def _catch_up_all(
    store: EventStore, request: ReadRequest, scope: CallScope, cursor: int
) -> Generator[ReadResp | Delivered, None, int]:
    """Catch-up, page by page; the cursor reached. After a page that is not the end of the
    log, once enough events were considered (matching or not), send a checkpoint. The
    checkpoint carries the position of the page's last considered event: never beyond the
    last written event, and resuming "after" it skips only events already considered."""
    log = store.log
    event_filter = request.event_filter
    interval = request.checkpoint_interval
    page_size = request.window if event_filter is not None else UNFILTERED_PAGE
    considered = 0
    while cursor < len(log):
        page_end = min(cursor + page_size, len(log))
        for index in range(cursor, page_end):
            record = log[index]
            scope.check_cut()
            if event_filter is None or event_filter.matches(record):
                yield Delivered(record.stream, record_resp(store, request, record))
        considered += page_end - cursor
        cursor = page_end
        if event_filter is not None and considered >= interval and cursor < len(log):
            yield checkpoint_resp(log[cursor - 1].position)
            considered %= interval
    return cursor


def _live_all(
    store: EventStore, request: ReadRequest, scope: CallScope, cursor: int
) -> Iterator[ReadResp | Delivered]:
    """Live: every newly committed event counts; at `interval` a checkpoint follows it."""
    log = store.log
    event_filter = request.event_filter
    interval = request.checkpoint_interval

    def grown_past(length: int) -> Callable[[], bool]:
        return lambda: len(log) > length

    considered = 0
    while scope.wait_until(grown_past(cursor)):
        page_end = len(log)
        for index in range(cursor, page_end):
            record = log[index]
            scope.check_cut()
            if event_filter is None or event_filter.matches(record):
                yield Delivered(record.stream, record_resp(store, request, record))
            if event_filter is not None:
                considered += 1
                if considered >= interval:
                    yield checkpoint_resp(record.position)
                    considered = 0
        cursor = page_end


def subscribe_stream(
    store: EventStore, request: ReadRequest, scope: CallScope
) -> Iterator[ReadResp]:
    """A stream subscription: no filter, no checkpoints; revision N starts at N+1.

    A missing stream is treated as empty (the subscription goes live and waits for it).
    Raises StreamDeletedError when the stream is, or becomes, tombstoned.
    """
    stream = request.stream
    assert stream is not None
    records, _ = store.stream_progress(stream)
    origin = request.origin
    if origin is End:
        cursor = len(records)
    else:
        cursor = resolve_origin(origin, start=-1, end=-1) + 1
        # Catch-up reads the stream, so truncation ($tb, $maxCount) hides older events.
        cursor = max(cursor, store.stream_start_floor(stream))
    yield confirmation_resp(str(uuid.uuid4()))

    def ready() -> bool:
        records, tombstoned = store.stream_progress(stream)
        return tombstoned or len(records) > cursor

    caught_up_sent = False
    while True:
        records, tombstoned = store.stream_progress(stream)
        if tombstoned:
            raise StreamDeletedError(stream)
        page_end = len(records)
        for number in range(cursor, page_end):
            scope.check_cut()
            yield record_resp(store, request, records[number])
        cursor = max(cursor, page_end)
        if not caught_up_sent:
            yield caught_up_resp()
            caught_up_sent = True
        if not scope.wait_until(ready):
            return
