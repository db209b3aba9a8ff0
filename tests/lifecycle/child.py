"""What runs in the processes the lifecycle lane kills, and in the fresh ones that take over.

Every job opens the store by URI (a SQLite file or an EventStoreDB URI) and builds its runtime
with the same agent: a three-step turn, ``deploy`` (approval: always) then ``status`` then a final
answer. The model is a function of what it is shown (how many assistant messages the history
holds), so any process can pick the turn up wherever the last one died.

``python -m tests.lifecycle.child wedge STORE_URI SESSION_ID RAN_FILE`` runs a turn whose
``probe`` tool blocks forever; ``park`` runs the deploy turn and stays parked on its approval
(the kill -9 lane). The sweep's jobs are functions run in forked children.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from uuid import UUID

from pydantic import BaseModel

from terret import (
    Actor,
    AgentDefinition,
    CallContext,
    Reply,
    Runtime,
    ScriptedProvider,
    StaticResolver,
    ToolCall,
    Usage,
    tool,
)
from terret.adapters.stores import open_store
from terret.domain.store import EventStore, ExpectedVersion, NewRecord
from terret.runtime import ModelRequest

APPROVER = Actor(actor="operator", id="lifecycle")
DEADLINE = 30.0


class Env(BaseModel):
    env: str


class NoArgs(BaseModel):
    pass


def _record(ran: Path | None, entry: str) -> None:
    if ran is not None:
        with ran.open("a") as f:
            f.write(entry + "\n")
            f.flush()
            os.fsync(f.fileno())


def definition(ran: Path | None = None, *, wedge: bool = False) -> AgentDefinition:
    """The lane's agent. ``ran`` (a file) records every tool execution across processes."""

    @tool(args=Env, approval="always")
    def deploy(args: Env, ctx: CallContext) -> str:
        """Deploys."""
        _record(ran, f"deploy {ctx.call_id}")
        return f"deployed {args.env}"

    @tool(args=Env)
    def status(args: Env, ctx: CallContext) -> str:
        """Reads."""
        _record(ran, f"status {ctx.call_id}")
        return f"{args.env}: green"

    @tool(args=NoArgs)
    def probe(args: NoArgs, ctx: CallContext) -> str:
        """Wedges forever in the process that is about to be killed."""
        _record(ran, f"probe {ctx.call_id}")
        if wedge:
            print("wedged", flush=True)
            threading.Event().wait()  # forever: only SIGKILL gets this process out
        return "probe ok"

    return AgentDefinition(tools=[deploy, status, probe], allow=["*"])


def sweep_model(request: ModelRequest) -> Reply:
    """Step 1 deploys (asks a human), step 2 checks, then the answer."""
    done = sum(1 for m in request.messages if m.role == "assistant")
    usage = Usage(100 + done, 10, 0.001)
    if done == 0:
        return Reply(tool_calls=[ToolCall("c-deploy", "deploy", {"env": "prod"})], usage=usage)
    if done == 1:
        return Reply(tool_calls=[ToolCall("c-status", "status", {"env": "prod"})], usage=usage)
    return Reply(text="deployed and checked", usage=usage)


def wedge_model(request: ModelRequest) -> Reply:
    """Step 1 checks, step 2 probes (and wedges in the doomed process), then the answer."""
    done = sum(1 for m in request.messages if m.role == "assistant")
    if done == 0:
        return Reply(tool_calls=[ToolCall("c-status", "status", {"env": "prod"})])
    if done == 1:
        return Reply(tool_calls=[ToolCall("c-probe", "probe", {})])
    return Reply(text="probed")


def runtime(store: EventStore, model: Any, ran: Path | None = None, *,
            wedge: bool = False) -> Runtime:
    resolver = StaticResolver({"scripted": ScriptedProvider(default=model)})
    return Runtime(store, resolver=resolver, agents=[definition(ran, wedge=wedge)])


