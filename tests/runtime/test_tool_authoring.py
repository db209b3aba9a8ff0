"""Tools as an application developer writes them (docs/runtime.md, *Tools, approvals and the
allow-list*): what is refused where the tool is defined, ``async def`` handlers, handlers that
fail in odd ways, and stops whose message the log could not hold. Through the public API, on
SQLite and on the EventStoreDB adapter (emulator); a second process resumes where it matters."""

from __future__ import annotations

import asyncio
import functools
import math
from datetime import datetime
from typing import Any

import pytest

from terret import CallContext, ScriptedProvider, Tool, tool
from terret.domain.errors import ConfigurationError
from terret.runtime import Veto
from tests.runtime.conftest import MakeRuntime
from tests.runtime.kit import Background, NoArgs, calls, final, tool_results, turn_end


def the_result_of_one_call(make_runtime: MakeRuntime, store: Any, one: Tool) -> dict[str, Any]:
    """A turn in which the model calls ``one`` once, then answers: it completes, and the call's
    one ``tool/result``."""
    rt = make_runtime([calls((one.name, {})), final()], tools=[one])
    sid = rt.create_session()
    assert rt.run_turn(sid, "go").status == "completed"
    (result,) = tool_results(store, sid)
    return result


def _handler(args: NoArgs, ctx: CallContext) -> str:
    return "ran"


# --- refused where the tool is defined -----------------------------------------------------


@pytest.mark.parametrize("timeout", [0, -1, math.nan, "30", True, 10**400])
def test_a_timeout_that_is_not_seconds_above_zero_is_refused(timeout: Any) -> None:
    with pytest.raises(ConfigurationError, match="timeout is seconds above 0"):
        tool(args=NoArgs, timeout=timeout)(_handler)


@pytest.mark.parametrize("name", ["has space", "line\nbreak", "x" * 65, "", "<lambda>", 123])
def test_a_name_model_apis_refuse_is_refused(name: Any) -> None:
    with pytest.raises(ConfigurationError, match="1 to 64 letters, digits"):
        Tool(name=name, description="d", args=NoArgs, handler=_handler)
    # The decorator too: an empty name given to it took the function's name instead.
    with pytest.raises(ConfigurationError, match="1 to 64 letters, digits"):
        tool(name, args=NoArgs)(_handler)


def test_a_lambda_needs_a_name_and_a_partial_without_one_says_so() -> None:
    with pytest.raises(ConfigurationError, match="1 to 64"):
        tool(args=NoArgs)(lambda a, c: "x")
    assert tool("quick", args=NoArgs)(lambda a, c: "x").name == "quick"
    partial = functools.partial(lambda prefix, a, c: prefix, "p")
    with pytest.raises(ConfigurationError, match="has no __name__: give the tool a name"):
        tool(args=NoArgs)(partial)
    assert tool("prefixed", args=NoArgs)(partial).name == "prefixed"


def test_a_handler_that_cannot_be_called_as_handler_args_ctx_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="not callable"):
        Tool(name="t", description="d", args=NoArgs, handler="not a function")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"called as handler\(args, ctx\)"):
        tool("one_arg", args=NoArgs)(lambda args: "x")  # type: ignore[arg-type, misc]
    with pytest.raises(ConfigurationError, match=r"called as handler\(args, ctx\)"):
        tool("three", args=NoArgs)(lambda a, c, extra: "x")  # type: ignore[arg-type, misc]
    assert tool("defaults", args=NoArgs)(lambda a, c, extra=1: "x").name == "defaults"


def test_a_generator_function_is_refused() -> None:
    def lines(args: NoArgs, ctx: CallContext) -> Any:
        yield "a"

    async def alines(args: NoArgs, ctx: CallContext) -> Any:
        yield "a"

    for handler in (lines, alines):
        with pytest.raises(ConfigurationError, match="generator function"):
            tool(args=NoArgs)(handler)


# --- async handlers ---------------------------------------------------------------------------


