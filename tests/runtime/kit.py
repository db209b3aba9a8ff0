"""Test kit for the runtime suite: reading a session's log, waiting on conditions, tools that
record what they ran, building logs by hand through the ``Session`` aggregate (the shape a crash
leaves behind), and running a small script in another process against the same store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

from pydantic import BaseModel

from terret import (
    Actor,
    CallContext,
    Reply,
    Runtime,
    Session,
    SessionRepository,
    Tool,
    TurnResult,
    call,
    tool,
)
from terret.domain.store import EventStore, session_stream
from terret.runtime import Agent

REPO = Path(__file__).resolve().parents[2]
DEADLINE = 15.0


# --- the log -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Ev:
    seq: int
    name: str
    data: dict[str, Any]
    event_id: UUID


def read_log(store: EventStore, session_id: UUID) -> list[Ev]:
    return [
        Ev(r.seq, r.wire_name, json.loads(r.data), r.event_id)
        for r in store.read_stream(session_stream(session_id))
    ]


def names(log: Iterable[Ev]) -> list[str]:
    return [e.name for e in log]


def only(log: Iterable[Ev], name: str) -> list[Ev]:
    return [e for e in log if e.name == name]


def tool_results(store: EventStore, session_id: UUID) -> list[dict[str, Any]]:
    """The data of the session's ``tool/result`` events, in order."""
    return [e.data for e in only(read_log(store, session_id), "tool/result")]


def turn_end(store: EventStore, session_id: UUID) -> dict[str, Any]:
    """The data of the session's one ``turn/end``."""
    (end,) = only(read_log(store, session_id), "turn/end")
    return end.data


def first_index(log: list[Ev], name: str, **match: Any) -> int:
    for i, e in enumerate(log):
        if e.name == name and all(e.data.get(k) == v for k, v in match.items()):
            return i
    raise AssertionError(f"no {name} {match} in {names(log)}")


def wait_until(condition: Callable[[], Any], *, timeout: float = DEADLINE,
               what: str = "condition") -> Any:
    """Poll ``condition`` until it returns something truthy (and return it), or fail."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.01)


def wait_for_event(store: EventStore, session_id: UUID, name: str, *, count: int = 1,
                   timeout: float = DEADLINE) -> list[Ev]:
    return wait_until(lambda: len(only(read_log(store, session_id), name)) >= count
                      and read_log(store, session_id),
                      timeout=timeout, what=f"{count} x {name}")


def drain_upkeep(rt: Runtime) -> None:
    """Return once every between-turn task (compaction, titling, wakes) queued for the events
    appended so far has finished. A marker session is created; when a listener added now sees
    its ``session/started``, every listener has run for every earlier event (one runner thread
    delivers in log order). Then one task per upkeep worker, all waiting for each other, can only
    run once every task queued before them is done."""
    seen = threading.Event()
    marker = uuid4()
    handle = rt.runner.add_listener(
        lambda e: seen.set() if e.session_id == marker else None, {"session/started"})
    rt.create_session(session_id=marker)
    try:
        if not seen.wait(DEADLINE):
            raise AssertionError("the runner never delivered the marker session")
    finally:
        handle.remove()
    workers = rt._pool._max_workers  # noqa: SLF001 - the pool's width is not public
    barrier = threading.Barrier(workers + 1)
    for _ in range(workers):
        rt.background(lambda: barrier.wait(DEADLINE))
    barrier.wait(DEADLINE)


# --- turns in a background thread ---------------------------------------------------------


class Background:
    """Runs ``fn`` in a thread and keeps its result or exception."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self.result = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            self.error = exc

    def join(self, timeout: float = DEADLINE) -> Any:
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise AssertionError(f"background call still running after {timeout}s")
        if self.error is not None:
            raise self.error
        return self.result

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()


def turn_in_background(rt: Runtime, session_id: UUID, text: str | None) -> Background:
    return Background(lambda: rt.run_turn(session_id, text))


@dataclass
class HeldTurn:
    """A turn running in the background, held at its one model request until ``gate`` is set
    (``ScriptedProvider`` replying ``final()``)."""

    rt: Runtime
    sid: UUID
    gate: threading.Event
    job: Background


def held_turn(make_runtime: Callable[..., Runtime], gates: Callable[[], threading.Event],
              text: str = "go") -> HeldTurn:
    from terret import ScriptedProvider

    gate = gates()
    provider = ScriptedProvider([final(gate=gate)])
    rt = make_runtime(provider)
    sid = rt.create_session()
    job = turn_in_background(rt, sid, text)
    wait_until(lambda: provider.requests, what="the model request")
    return HeldTurn(rt, sid, gate, job)


def agent_of(rt: Runtime, session_id: UUID) -> Agent:
    agent = rt.agent_for_session(session_id)
    assert agent is not None, f"no agent for {session_id}"
    return agent


