"""Streams.Read requests: parsing, filters, and the non-subscription reads.

Rules (wire notes §2.2-2.3, §3.2, §3.5-3.6):
* stream reads honour `$tb`/`$maxCount`/`$maxAge`; missing or soft-deleted streams get one
  `stream_not_found` message; tombstoned ones fail with FAILED_PRECONDITION "is deleted";
* `$all` ignores stream metadata; forwards from P includes the event at P, backwards from P
  returns only events strictly before P;
* filters use `re.search` semantics on the event type or stream name; `count` limits the
  number of *matching* events.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass

from esdbclient.protos.Grpc import streams_pb2

from .convert import ReadResp, event_resp, linked_event_resp, stream_not_found_resp
from .records import Record
from .scope import CallScope
from .store import EventStore

LINK_EVENT_TYPE = "$>"
DEFAULT_WINDOW = 32  # the server's default filter page size when the client sends none
UNFILTERED_PAGE = 512  # catch-up chunk size when there is no filter (no checkpoints then)

Options = streams_pb2.ReadReq.Options


class InvalidRead(ValueError):
    """A combination the server rejects (it answers UNKNOWN)."""


class Start:
    """Marker: read from the beginning."""


class End:
    """Marker: read from the end."""


Origin = type[Start] | type[End] | int  # an int is a revision (streams) or position ($all)


@dataclass(frozen=True, slots=True)
class EventFilter:
    pattern: re.Pattern[str]
    by_stream_name: bool

    def matches(self, record: Record) -> bool:
        # The server uses .NET Regex.Match(...).Success: search, not fullmatch.
        subject = record.stream if self.by_stream_name else record.type
        return self.pattern.search(subject) is not None

    @classmethod
    def from_options(cls, options: Options.FilterOptions) -> EventFilter:
        which = options.WhichOneof("filter")
        expression = (
            options.stream_identifier if which == "stream_identifier" else options.event_type
        )
        if expression.regex:
            pattern = expression.regex
        elif expression.prefix:
            pattern = "^(?:" + "|".join(re.escape(p) for p in expression.prefix) + ")"
        else:
            pattern = ""
        try:
            compiled = re.compile(pattern)
        except re.error as error:
            raise InvalidRead(f"Invalid filter regex {pattern!r}: {error}") from None
        return cls(compiled, by_stream_name=which == "stream_identifier")


@dataclass(frozen=True, slots=True)
class ReadRequest:
    stream: str | None  # None: $all
    origin: Origin
    backwards: bool
    count: int  # ignored for subscriptions
    subscribe: bool
    event_filter: EventFilter | None
    window: int  # filter page size ("max")
    checkpoint_multiplier: int
    resolve_links: bool
    string_ids: bool

    @property
    def checkpoint_interval(self) -> int:
        return max(1, self.window * self.checkpoint_multiplier)

    @classmethod
    def parse(cls, request: streams_pb2.ReadReq) -> ReadRequest:
        options = request.options
        stream: str | None = None
        if options.WhichOneof("stream_option") == "stream":
            stream = options.stream.stream_identifier.stream_name.decode("utf8")
            revision_option = options.stream.WhichOneof("revision_option")
            origin = _origin(revision_option, options.stream.revision)
        else:
            all_option = options.all.WhichOneof("all_option")
            origin = _origin(all_option, options.all.position.commit_position)
        subscribe = options.WhichOneof("count_option") == "subscription"
        backwards = options.read_direction == Options.Backwards
        event_filter = None
        window, multiplier = DEFAULT_WINDOW, 1
        if options.WhichOneof("filter_option") == "filter":
            if stream is not None:
                raise InvalidRead("Filters are only supported when reading $all")
            event_filter = EventFilter.from_options(options.filter)
            if options.filter.WhichOneof("window") == "max" and options.filter.max > 0:
                window = options.filter.max
            multiplier = max(1, options.filter.checkpointIntervalMultiplier)
        if subscribe and backwards:
            raise InvalidRead("Subscriptions can only read forwards")
        return cls(
            stream=stream,
            origin=origin,
            backwards=backwards,
            count=options.count if not subscribe else sys.maxsize,
            subscribe=subscribe,
            event_filter=event_filter,
            window=window,
            checkpoint_multiplier=multiplier,
            resolve_links=options.resolve_links,
            string_ids=options.uuid_option.WhichOneof("content") != "structured",
        )


def _origin(which: str | None, value: int) -> Origin:
    """From a revision_option / all_option oneof; unset means from the start."""
    if which == "end":
        return End
    if which in ("revision", "position"):
        return value
    return Start


def resolve_origin(origin: Origin, *, start: int, end: int) -> int:
    if origin is Start:
        return start
    if origin is End:
        return end
    assert isinstance(origin, int)
    return origin


def record_resp(store: EventStore, request: ReadRequest, record: Record) -> ReadResp:
    """The ReadResp for `record`, resolving `$>` links when asked to."""
    if request.resolve_links and record.type == LINK_EVENT_TYPE:
        target = resolve_link(store, record)
        if target is not None:
            return linked_event_resp(target, record, string_ids=request.string_ids)
    return event_resp(record, string_ids=request.string_ids)


def resolve_link(store: EventStore, link: Record) -> Record | None:
    # Link data is "<event number>@<stream name>".
    number, sep, stream = link.data.decode("utf8", "replace").partition("@")
    if not sep or not number.isdigit():
        return None
    records, _ = store.stream_progress(stream)
    index = int(number)
    return records[index] if index < len(records) else None


def read_stream(store: EventStore, request: ReadRequest, scope: CallScope) -> Iterator[ReadResp]:
    """Raises StreamDeletedError (before yielding anything) for a tombstoned stream."""
    assert request.stream is not None
    snapshot = store.stream_snapshot(request.stream)
    if not snapshot.found:
        yield stream_not_found_resp(request.stream)
        return
    last, floor = snapshot.last, snapshot.floor
    origin = request.origin
    if not request.backwards:
        first = resolve_origin(origin, start=0, end=last + 1)
        numbers = range(max(first, floor), last + 1)
    else:
        top = resolve_origin(origin, start=0, end=last)
        numbers = range(min(top, last), floor - 1, -1)
    remaining = request.count
    for number in numbers:
        if remaining <= 0:
            return
        record = snapshot.records[number]
        if not snapshot.visible(record):
            continue
        scope.check_cut()
        yield record_resp(store, request, record)
        remaining -= 1


def read_all(store: EventStore, request: ReadRequest, scope: CallScope) -> Iterator[ReadResp]:
    log = store.log
    length = len(log)  # events appended after the read started are not included
    origin = request.origin
    if not request.backwards:
        position = resolve_origin(origin, start=0, end=sys.maxsize)
        indexes = range(min(store.index_at_or_after(position), length), length)
    else:
        # Backwards from P starts strictly before P; from Start there is nothing before.
        position = resolve_origin(origin, start=0, end=sys.maxsize)
        top = store.index_at_or_after(position) - 1
        indexes = range(min(top, length - 1), -1, -1)
    event_filter = request.event_filter
    remaining = request.count
    for index in indexes:
        if remaining <= 0:
            return
        record = log[index]
        if event_filter is not None and not event_filter.matches(record):
            continue
        scope.check_cut()
        yield record_resp(store, request, record)
        remaining -= 1
