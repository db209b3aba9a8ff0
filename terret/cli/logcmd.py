"""``terret log``: a session's events, one readable line each; ``--follow`` streams live."""

from __future__ import annotations

import collections
import difflib
import functools
import json
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any
from uuid import UUID

import click

from terret._text import cut
from terret.cli._context import SESSION, CliContext, note
from terret.cli._format import money, printable, strict_json
from terret.cli._params import TEXT, IntRange
from terret.domain.errors import shown
from terret.domain.store import RETENTION_STREAM, StoredRecord, session_stream

if TYPE_CHECKING:  # the payload classes are loaded when a command reads events
    from terret.domain import events as ev
    from terret.domain.codec import RecordedEvent

PAGE = 1000


def _short(text: str, n: int = 70) -> str:
    # Escaped before it is cut: cut first, a text of control characters came out many times
    # the length of the others.
    return cut(printable(" ".join(text.split())), n)


_QUOTE_ESCAPES = {"'": "\\'", "\\": "\\\\"}


def _quoted(text: str, n: int = 70) -> str:
    """``text`` quoted as Python shows a string — a control character as ``\\x1b``, a
    backslash doubled, so that the one cannot pass for the other — and cut to about ``n``
    characters of what is shown, never inside an escape. (``repr`` of the escaped text doubled
    the escapes' backslashes: an ESC read as the four characters ``\\x1b``.)"""
    collapsed = " ".join(text.split())
    tokens = [(_QUOTE_ESCAPES.get(ch) or ch) if ch.isprintable() else repr(ch)[1:-1]
              for ch in collapsed[:n + 1]]  # each shows as one character at least
    if len(collapsed) <= n and sum(map(len, tokens)) <= n:
        return "'" + "".join(tokens) + "'"
    shown, room = [], n - 1  # the ellipsis takes one
    for token in tokens:
        room -= len(token)
        if room < 0:
            break
        shown.append(token)
    return "'" + "".join(shown) + "…'"


def summarize(event: RecordedEvent) -> str:
    """One line for a human: the gist of the payload (one summary per payload class; any
    other, an extension's, as its data), its control characters escaped — a tool name, a
    call id, a reason or a spec holds what its author wrote, and a terminal must not act on
    it (an escape sequence setting the window's title, writing the clipboard). A newline is
    escaped too: the summary is one line, and a reason holding one printed what read as the
    next events of the log."""
    return printable(_gist(event)).replace("\n", "\\n")


def _gist(event: RecordedEvent) -> str:
    from terret.domain.catalogue import OpaquePayload

    p: Any = event.payload
    if isinstance(p, OpaquePayload):
        return f"(unknown to this version) {_short(json.dumps(p.data))}"
    gist = _summaries().get(type(p))
    if gist is not None:
        return gist(p)
    data = p.model_dump(exclude_none=True)
    return _short(json.dumps(data, default=str), 90)


def _text(p: ev.UserMessage | ev.ContextInjected) -> str:
    return _quoted(p.text)


def _assistant(p: ev.AssistantMessage) -> str:
    calls = ", ".join(f"{c.name}#{c.id}({_short(json.dumps(c.args), 40)})"
                      for c in p.tool_calls)
    metered = ""
    if p.model is not None:  # the model call's usage, durable with its reply
        metered = f" [{p.model} " + (_tokens(p.usage) if p.usage is not None
                                     else "no usage reported") + "]"
    return ((_quoted(p.text) if p.text else "") + (f" calls {calls}" if calls else "")
            + metered).lstrip()


def _tool_result(p: ev.ToolResult) -> str:
    return f"{p.name}#{p.call_id} {'ERROR ' if p.is_error else ''}{_quoted(p.content, 50)}"


def _turn_start(p: ev.TurnStarted) -> str:
    return f"turn {p.turn} ({p.trigger})"


def _turn_end(p: ev.TurnEnded) -> str:
    extra = f" by {p.by.actor}" if p.by else ""
    extra += f": {p.reason}" if p.reason else ""
    extra += f" [{_short(p.error, 50)}]" if p.error else ""
    return f"turn {p.turn} {p.status}{extra}"


def _step_start(p: ev.StepStarted) -> str:
    return f"turn {p.turn} step {p.step} model {p.model}"


def _step_end(p: ev.StepEnded) -> str:
    # A metered step's usage is on its reply; an older log's step/end carries it.
    usage = f" {_tokens(p.usage)}" if p.usage else ""
    resumed = " (resumed: no usage of its own)" if p.resumed else ""
    return f"turn {p.turn} step {p.step}{usage}{resumed}"


def _tool_started(p: ev.ToolStarted) -> str:
    return f"{p.name}#{p.call_id}"


def _in_doubt(p: ev.ToolInDoubt) -> str:
    return f"{p.name}#{p.call_id} {_short(json.dumps(p.args), 50)} (started, no result)"


