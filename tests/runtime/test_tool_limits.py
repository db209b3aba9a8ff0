"""Tool results the store cannot hold, tools that hang, tools that stop the process (issue 11).

Each case runs through the public API on SQLite and on the EventStoreDB adapter, and checks the
log: the call's ``tool/result`` and the turn's ``turn/end``.
"""

from __future__ import annotations

import _thread
import json
import threading
import time
from collections.abc import Iterator

import pytest

from terret import Actor, CallContext, RuntimeConfig, ScriptedProvider, tool
from terret.domain.errors import ConfigurationError
from terret.domain.events import ToolCallData
from tests.runtime.conftest import MakeRuntime, OpenedStore
from tests.runtime.kit import (
    Background,
    LogBuilder,
    NoArgs,
    calls,
    final,
    other_process,
    tool_results,
    turn_end,
    turn_in_background,
    wait_until,
)

MiB = 1024 * 1024
MAX_RESULT_BYTES = 256 * 1024  # as docs/runtime.md states it
TRUNCATED_MARK = "[truncated by terret:"


def _stored_size(content: str) -> int:
    """A result's size as the docs measure it: its JSON string encoding, without the quotes."""
    return len(json.dumps(content, ensure_ascii=False).encode()) - 2




class Hang:
    """What a hanging handler waits on. At teardown — before the runtimes and the store close —
    it is released and the tracked turns are waited for, so no thread outlives its store."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.jobs: list[Background] = []

    def wait(self, seconds: float) -> None:
        self.release.wait(seconds)

    def track(self, job: Background) -> Background:
        self.jobs.append(job)
        return job


@pytest.fixture
def hang(make_runtime: MakeRuntime) -> Iterator[Hang]:
    made = Hang()
    yield made
    made.release.set()
    deadline = time.monotonic() + 15
    for job in made.jobs:
        job._thread.join(max(0.0, deadline - time.monotonic()))  # noqa: SLF001


# --- results the store cannot hold ------------------------------------------------------


def test_an_oversize_result_is_truncated_with_a_marker_and_the_turn_goes_on(
        make_runtime: MakeRuntime, store) -> None:
    @tool(args=NoArgs)
    def dump(args: NoArgs, ctx: CallContext) -> str:
        """Returns 2 MiB."""
        return "x" * (2 * MiB)

    @tool(args=NoArgs)
    def zeros(args: NoArgs, ctx: CallContext) -> str:
        """300,000 NULs: 0.3 MB of text, 1.8 MB as stored (each is escaped as \\u0000)."""
        return "\x00" * 300_000

    provider = ScriptedProvider([calls(("dump", {}), ("zeros", {})), final("read it")])
    rt = make_runtime(provider, tools=[dump, zeros])
    sid = rt.create_session()
    result = rt.run_turn(sid, "dump it")
    assert result.status == "completed"
    assert turn_end(store, sid)["status"] == "completed"
    assert not rt.resumable(sid)
    big, nul = tool_results(store, sid)
    for data in (big, nul):
        assert data["is_error"] is False  # the start of the output is still the output
        assert _stored_size(data["content"]) <= MAX_RESULT_BYTES
        assert TRUNCATED_MARK in data["content"]
    # As docs/runtime.md shows it: the first 262,035 bytes, a blank line, the marker.
    assert big["content"] == "x" * 262_035 + (
        "\n\n[truncated by terret: the result was 2,097,152 bytes, over the limit of 262,144; "
        "only its start is shown]")
    assert f"{2 * MiB:,} bytes" in big["content"]  # what it was
    assert f"{6 * 300_000:,} bytes" in nul["content"]  # measured as stored
    assert nul["content"].startswith("\x00" * 1000)
    seen = [m.text for m in provider.requests[1].messages if m.role == "tool"]
    assert seen == [big["content"], nul["content"]]  # the model saw the truncated results


def test_a_resumed_turn_owing_an_oversize_result_completes(make_runtime: MakeRuntime,
                                                          store) -> None:
    """A process died after the model asked for the call: resume runs it again, and the result
    that could never be stored before no longer keeps the turn open."""
    @tool(args=NoArgs)
    def dump(args: NoArgs, ctx: CallContext) -> str:
        """Returns 3 MiB."""
        return "z" * (3 * MiB)

    rt = make_runtime([final("resumed")], tools=[dump])
    sid = rt.create_session()
    builder = LogBuilder(store, sid)
    builder.do(lambda s: s.start_turn(text="dump it"))
    builder.do(lambda s: s.start_step("scripted:default"))
    builder.do(lambda s: s.record_assistant("", [ToolCallData(id="c-1", name="dump", args={})]))
    assert rt.resumable(sid)
    result = rt.resume_turn(sid)
    assert (result.status, result.text) == ("completed", "resumed")
    assert turn_end(store, sid)["status"] == "completed"
    (res,) = tool_results(store, sid)
    assert res["is_error"] is False and TRUNCATED_MARK in res["content"]
    assert not rt.resumable(sid)


def test_a_result_under_the_limit_is_kept_whole(make_runtime: MakeRuntime, store) -> None:
    text = "y" * MAX_RESULT_BYTES  # exactly the limit

    @tool(args=NoArgs)
    def fits(args: NoArgs, ctx: CallContext) -> str:
        """Returns just under the limit."""
        return text

    rt = make_runtime([calls(("fits", {})), final()], tools=[fits])
    sid = rt.create_session()
    assert rt.run_turn(sid, "go").status == "completed"
    assert tool_results(store, sid)[0]["content"] == text


def test_lone_surrogates_are_replaced_so_the_result_is_stored(make_runtime: MakeRuntime,
                                                              store) -> None:
    @tool(args=NoArgs)
    def mangled(args: NoArgs, ctx: CallContext) -> str:
        """Returns text with a lone surrogate (as surrogateescape decoding leaves them)."""
        return b"caf\xe9 ok".decode("utf-8", "surrogateescape") + " \ud83d\ude00"

    @tool(args=NoArgs)
    def fails(args: NoArgs, ctx: CallContext) -> str:
        """Raises with a lone surrogate in its message."""
        raise RuntimeError("bad \ud800 byte")

    provider = ScriptedProvider([calls(("mangled", {}), ("fails", {})), final()])
    rt = make_runtime(provider, tools=[mangled, fails])
    sid = rt.create_session()
    assert rt.run_turn(sid, "go").status == "completed"
    assert turn_end(store, sid)["status"] == "completed"
    ok, err = tool_results(store, sid)
    # A lone surrogate becomes U+FFFD; a surrogate pair becomes the character it encodes.
    assert ok == {"call_id": ok["call_id"], "name": "mangled",
                  "content": "caf\ufffd ok \U0001f600", "is_error": False}
    assert err["is_error"] is True and err["content"] == "RuntimeError: bad \ufffd byte"
    assert not rt.resumable(sid)


# --- timeouts ---------------------------------------------------------------------------


def test_a_tool_past_its_timeout_becomes_an_error_result_and_the_turn_goes_on(
        make_runtime: MakeRuntime, store, hang: Hang) -> None:
    entered = threading.Event()

    @tool(args=NoArgs, timeout=0.3)
    def stuck(args: NoArgs, ctx: CallContext) -> str:
        """Hangs."""
        entered.set()
        hang.wait(60)
        return "never seen"

    provider = ScriptedProvider([calls(("stuck", {})), final("gave up on it")])
    rt = make_runtime(provider, tools=[stuck])
    sid = rt.create_session()
    started = time.monotonic()
    job = hang.track(turn_in_background(rt, sid, "go"))
    result = job.join(timeout=10)
    assert time.monotonic() - started < 10
    assert entered.is_set()
    assert result.status == "completed" and result.text == "gave up on it"
    (res,) = tool_results(store, sid)
    assert res["is_error"] is True
    assert res["content"] == "stuck timed out after 0.3 s"
    assert turn_end(store, sid)["status"] == "completed"
    seen = [m for m in provider.requests[1].messages if m.role == "tool"]
    assert [(m.text, m.is_error) for m in seen] == [("stuck timed out after 0.3 s", True)]


def test_the_runtime_default_timeout_applies_and_a_tool_s_own_overrides_it(
        make_runtime: MakeRuntime, store, hang: Hang) -> None:
    @tool(args=NoArgs)
    def stuck(args: NoArgs, ctx: CallContext) -> str:
        """Hangs, under the runtime's default."""
        hang.wait(60)
        return "never seen"

    @tool(args=NoArgs, timeout=5.0)
    def patient(args: NoArgs, ctx: CallContext) -> str:
        """Takes longer than the default, less than its own timeout."""
        time.sleep(0.6)
        return "took its time"

    rt = make_runtime([calls(("stuck", {}), ("patient", {})), final()], tools=[stuck, patient],
                      config=RuntimeConfig(tool_timeout=0.2))
    sid = rt.create_session()
    assert hang.track(turn_in_background(rt, sid, "go")).join(timeout=10).status == "completed"
    first, second = tool_results(store, sid)
    assert (first["content"], first["is_error"]) == ("stuck timed out after 0.2 s", True)
    assert (second["content"], second["is_error"]) == ("took its time", False)