@pytest.mark.parametrize("timeout", [None, 30.0], ids=["on the turn's thread", "with a timeout"])
def test_an_async_handler_is_awaited_and_its_result_recorded(
        make_runtime: MakeRuntime, store: Any, timeout: float | None) -> None:
    ran: list[str] = []

    @tool(args=NoArgs, timeout=timeout)
    async def fetch(args: NoArgs, ctx: CallContext) -> str:
        """Awaits something."""
        await asyncio.sleep(0.01)
        ran.append(ctx.call_id)
        return f"fetched for {ctx.call_id}"

    result = the_result_of_one_call(make_runtime, store, fetch)
    assert len(ran) == 1
    assert result["is_error"] is False and result["content"] == f"fetched for {ran[0]}"


def test_an_async_handler_runs_when_run_turn_is_called_inside_an_event_loop(
        make_runtime: MakeRuntime, store: Any) -> None:
    @tool(args=NoArgs)
    async def fetch(args: NoArgs, ctx: CallContext) -> str:
        """Awaits something."""
        await asyncio.sleep(0)
        return "fetched"

    rt = make_runtime([calls(("fetch", {})), final()], tools=[fetch])
    sid = rt.create_session()

    async def app() -> str:  # an async web handler calling the (blocking) runtime
        return rt.run_turn(sid, "go").status

    assert asyncio.run(app()) == "completed"
    (result,) = tool_results(store, sid)
    assert result == {**result, "is_error": False, "content": "fetched"}


def test_an_async_handler_sees_the_callers_context_variables_inside_a_running_loop(
        make_runtime: MakeRuntime, store: Any) -> None:
    import contextvars

    request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id",
                                                                    default="<unset>")

    @tool(args=NoArgs)
    async def whoami(args: NoArgs, ctx: CallContext) -> str:
        """Says which request it serves."""
        return request_id.get()

    rt = make_runtime([calls(("whoami", {})), final()], tools=[whoami])
    sid = rt.create_session()

    async def handler() -> str:  # a web request calling the runtime on the loop's thread
        request_id.set("req-42")
        return rt.run_turn(sid, "go").status

    assert asyncio.run(handler()) == "completed"
    assert tool_results(store, sid)[0]["content"] == "req-42"


def test_an_async_handler_that_raises_is_an_error_result(
        make_runtime: MakeRuntime, store: Any) -> None:
    @tool(args=NoArgs)
    async def broken(args: NoArgs, ctx: CallContext) -> str:
        """Fails after an await."""
        await asyncio.sleep(0)
        raise asyncio.CancelledError("the upstream call was cancelled")

    result = the_result_of_one_call(make_runtime, store, broken)
    assert result["is_error"] and result["content"].startswith("CancelledError")


# --- handlers failing in odd ways -------------------------------------------------------------


class Unprintable(Exception):
    def __str__(self) -> str:
        raise AttributeError("no message for you")


class NotAnException(BaseException):
    pass


@pytest.mark.parametrize("raised", [Unprintable(), NotAnException("odd"), GeneratorExit()],
                         ids=["__str__ raises", "BaseException subclass", "GeneratorExit"])
def test_a_handler_failure_that_is_no_stop_is_an_error_result_and_the_turn_goes_on(
        make_runtime: MakeRuntime, store: Any, raised: BaseException) -> None:
    @tool(args=NoArgs)
    def odd(args: NoArgs, ctx: CallContext) -> str:
        """Fails oddly."""
        raise raised

    result = the_result_of_one_call(make_runtime, store, odd)
    assert result["is_error"] and result["content"].startswith(type(raised).__name__)
    assert "was not run" not in result["content"]