def _verdict(p: ev.InDoubtResolved | ev.ApprovalResolved) -> str:
    return f"{p.call_id} {p.verdict} by {p.by.actor}" + (f": {p.reason}" if p.reason else "")


def _budget_set(p: ev.BudgetSet) -> str:
    limit = money(p.limit) if p.limit is not None else "the deployment's default"
    return f"{limit} by {p.by.actor}" + (f": {p.reason}" if p.reason else "")


def _budget_exceeded(p: ev.BudgetExceeded) -> str:
    return (f"turn {p.turn} parked: spent {money(p.spent)} of {money(p.limit)}, next call "
            f"estimated at {money(p.estimate)}")


def _approval_requested(p: ev.ApprovalRequested) -> str:
    return f"{p.name}#{p.call_id} {_short(json.dumps(p.args), 50)}"


def _compacted(p: ev.SessionCompacted) -> str:
    return f"up to seq {p.upto_seq}: {_quoted(p.summary, 50)}"


def _titled(p: ev.SessionTitled) -> str:
    return repr(p.title)


def _upkeep_usage(p: ev.UsageRecorded) -> str:
    return f"{p.purpose} [{p.model} {_tokens(p.usage)}]"


def _policy(p: ev.PolicyUpdated) -> str:
    return ", ".join(p.patterns) or "(deny all)"


def _policy_reset(p: ev.PolicyReset) -> str:
    return "(the agent's floor applies)"


def _model_set(p: ev.ModelSet) -> str:
    return f"{p.role} = {_short(p.spec, 120)}"


def _inbox(p: ev.InboxQueued) -> str:
    return f"{p.inbox_id[:8]} {'wake ' if p.wake else ''}{_quoted(p.text)}"


@functools.cache
def _summaries() -> dict[type[Any], Callable[[Any], str]]:
    """Each payload class and its one-line summary (the classes loaded on first use)."""
    from terret.domain import events

    e = events
    return {
        e.UserMessage: _text, e.ContextInjected: _text, e.AssistantMessage: _assistant,
        e.ToolResult: _tool_result, e.TurnStarted: _turn_start, e.TurnEnded: _turn_end,
        e.StepStarted: _step_start, e.StepEnded: _step_end, e.ToolStarted: _tool_started,
        e.ToolInDoubt: _in_doubt, e.InDoubtResolved: _verdict, e.BudgetSet: _budget_set,
        e.BudgetExceeded: _budget_exceeded, e.ApprovalRequested: _approval_requested,
        e.ApprovalResolved: _verdict, e.SessionCompacted: _compacted,
        e.SessionTitled: _titled, e.PolicyUpdated: _policy, e.PolicyReset: _policy_reset,
        e.ModelSet: _model_set,
        e.InboxQueued: _inbox, e.UsageRecorded: _upkeep_usage,
    }


def _tokens(usage: Any) -> str:
    return (f"{usage.prompt_tokens}+{usage.completion_tokens} tokens"
            + (f" {money(usage.cost)}" if usage.cost is not None else ""))


def _line(event: RecordedEvent, record: StoredRecord, *, full: bool, stamps: bool) -> str:
    stamp = f"{_stamp(record.recorded_at)}  " if stamps else ""
    body = (printable(json.dumps(json.loads(record.data), sort_keys=True, ensure_ascii=False))
            if full else summarize(event))  # JSON escapes C0 controls, not DEL and C1
    from terret.domain.payloads import wire_name_problem

    # Any client may append a record: a wire name no class could have is shown quoted, so it
    # cannot pass for more of the log.
    name = event.wire_name if wire_name_problem(event.wire_name) is None else json.dumps(
        event.wire_name)
    return f"{event.seq:>6}  {stamp}{name:<22} {body}"


def _stamp(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) + f".{int(ts * 1000) % 1000:03d}"


def _as_dict(record: StoredRecord, event: RecordedEvent) -> dict[str, Any]:
    """The event as stored: its data exactly as written (no upcast, no defaults filled in,
    no nulls added) and the schema version it was written with."""
    return {"seq": record.seq, "position": record.position, "type": record.wire_name,
            "version": event.version, "recorded_at": record.recorded_at,
            "data": json.loads(record.data)}


@click.command("log")
@click.argument("session_id", type=SESSION)
@click.option("--from", "from_seq", type=IntRange(min=1), default=1, show_default=True,
              help="First seq to show.")
@click.option("--type", "types", type=TEXT, multiple=True, metavar="WIRE_NAME",
              help="Only events of this type (repeatable), e.g. --type tool/result.")
@click.option("--tail", "tail", type=IntRange(min=1), default=None, metavar="N",
              help="Only the last N events (of those --type keeps).")
@click.option("--timestamps", "-t", "stamps", is_flag=True,
              help="Show when each event was recorded (local time).")