def drive(rt: Runtime, session_id: UUID, start: Any) -> str:
    """Run ``start`` (a turn or a resume) in a thread, approving whatever it parks on."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["status"] = start().status
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            outcome["status"] = f"{type(exc).__name__}: {exc}"

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.monotonic() + DEADLINE
    while thread.is_alive():
        for call_id in rt.pending(session_id):
            rt.approve(session_id, call_id, by=APPROVER)
        if time.monotonic() > deadline:
            return "timeout"
        thread.join(0.01)
    return str(outcome["status"])


# --- the sweep ---------------------------------------------------------------------------------


def crash_job(uri: str, session_id: str, crash_at: int, when: str, report: str,
              ran: str) -> None:
    """Run the lane's turn and SIGKILL this process around the ``crash_at``-th append
    (``when`` is "before" or "after" the write); ``crash_at == 0`` runs to the end and reports
    how many appends there were."""
    store = open_store(uri)
    real_append = store.append
    count = 0

    def append(stream: str, records: Sequence[NewRecord],
               expected_version: ExpectedVersion) -> Any:
        nonlocal count
        count += 1
        if count == crash_at and when == "before":
            os.kill(os.getpid(), signal.SIGKILL)
        result = real_append(stream, records, expected_version)
        if count == crash_at and when == "after":
            os.kill(os.getpid(), signal.SIGKILL)
        return result

    store.append = append  # type: ignore[method-assign]
    rt = runtime(store, sweep_model, Path(ran)).start()
    sid = UUID(session_id)
    status = drive(rt, sid, lambda: rt.run_turn(sid, "deploy prod, then check it"))
    rt.close()  # drains the upkeep (the title)
    Path(report).write_text(json.dumps({"status": status, "appends": count}))
    store.close()


def resume_job(uri: str, session_id: str, report: str, ran: str) -> None:
    """A fresh process takes over as ``terret serve`` does: ``serve_start`` resumes every open
    turn — one parked on its approval once the verdict is recorded (an operator here approves
    what is pending) — and titles sessions a dead process left untitled; if the dead process
    never logged the turn at all, the user's request is run again. Then every projection is
    compared with a rebuild."""
    store = open_store(uri)
    rt = runtime(store, sweep_model, Path(ran))
    sid = UUID(session_id)
    names = [r.wire_name for r in store.read_stream(f"session-{sid}")]
    open_turn = "turn/start" in names and "turn/end" not in names
    resumed = sid in rt.serve_start() or open_turn
    action = "resume" if resumed else "none"
    deadline = time.monotonic() + DEADLINE
    while resumed and rt.resumable(sid) and time.monotonic() < deadline:
        for call_id in rt.pending(sid):
            rt.approve(sid, call_id, by=APPROVER)
        time.sleep(0.01)
    if not any(r.wire_name == "turn/start" for r in store.read_stream(f"session-{sid}")):
        action = "run"
        drive(rt, sid, lambda: rt.run_turn(sid, "deploy prod, then check it"))
    # A serving process catches up a dead one's title a beat interval after it starts (so that
    # workers started together agree which does it): this one stays that long, as serve does.
    while time.monotonic() < deadline and not any(
            r.wire_name == "session/titled" for r in store.read_stream(f"session-{sid}")):
        time.sleep(0.05)
    rt.catch_up_views()
    verify = {p.name: rt.runner.verify(p.name) for p in rt.runner.projections}
    rt.close()
    Path(report).write_text(json.dumps({"action": action, "verify": verify}))
    store.close()


# --- the kill -9 lane ---------------------------------------------------------------------------


def wedge_main(uri: str, session_id: str, ran: str) -> None:
    store = open_store(uri)
    rt = runtime(store, wedge_model, Path(ran), wedge=True).start()
    rt.run_turn(UUID(session_id), "check prod, then probe it")
    print("not wedged?!", flush=True)


def park_main(uri: str, session_id: str, ran: str) -> None:
    store = open_store(uri)
    rt = runtime(store, sweep_model, Path(ran)).start()
    sid = UUID(session_id)
    threading.Thread(target=lambda: rt.run_turn(sid, "deploy prod, then check it"),
                     daemon=True).start()
    deadline = time.monotonic() + DEADLINE
    while not rt.pending(sid) and time.monotonic() < deadline:
        time.sleep(0.01)
    print("parked", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    command, *argv = sys.argv[1:]
    main = {"wedge": wedge_main, "park": park_main}.get(command)
    if main is None:
        raise SystemExit(f"unknown command {command!r}")
    main(*argv)