def test_results_are_rendered_as_documented(make_runtime: MakeRuntime, store: Any) -> None:
    values: list[Any] = [{"at": datetime(2026, 1, 2, 3, 4, 5)}, {"x": math.nan},
                         {(1, 2): "tuple key"}]
    returned = iter(values)

    @tool(args=NoArgs)
    def give(args: NoArgs, ctx: CallContext) -> Any:
        """Returns the next value."""
        return next(returned)

    rt = make_runtime([calls(("give", {}), ("give", {}), ("give", {})), final()], tools=[give])
    sid = rt.create_session()
    assert rt.run_turn(sid, "go").status == "completed"
    contents = [r["content"] for r in tool_results(store, sid)]
    assert contents == ['{"at": "2026-01-02 03:04:05"}', str({"x": math.nan}),
                        str({(1, 2): "tuple key"})]


def test_a_pre_execute_hook_returning_something_else_than_a_veto_says_so(
        make_runtime: MakeRuntime, store: Any) -> None:
    def hook(t: Tool, ctx: CallContext) -> Any:
        return False  # meant "do not veto"

    rt = make_runtime([calls(("give", {})), calls(("give", {})), final()],
                      tools=[tool("give", args=NoArgs)(_handler)])
    rt.tool_context.pre_execute.append(hook)
    sid = rt.create_session()
    with pytest.raises(ConfigurationError, match="returned False: a hook returns None or a "
                                                 "terret.runtime.Veto"):
        rt.run_turn(sid, "go")
    assert turn_end(store, sid)["status"] == "failed"
    rt.tool_context.pre_execute[-1] = lambda t, ctx: Veto("not today")
    assert rt.run_turn(sid, "again").status == "completed"
    assert tool_results(store, sid)[-1]["content"] == "vetoed: not today"


def test_two_calls_under_one_id_in_a_reply_are_told_apart_and_both_run(
        make_runtime: MakeRuntime, store: Any) -> None:
    """Any provider's reply, not only the HTTP ones: the log refuses a reply whose calls share
    an id, and the turn failed with nothing of the reply recorded."""
    seen: list[str] = []

    @tool(args=NoArgs)
    def look(args: NoArgs, ctx: CallContext) -> str:
        """Looks."""
        seen.append(ctx.call_id)
        return f"looked as {ctx.call_id}"

    rt = make_runtime([calls(("look", {}, "dup"), ("look", {}, "dup")), final()], tools=[look])
    sid = rt.create_session()
    assert rt.run_turn(sid, "go").status == "completed"
    assert seen == ["dup", "dup-2"]
    assert [r["call_id"] for r in tool_results(store, sid)] == ["dup", "dup-2"]


@pytest.mark.parametrize(("call_id", "args"), [("c1", [1, 2]), ("c1", "x=1"), (["c1"], {})],
                         ids=["list arguments", "string arguments", "an id that is a list"])
def test_a_call_of_another_shape_fails_the_step_as_a_malformed_reply(
        make_runtime: MakeRuntime, store: Any, call_id: Any, args: Any) -> None:
    from terret import Reply
    from terret.domain.errors import MalformedStream
    from terret.domain.messages import ToolCall

    rt = make_runtime([Reply(tool_calls=[ToolCall(id=call_id, name="look", args=args)])],
                      tools=[tool("look", args=NoArgs)(_handler)])
    sid = rt.create_session()
    with pytest.raises(MalformedStream, match="arguments that are a JSON object"):
        rt.run_turn(sid, "go")
    assert turn_end(store, sid)["error"].startswith("MalformedStream: ")


def _nested(levels: int) -> dict[str, Any]:
    args: dict[str, Any] = {}
    for _ in range(levels - 1):
        args = {"a": args}
    return args