@click.option("--full", is_flag=True,
              help="Show each event's data in full (JSON), not a one-line summary.")
@click.option("--follow", "-f", is_flag=True, help="Keep streaming new events until Ctrl-C.")
@click.pass_obj
def log(obj: CliContext, session_id: UUID, from_seq: int, types: tuple[str, ...],
        tail: int | None, stamps: bool, full: bool, follow: bool) -> None:
    """A session's events, one line each: seq, wire name, summary."""
    obj.require_session(session_id)
    obj.refuse_if_purged(session_id)
    store = obj.store()
    stream = session_stream(session_id)
    wanted = set(types) or None
    if wanted is not None:
        _check_types(store, stream, wanted)
    show = _printer(obj, full=full, stamps=stamps)
    head = store.head_position()  # before reading, so --follow cannot miss what lands meanwhile
    last = _show_log(store, stream, from_seq, wanted, tail, show)
    if follow:
        _follow(store, stream, head, last, wanted, show)


def _printer(obj: CliContext, *, full: bool, stamps: bool) -> Callable[[StoredRecord], None]:
    """What prints one record: a JSON object with ``--json``, else a line."""
    from terret.domain.codec import decode

    def show(record: StoredRecord) -> None:
        event = decode(record)  # a record that cannot be decoded raises CorruptRecord
        if obj.json_output:
            click.echo(strict_json(_as_dict(record, event), sort_keys=True))
        else:
            click.echo(_line(event, record, full=full, stamps=stamps))

    return show


def _show_log(store: Any, stream: str, from_seq: int, wanted: set[str] | None,
              tail: int | None, show: Callable[[StoredRecord], None]) -> int:
    """Show the stream's records from ``from_seq`` on (of ``wanted`` types, the last ``tail``
    of them); the seq of the last record read."""
    if tail is not None and wanted is None:
        from_seq = max(from_seq, store.stream_version(stream) - tail + 1)
    kept: collections.deque[StoredRecord] = collections.deque(maxlen=tail)
    last = from_seq - 1
    for record in _records(store, stream, from_seq):
        last = record.seq
        if wanted is None or record.wire_name in wanted:
            if tail is None:
                show(record)
            else:
                kept.append(record)
    for record in kept:
        show(record)
    return last


def _follow(store: Any, stream: str, head: int, last: int, wanted: set[str] | None,
            show: Callable[[StoredRecord], None]) -> None:
    """Show the stream's records after seq ``last`` as they land (``head`` was read before
    the history), until Ctrl-C."""
    try:
        with store.subscribe(after=head) as sub:
            for item in sub:
                if not isinstance(item, StoredRecord):
                    continue
                if item.stream == stream and item.seq > last:
                    if wanted is None or item.wire_name in wanted:
                        show(item)
                    last = item.seq
                elif (purge := _purge_of(item, stream)) is not None:
                    # Nothing more can land: the stream is gone (or expiring).
                    expiry = purge.get("max_age_seconds")
                    how = f" (its events expire after {expiry}s)" if expiry else ""
                    note(f"session {stream.removeprefix('session-')} was purged{how}; "
                         "nothing more will be logged")
                    return
    except KeyboardInterrupt:
        pass  # Ctrl-C ends --follow quietly


def _purge_of(record: StoredRecord, stream: str) -> dict[str, Any] | None:
    """The data of ``record`` if it is the retention stream's ``session/purged`` of
    ``stream``."""
    if record.stream != RETENTION_STREAM:
        return None
    from terret.domain.events import SessionPurged

    if record.wire_name != SessionPurged.wire_name:
        return None
    try:
        data = json.loads(record.data)
        purged = data.get("session_id")
    except (ValueError, AttributeError):
        return None
    return data if f"session-{purged}" == stream or purged == stream else None


def _records(store: Any, stream: str, from_seq: int) -> Iterator[StoredRecord]:
    """The stream's records from ``from_seq`` on, read in pages."""
    after = from_seq - 1
    while True:
        page = store.read_stream(stream, from_seq=after + 1, limit=PAGE)
        yield from page
        if len(page) < PAGE:
            return
        after = page[-1].seq


def _check_types(store: Any, stream: str, wanted: set[str]) -> None:
    """Refuse a ``--type`` no event can have: neither an event type this process knows (the
    catalogue: Terret's and registered extensions') nor one found in the session's log (an
    extension this process does not have)."""
    from terret.domain.catalogue import catalogue

    known = set(catalogue.wire_names())
    unknown = wanted - known
    if unknown:
        known |= {r.wire_name for r in _records(store, stream, 1)}
        unknown -= known
    if unknown:
        name = sorted(unknown)[0]
        close = difflib.get_close_matches(name, sorted(known), n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise click.BadParameter(
            f"no event type {shown(name)}{hint}; `terret events` lists the known ones",
            param_hint="'--type'")


def register(cli: click.Group) -> None:
    cli.add_command(log)