def status_of(rt: Runtime, session_id: UUID) -> str:
    """The session's status as the status view records it (call ``catch_up_views`` first)."""
    status = rt.views.status(session_id)
    assert status is not None, f"no status for {session_id}"
    return status.status


def wait_parked(rt: Runtime, session_id: UUID, count: int = 1) -> list[str]:
    return wait_until(lambda: len(rt.pending(session_id)) >= count and rt.pending(session_id),
                      what="a parked approval")


def approve_all(rt: Runtime, session_id: UUID, job: Background, *,
                by: Actor = Actor(actor="user")) -> TurnResult:  # noqa: B008
    """Approve whatever the turn parks on until it ends."""
    deadline = time.monotonic() + DEADLINE
    while not job.done:
        for call_id in rt.pending(session_id):
            rt.approve(session_id, call_id, by=by)
        if time.monotonic() > deadline:
            raise AssertionError("turn did not end")
        time.sleep(0.01)
    return job.join()


# --- tools ---------------------------------------------------------------------------------


class NoArgs(BaseModel):
    pass


class Env(BaseModel):
    env: str


class Count(BaseModel):
    n: int


@dataclass
class Kit:
    """Tools that record every execution: ``ran`` holds ``(tool, args)`` in order."""

    ran: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)
    entered: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        kit = self

        @tool(args=NoArgs)
        def noop(args: NoArgs, ctx: CallContext) -> str:
            """Does nothing."""
            kit.ran.append(("noop", {}))
            return "ok"

        @tool(args=Env, approval="always")
        def deploy(args: Env, ctx: CallContext) -> str:
            """Deploys (always asks a human)."""
            kit.ran.append(("deploy", {"env": args.env}))
            return f"deployed {args.env}"

        @tool(args=Env, approval="policy", mutating=True)
        def migrate(args: Env, ctx: CallContext) -> str:
            """Migrates a database (mutating: asks under policy)."""
            kit.ran.append(("migrate", {"env": args.env}))
            return f"migrated {args.env}"

        @tool(args=Env, approval="policy")
        def inspect(args: Env, ctx: CallContext) -> str:
            """Reads (not mutating: passes under policy)."""
            kit.ran.append(("inspect", {"env": args.env}))
            return f"{args.env} is fine"

        @tool(args=Env)
        def status(args: Env, ctx: CallContext) -> str:
            """Reads (approval never)."""
            kit.ran.append(("status", {"env": args.env}))
            return f"{args.env}: green"

        @tool(args=Count)
        def count(args: Count, ctx: CallContext) -> int:
            """Takes a typed argument."""
            kit.ran.append(("count", {"n": args.n}))
            return args.n + 1

        @tool(args=NoArgs)
        def boom(args: NoArgs, ctx: CallContext) -> str:
            """Raises."""
            kit.ran.append(("boom", {}))
            raise RuntimeError("the disk is on fire")

        @tool(args=NoArgs)
        def slow(args: NoArgs, ctx: CallContext) -> str:
            """Blocks until the test releases it."""
            kit.ran.append(("slow", {}))
            kit.entered.set()
            if not kit.release.wait(DEADLINE):
                raise TimeoutError("never released")
            return "finally"

        self.noop, self.deploy, self.migrate, self.inspect = noop, deploy, migrate, inspect
        self.status, self.count, self.boom, self.slow = status, count, boom, slow

    @property
    def tools(self) -> list[Tool]:
        return [self.noop, self.deploy, self.migrate, self.inspect, self.status, self.count,
                self.boom, self.slow]


def final(text: str = "done", **kw: Any) -> Reply:
    return Reply(text=text, **kw)


def calls(*specs: tuple[str, dict[str, Any]] | tuple[str, dict[str, Any], str],
          **kw: Any) -> Reply:
    return Reply(tool_calls=[call(*s) for s in specs], **kw)


# --- logs built by hand (what a crash leaves behind) ---------------------------------------


class LogBuilder:
    """Drives the ``Session`` aggregate directly and saves after every command, as the loop
    would; stop anywhere to leave the log a dead process leaves."""

    def __init__(self, store: EventStore, session_id: UUID) -> None:
        self.repository = SessionRepository(store)
        self.session_id = session_id

    def do(self, command: Callable[[Session], Any]) -> Any:
        session = self.repository.get(self.session_id)
        value = command(session)
        self.repository.save(session)
        return value


# --- another process -------------------------------------------------------------------------


def other_process(store_uri: str, *args: str, timeout: float = 60.0,
                  returncode: int = 0) -> dict[str, Any]:
    """Run ``tests/runtime/proc.py`` in a fresh interpreter against the same store; returns
    the JSON it prints. ``returncode`` is the exit status expected (9: it killed itself)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "tests.runtime.proc", store_uri, *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout,
    )
    if done.returncode != returncode:
        raise AssertionError(f"other process exited {done.returncode}, not {returncode}:\n"
                             f"{done.stderr}")
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else {}
