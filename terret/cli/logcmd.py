"""``terret log``: a session's events, one readable line each; ``--follow`` streams live."""

from __future__ import annotations

import json
from typing import Any
from uuid import UUID

import click

from terret.cli._context import SESSION, CliContext
from terret.cli._params import TEXT
from terret.domain.catalogue import OpaquePayload
from terret.domain.codec import RecordedEvent, decode
from terret.domain.store import StoredRecord, session_stream


def _short(text: str, n: int = 70) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


def summarize(event: RecordedEvent) -> str:
    """One line for a human: the gist of the payload."""
    p: Any = event.payload
    name = event.wire_name
    if isinstance(p, OpaquePayload):
        return f"(unknown to this version) {_short(json.dumps(p.data))}"
    if name in ("user/message", "context/injected"):
        return repr(_short(p.text))
    if name == "assistant/message":
        calls = ", ".join(f"{c.name}#{c.id}({_short(json.dumps(c.args), 40)})"
                          for c in p.tool_calls)
        return (repr(_short(p.text)) if p.text else "") + (f" calls {calls}" if calls else "")
    if name == "tool/result":
        return f"{p.name}#{p.call_id} {'ERROR ' if p.is_error else ''}{_short(p.content, 50)!r}"
    if name == "turn/start":
        return f"turn {p.turn} ({p.trigger})"
    if name == "turn/end":
        extra = f" by {p.by.actor}" if p.by else ""
        extra += f": {p.reason}" if p.reason else ""
        extra += f" [{_short(p.error, 50)}]" if p.error else ""
        return f"turn {p.turn} {p.status}{extra}"
    if name == "step/start":
        return f"turn {p.turn} step {p.step} model {p.model}"
    if name == "step/end":
        usage = (f" {p.usage.prompt_tokens}+{p.usage.completion_tokens} tokens"
                 + (f" cost {p.usage.cost}" if p.usage.cost is not None else "")
                 if p.usage else " (no usage: resumed)")
        return f"turn {p.turn} step {p.step}{usage}"
    if name == "approval/requested":
        return f"{p.name}#{p.call_id} {_short(json.dumps(p.args), 50)}"
    if name == "approval/resolved":
        return f"{p.call_id} {p.verdict} by {p.by.actor}" + (f": {p.reason}" if p.reason else "")
    if name == "session/compacted":
        return f"up to seq {p.upto_seq}: {_short(p.summary, 50)!r}"
    if name == "session/titled":
        return repr(p.title)
    if name == "policy/updated":
        return ", ".join(p.patterns) or "(deny all)"
    if name == "model/set":
        return f"{p.role} = {p.spec}"
    if name == "inbox/queued":
        return f"{p.inbox_id[:8]} {'wake ' if p.wake else ''}{_short(p.text)!r}"
    data = p.model_dump(exclude_none=True)
    return _short(json.dumps(data, default=str), 90)


def _line(event: RecordedEvent) -> str:
    return f"{event.seq:>6}  {event.wire_name:<22} {summarize(event)}"


def _as_dict(record: StoredRecord, event: RecordedEvent) -> dict[str, Any]:
    """The event as stored: its data exactly as written (no upcast, no defaults filled in,
    no nulls added) and the schema version it was written with."""
    return {"seq": record.seq, "position": record.position, "type": record.wire_name,
            "version": event.version, "recorded_at": record.recorded_at,
            "data": json.loads(record.data)}


@click.command("log")
@click.argument("session_id", type=SESSION)
@click.option("--from", "from_seq", type=click.IntRange(min=1), default=1, show_default=True,
              help="First seq to show.")
@click.option("--type", "types", type=TEXT, multiple=True, metavar="WIRE_NAME",
              help="Only events of this type (repeatable), e.g. --type tool/result.")
@click.option("--follow", "-f", is_flag=True, help="Keep streaming new events until Ctrl-C.")
@click.pass_obj
def log(obj: CliContext, session_id: UUID, from_seq: int, types: tuple[str, ...],
        follow: bool) -> None:
    """A session's events, one line each: seq, wire name, summary."""
    obj.require_session(session_id)
    store = obj.store()
    stream = session_stream(session_id)
    wanted = set(types) or None

    def show(record: StoredRecord) -> None:
        if wanted is not None and record.wire_name not in wanted:
            return
        event = decode(record)  # a record that cannot be decoded raises CorruptRecord
        if obj.json_output:
            click.echo(json.dumps(_as_dict(record, event), sort_keys=True))
        else:
            click.echo(_line(event))

    head = store.head_position()  # before reading, so --follow cannot miss what lands meanwhile
    last = from_seq - 1
    while True:
        page = store.read_stream(stream, from_seq=last + 1, limit=1000)
        for record in page:
            show(record)
        if len(page) < 1000:
            break
        last = page[-1].seq
    if page:
        last = page[-1].seq
    if not follow:
        return
    try:
        with store.subscribe(after=head) as sub:
            for item in sub:
                if isinstance(item, StoredRecord) and item.stream == stream and item.seq > last:
                    show(item)
                    last = item.seq
    except KeyboardInterrupt:
        pass  # Ctrl-C ends --follow quietly


def register(cli: click.Group) -> None:
    cli.add_command(log)