def test_a_timeout_must_be_positive() -> None:
    with pytest.raises(ConfigurationError, match="timeout"):  # more: test_tool_authoring.py
        tool("t", args=NoArgs, timeout=0)(lambda a, c: "x")


# --- cancelling a turn whose tool hangs -------------------------------------------------


def test_a_cancel_from_another_process_closes_the_turn_while_its_tool_hangs(
        make_runtime: MakeRuntime, opened: OpenedStore, store, hang: Hang) -> None:
    entered = threading.Event()

    @tool(args=NoArgs, timeout=120)  # far away: only the cancel ends this call in time
    def stuck(args: NoArgs, ctx: CallContext) -> str:
        """Hangs."""
        entered.set()
        hang.wait(120)
        return "never seen"

    provider = ScriptedProvider([calls(("stuck", {}), ("stuck", {})), final()])
    rt = make_runtime(provider, tools=[stuck])
    sid = rt.create_session()
    job = hang.track(turn_in_background(rt, sid, "go"))
    assert entered.wait(10)
    other_process(opened.uri, "cancel", str(sid))
    result = job.join(timeout=15)
    assert result.status == "cancelled"
    end = turn_end(store, sid)
    assert end["status"] == "cancelled"
    assert end["by"] == {"actor": "operator", "id": "proc"}
    abandoned, second = tool_results(store, sid)
    assert abandoned["is_error"] is True
    assert abandoned["content"].startswith("stuck was abandoned: the turn was cancelled")
    assert second["is_error"] is True and "was not run" in second["content"]
    assert not rt.resumable(sid)
    assert len(provider.requests) == 1  # the model was not asked again


