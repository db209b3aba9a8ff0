"""A second process for the runtime tests: ``python -m tests.runtime.proc STORE_URI ACTION ...``.

It opens the same store (a SQLite file or an EventStoreDB URI) with a runtime that is never
started (no subscription, no agents: an operator's CLI), or with the bare ``Session`` aggregate,
does one thing and prints a JSON line.

Actions:
  approve SID CALL_ID            Runtime.approve by an operator
  deny SID CALL_ID REASON        Runtime.deny by an operator
  resolve-raw SID CALL_ID        approval/resolved appended through SessionRepository
  inject SID TEXT [wake]         Runtime.inject
  policy SID PATTERN...          Runtime.set_policy
  policy-reset SID               Runtime.reset_policy (the recorded allow-list withdrawn)
  cancel SID                     Runtime.cancel by an operator
  close SID                      Runtime.close_session by an operator
  assistant SID TEXT             assistant/message appended through SessionRepository (taking
                                 over the open step: not commutative)
  turn SID TEXT                  Runtime.run_turn to completion with a scripted model ("ok")
  die-in-tool SID                Runtime.run_turn whose tool kills the process (os._exit)
  park SID                       Runtime.run_turn parked on an approval, then the process dies
  die-in-payment SID KEYFILE     Runtime.run_turn whose ``pay`` tool (idempotent=False) writes
                                 its idempotency key to KEYFILE and kills the process
  hold SID FILE                  Runtime.run_turn (an idle session owned elsewhere moves here)
                                 whose ``hold`` tool touches FILE.started, then waits until
                                 FILE exists
  budget SID LIMIT               Runtime.set_budget by an operator (LIMIT ``none``: the default)
  rerun SID CALL_ID              Runtime.rerun by an operator (a call in doubt runs again)
  skip SID CALL_ID REASON        Runtime.skip by an operator (a call in doubt is not run again)
  usage SID                      Runtime.usage: the session's step totals
  raw SID WIRE_NAME DATA         a record of that wire name and JSON data (version 1), appended
                                 with ``store.append``, unchecked: an unknown event, or one of
                                 ``Flagged`` its class refuses
  flag SID TEXT                  an extension event, ``Flagged`` (not commutative), appended
                                 with ``store.append`` as extending.md shows

The scripted replies of ``die-in-tool``, ``park`` and ``die-in-payment`` report usage
(``REPORTED``: 111 + 13 tokens, cost 0.01).
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Callable
from uuid import UUID, uuid4

from pydantic import BaseModel

from terret import (
    Actor,
    AgentDefinition,
    CallContext,
    EventPayload,
    Reply,
    Runtime,
    ScriptedProvider,
    SessionRepository,
    StaticResolver,
    Usage,
    call,
    event_type,
    tool,
)
from terret.adapters.stores import open_store
from terret.domain import encode
from terret.domain.errors import WrongExpectedVersion
from terret.domain.store import NewRecord, session_stream

OPERATOR = Actor(actor="operator", id="proc")
REPORTED = Usage(prompt_tokens=111, completion_tokens=13, cost=0.01)


@event_type
class Flagged(EventPayload):
    """An application's event that a running turn must not carry on past."""

    wire_name = "tests.proc/flagged"
    commutative = False
    text: str


def main(argv: list[str]) -> dict[str, object]:
    uri, action, sid_text, *rest = argv
    store = open_store(uri)
    sid = UUID(sid_text)
    try:
        if action in ("resolve-raw", "assistant"):
            return _raw(store, action, sid, rest)
        if action == "raw":  # a record as another program may write it, shape unchecked
            stream = session_stream(sid)
            wire_name, data = rest
            result = store.append(stream, [NewRecord(uuid4(), wire_name, data.encode(),
                                                     b'{"schema_version": 1}')],
                                  store.stream_version(stream))
            return {"ok": True, "version": result.version}
        if action == "flag":
            stream = session_stream(sid)
            result = store.append(stream, [encode(Flagged(text=rest[0]))],
                                  store.stream_version(stream))
            return {"ok": True, "version": result.version}
        if action in ("turn", "die-in-tool", "park", "die-in-payment", "hold"):
            return _turn(store, action, sid, rest)
        rt = Runtime(store, resolver=StaticResolver())
        try:
            return _command(rt, action, sid, rest)
        finally:
            rt.close()
    finally:
        store.close()