@pytest.mark.parametrize(("args", "problem"), [
    ({"n": 10**4300}, r"tool call 'look'.*args\.n.*4300 digits"),
    (_nested(191), r"tool call 'look' are nested more than 190 levels deep"),
    (_nested(199), r"tool call 'look' are nested more than 190 levels deep"),
], ids=["a 4301-digit integer", "191 levels", "199 levels"])
def test_a_call_the_log_could_not_read_back_fails_the_turn_keeping_the_reply_s_cost(
        make_runtime: MakeRuntime, store: Any, opened: Any, args: dict[str, Any],
        problem: str) -> None:
    """A call whose arguments hold an integer of more than 4300 digits (which no reader parses
    from JSON) was written in the reply's ``assistant/message``: every later read of the
    session failed, in every process. Now it is a malformed reply, recorded without its calls
    but with the usage it was billed (R31); the session goes on, read from another process.
    So is one nested past the 190 levels the HTTP providers accept: 191 to 197 were taken, and
    198 or 199 failed the step with the payload's error, its reply and usage lost."""
    from terret import Reply, Usage
    from terret.domain.errors import MalformedStream
    from terret.domain.messages import ToolCall
    from tests.runtime.kit import other_process, read_log

    billed = Usage(prompt_tokens=10, completion_tokens=5, cost=0.25)
    rt = make_runtime([Reply(text="counting", usage=billed, tool_calls=[
        ToolCall(id="c1", name="look", args=args)]), final("fine")],
        tools=[tool("look", args=NoArgs)(_handler)])
    sid = rt.create_session()
    with pytest.raises(MalformedStream, match=problem):
        rt.run_turn(sid, "go")
    end = turn_end(store, sid)
    assert end["status"] == "failed" and end["error"].startswith("MalformedStream: ")
    (reply,) = [e.data for e in read_log(store, sid) if e.name == "assistant/message"]
    assert reply["text"] == "counting" and not reply.get("tool_calls")
    assert reply["usage"]["cost"] == 0.25
    assert rt.run_turn(sid, "again").status == "completed"
    usage = other_process(opened.uri, "usage", str(sid))  # the log reads back there too
    assert usage["cost"] == 0.25 and usage["steps"] == 2, usage


# --- stops and failures whose message the log could not hold ----------------------------------

LONE_SURROGATE = "report-\udcff.csv"  # a file name that was not UTF-8


@pytest.mark.parametrize("message", [f"cannot parse {LONE_SURROGATE}", "x" * 3_000_000],
                         ids=["lone surrogate", "3 MB"])
def test_a_stop_with_a_message_the_log_cannot_hold_closes_the_turn_and_runs_nothing_twice(
        make_runtime: MakeRuntime, store: Any, message: str) -> None:
    runs: list[str] = []

    @tool(args=NoArgs)
    def parse(args: NoArgs, ctx: CallContext) -> str:
        """Gives up on a file."""
        runs.append(ctx.call_id)
        raise SystemExit(message)

    rt = make_runtime([calls(("parse", {})), final()], tools=[parse])
    sid = rt.create_session()
    job = Background(lambda: rt.run_turn(sid, "go"))
    with pytest.raises(SystemExit):
        job.join(timeout=30)
    end = turn_end(store, sid)
    assert end["status"] == "failed" and end["error"].startswith("SystemExit: ")
    assert len(end["error"].encode()) <= 256 * 1024 + 200
    assert not rt.resumable(sid)
    other = make_runtime(ScriptedProvider([final()]), tools=[parse])  # as a second process
    assert not other.resumable(sid)
    assert len(runs) == 1


def test_a_hook_failing_with_megabytes_of_message_fails_the_turn_with_its_own_error(
        make_runtime: MakeRuntime, store: Any) -> None:
    def hook(t: Tool, ctx: CallContext) -> Veto | None:
        raise RuntimeError("policy service said: " + "y" * 2_000_000)

    rt = make_runtime([calls(("give", {})), final()],
                      tools=[tool("give", args=NoArgs)(_handler)])
    rt.tool_context.pre_execute.append(hook)
    sid = rt.create_session()
    with pytest.raises(RuntimeError, match="policy service said"):
        rt.run_turn(sid, "go")
    end = turn_end(store, sid)
    assert end["status"] == "failed" and end["error"].startswith("RuntimeError: policy service")
    assert "truncated by terret" in end["error"]
    assert not rt.resumable(sid)