def test_without_a_timeout_a_cancel_is_honoured_when_the_handler_returns(
        make_runtime: MakeRuntime, opened: OpenedStore, store) -> None:
    entered, release = threading.Event(), threading.Event()

    @tool(args=NoArgs)  # no timeout: the handler runs on the turn's own thread
    def slow(args: NoArgs, ctx: CallContext) -> str:
        """Takes its time."""
        entered.set()
        release.wait(30)
        return "finished"

    provider = ScriptedProvider([calls(("slow", {}), ("slow", {})), final()])
    rt = make_runtime(provider, tools=[slow])
    sid = rt.create_session()
    job = turn_in_background(rt, sid, "go")
    assert entered.wait(10)
    # The cancel must be honoured from the log, even before it reaches this process's
    # subscription: hold the runner back until both calls are answered.
    with rt.runner._pause:
        other_process(opened.uri, "cancel", str(sid))
        release.set()
        wait_until(lambda: len(tool_results(store, sid)) == 2, what="both calls answered")
    assert job.join(timeout=15).status == "cancelled"
    first, second = tool_results(store, sid)
    assert (first["is_error"], first["content"]) == (False, "finished")  # it ran: it is kept
    assert second["is_error"] is True and "was not run" in second["content"]
    assert len(provider.requests) == 1