_COMMANDS: dict[str, Callable[[Runtime, UUID, list[str]], object]] = {
    "approve": lambda rt, sid, rest: rt.approve(sid, rest[0], by=OPERATOR),
    "deny": lambda rt, sid, rest: rt.deny(sid, rest[0], by=OPERATOR, reason=rest[1]),
    "policy": lambda rt, sid, rest: rt.set_policy(sid, rest, by=OPERATOR),
    "policy-reset": lambda rt, sid, rest: rt.reset_policy(sid, by=OPERATOR),
    "cancel": lambda rt, sid, rest: rt.cancel(sid, by=OPERATOR, reason="from another process"),
    "close": lambda rt, sid, rest: rt.close_session(sid, by=OPERATOR),
    "model": lambda rt, sid, rest: rt.set_model(sid, rest[0], rest[1], by=OPERATOR),
    "budget": lambda rt, sid, rest: rt.set_budget(
        sid, None if rest[0] == "none" else float(rest[0]), by=OPERATOR),
    "rerun": lambda rt, sid, rest: rt.rerun(sid, rest[0], by=OPERATOR),
    "skip": lambda rt, sid, rest: rt.skip(sid, rest[0], by=OPERATOR, reason=rest[1]),
    "purge": lambda rt, sid, rest: (rt.close_session(sid, by=OPERATOR),
                                    rt.purge(sid, by=OPERATOR, reason="erasure request")),
}
"""The operator commands whose answer is only that they were done."""


def _command(rt: Runtime, action: str, sid: UUID, rest: list[str]) -> dict[str, object]:
    """One operator command through a runtime that serves nothing."""
    if action == "inject":
        inbox_id = rt.inject(sid, rest[0], wake=rest[1:] == ["wake"])
        return {"ok": True, "inbox_id": inbox_id}
    if action == "usage":
        return {"ok": True, **rt.usage(sid)}
    if action not in _COMMANDS:
        raise SystemExit(f"unknown action {action!r}")
    _COMMANDS[action](rt, sid, rest)
    return {"ok": True}


class _NoArgs(BaseModel):
    pass


@tool(args=_NoArgs)
def die(args: _NoArgs, ctx: CallContext) -> str:
    """Kills its process mid-call, as SIGKILL would (no cleanup runs)."""
    os._exit(9)


@tool(args=_NoArgs, approval="always")
def deploy(args: _NoArgs, ctx: CallContext) -> str:
    """Asks a human first."""
    return "deployed"


class _Amount(BaseModel):
    amount: int


@tool(args=_Amount, idempotent=False)
def pay(args: _Amount, ctx: CallContext) -> str:
    """May not run twice: notes its idempotency key, then dies mid-call."""
    with open(os.environ["TERRET_TEST_KEYFILE"], "a") as f:
        f.write(ctx.idempotency_key + "\n")
    os._exit(9)


@tool(args=_NoArgs)
def hold(args: _NoArgs, ctx: CallContext) -> str:
    """Touches ``FILE.started``, then runs until the file ``TERRET_TEST_HOLD`` names exists."""
    release = os.environ["TERRET_TEST_HOLD"]
    open(release + ".started", "w").close()
    while not os.path.exists(release):
        threading.Event().wait(0.02)
    return "released"


def _turn(store: object, action: str, sid: UUID, rest: list[str]) -> dict[str, object]:
    script = {
        "turn": [],
        "hold": [Reply(tool_calls=[call("hold", {})])],
        "die-in-tool": [Reply(tool_calls=[call("die", {})], usage=REPORTED)],
        "park": [Reply(tool_calls=[call("deploy", {}, "c-park")], usage=REPORTED)],
        "die-in-payment": [Reply(tool_calls=[call("pay", {"amount": 5}, "c-pay")],
                                 usage=REPORTED)],
    }[action]
    if action == "die-in-payment":
        os.environ["TERRET_TEST_KEYFILE"] = rest.pop(0)
    if action == "hold":
        os.environ["TERRET_TEST_HOLD"] = rest.pop(0)
    provider = ScriptedProvider(script, default=Reply(text="ok"))
    rt = Runtime(store, resolver=StaticResolver({"scripted": provider}),  # type: ignore[arg-type]
                 agents=[AgentDefinition(tools=[die, deploy, pay, hold],
                                          allow=["*"])]).start()
    if action == "park":
        threading.Thread(target=rt.run_turn, args=(sid, "go"), daemon=True).start()
        while not rt.pending(sid):
            threading.Event().wait(0.02)
        print(json.dumps({"ok": True, "pending": rt.pending(sid)}), flush=True)
        os._exit(0)  # parked, and gone without a word, as after SIGKILL
    result = rt.run_turn(sid, rest[0] if rest else "go")
    rt.close()
    return {"ok": True, "status": result.status, "turn": result.turn}


def _raw(store: object, action: str, sid: UUID, rest: list[str]) -> dict[str, object]:
    repository = SessionRepository(store)  # type: ignore[arg-type]
    for _ in range(20):
        session = repository.get(sid)
        if action == "resolve-raw":
            session.resolve_approval(rest[0], "approved", by=OPERATOR, reason="raw")
        else:
            session.record_assistant(rest[0])
        try:
            result = repository.save(session)
        except WrongExpectedVersion:
            continue
        assert result is not None
        return {"ok": True, "version": result.version}
    raise SystemExit("too many conflicts")


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])), flush=True)