def test_a_cancel_in_this_process_closes_the_turn_before_the_timeout_fires(
        make_runtime: MakeRuntime, store, hang: Hang) -> None:
    entered = threading.Event()

    @tool(args=NoArgs, timeout=60)
    def stuck(args: NoArgs, ctx: CallContext) -> str:
        """Hangs for longer than the test waits."""
        entered.set()
        hang.wait(120)
        return "never seen"

    rt = make_runtime([calls(("stuck", {})), final()], tools=[stuck])
    sid = rt.create_session()
    job = hang.track(turn_in_background(rt, sid, "go"))
    assert entered.wait(10)
    rt.cancel(sid, by=Actor(actor="user", id="u1"), reason="taking too long")
    assert job.join(timeout=10).status == "cancelled"
    end = turn_end(store, sid)
    assert (end["status"], end["reason"]) == ("cancelled", "taking too long")
    (res,) = tool_results(store, sid)
    assert res["is_error"] and "abandoned" in res["content"]


# --- KeyboardInterrupt and SystemExit ---------------------------------------------------


@pytest.mark.parametrize("stop", [KeyboardInterrupt, SystemExit])
def test_a_handler_raising_a_stop_closes_the_turn_failed_and_the_stop_propagates(
        make_runtime: MakeRuntime, store, stop: type[BaseException]) -> None:
    @tool(args=NoArgs)
    def quitter(args: NoArgs, ctx: CallContext) -> str:
        """Stops the process."""
        raise stop(3) if stop is SystemExit else stop()

    provider = ScriptedProvider([calls(("quitter", {}), ("quitter", {})), final()])
    rt = make_runtime(provider, tools=[quitter])
    sid = rt.create_session()
    job = Background(lambda: rt.run_turn(sid, "go"))
    with pytest.raises(stop):
        job.join(timeout=10)
    end = turn_end(store, sid)
    assert end["status"] == "failed"
    assert end["error"].startswith(stop.__name__)
    first, second = tool_results(store, sid)
    assert first["is_error"] is True
    assert first["content"].startswith(f"quitter was interrupted: {stop.__name__}")
    assert "was not run" in second["content"]  # the stop ends the turn: no second run
    assert not rt.resumable(sid)
    assert len(provider.requests) == 1


def test_ctrl_c_while_a_tool_runs_closes_the_turn_failed_and_reaches_the_caller(
        make_runtime: MakeRuntime, store, hang: Hang) -> None:
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("a Ctrl-C lands in the main thread")

    @tool(args=NoArgs)
    def long(args: NoArgs, ctx: CallContext) -> str:
        """The user presses Ctrl-C while this runs."""
        _thread.interrupt_main()
        hang.wait(2)
        return "too late"

    rt = make_runtime([calls(("long", {})), final("again")], tools=[long])
    sid = rt.create_session()
    with pytest.raises(KeyboardInterrupt):
        rt.run_turn(sid, "go")  # in the main thread, as a CLI runs it
    end = turn_end(store, sid)
    assert end["status"] == "failed" and end["error"].startswith("KeyboardInterrupt")
    (res,) = tool_results(store, sid)
    assert res["is_error"] and res["content"].startswith("long was interrupted: KeyboardInterrupt")
    assert not rt.resumable(sid)
    assert rt.run_turn(sid, "again").status == "completed"  # the session goes on
