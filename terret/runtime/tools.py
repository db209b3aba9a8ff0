"""Tools and the tools pipeline (R8, R9).

A ``Tool`` has a pydantic arguments model (its JSON schema is what the model is shown), an
approval mode and a handler. A call runs through the pipeline: arguments are validated, the
pre-execute waterfall runs (parent context first, then each forked context: the per-agent
allow-list lives there), then the execute stage (the approvals gate, then the handler). Every
failure on the way becomes a tool-result error the model sees; none of them ends the turn —
but a pre-execute hook that raises, or returns something else than a ``Veto`` or None.

The handler runs on a worker thread of its own, so the turn can stop waiting for it: past its
timeout the call is an error result ("timed out after N s"), and when the turn's cancel event is
set the call is abandoned and the turn closes cancelled. An abandoned handler is not stopped (a
thread cannot be): it may still be running, and whatever it returns is dropped. A
``KeyboardInterrupt`` or ``SystemExit`` — raised by the handler, or arriving in the turn's thread
while it waits — is recorded as the call's error result and then re-raised: the turn closes
``failed`` and the stop reaches the caller.

Every result is made storable before the loop records it: lone surrogates become U+FFFD and a
result over ``MAX_RESULT_BYTES`` is cut, with a marker saying so.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
import logging
import re
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal
from uuid import NAMESPACE_URL, UUID, uuid5

import pydantic_core
from pydantic import BaseModel, ValidationError

from terret.domain.errors import ConfigurationError, require_flags, shown
from terret.domain.payloads import describe_validation
from terret.runtime._handlers import handed_over
from terret.runtime.model import ToolSpec
from terret.runtime.stops import TurnCancelled

log = logging.getLogger("terret.tools")

ApprovalMode = Literal["never", "policy", "always"]

MAX_RESULT_BYTES = 256 * 1024
"""The most a tool result's content may take in its ``tool/result`` event, measured as stored:
the UTF-8 bytes of its JSON string encoding without the quotes (an escaped control character
counts six bytes). A longer result is cut to fit, marker included. It leaves room under the
stores' 1 MiB limit (``terret.domain.store.MAX_RECORD_BYTES``, which on EventStoreDB bounds a
whole append) for the events a result is appended with."""

TRUNCATED_MARK = "[truncated by terret:"
"""How the marker a cut result ends with begins."""


IDEMPOTENCY_NAMESPACE = uuid5(NAMESPACE_URL, "terret:idempotency-key")
"""The UUID namespace of idempotency keys (``CallContext.idempotency_key``)."""


@dataclass(frozen=True)
class CallContext:
    """What a hook or handler knows about the call it is running."""

    session_id: UUID
    call_id: str
    name: str
    args: dict[str, Any]
    turn: int
    step: int = 0
    """The step whose reply made the call (0: not known)."""
    first_step: int = 0
    """The step of the turn's first reply that used this call id (0: not known)."""

    @property
    def idempotency_key(self) -> str:
        """A key for this call that every execution of it shares (the first run, a run after
        a crash, a re-run an operator allowed) and no other call has: a UUID derived from the
        session, the turn and the call id — and the step, when a later step of the turn
        reuses the id for another call. Pass it to downstream APIs that deduplicate requests
        (``Idempotency-Key`` headers, client tokens)."""
        name = f"{self.session_id}/{self.turn}/{self.call_id}"
        if self.step and self.first_step and self.step != self.first_step:
            name += f"/step-{self.step}"
        return str(uuid5(IDEMPOTENCY_NAMESPACE, name))


Handler = Callable[[Any, CallContext], Any]


@dataclass(frozen=True)
class Tool:
    """A tool definition. ``approval``: ``never`` passes through, ``always`` asks, ``policy``
    asks when ``mutating`` (R8)."""

    name: str
    description: str
    args: type[BaseModel]
    handler: Handler
    approval: ApprovalMode = "never"
    mutating: bool = False
    timeout: float | None = None
    """Seconds the handler may run before the call becomes an error result the model sees (the
    handler is abandoned, not stopped); None takes ``RuntimeConfig.tool_timeout``; use
    ``math.inf`` for no limit under a runtime default."""
    idempotent: bool = True
    """Whether running a call twice is harmless. A tool that may not run twice (a payment, an
    email) says ``False``: a durable ``tool/started`` is appended before its handler runs, and a
    call that started without leaving a result (its process died) is never run again without
    an operator's verdict."""

    def __post_init__(self) -> None:
        # Checked when the tool is defined: an approval mode misspelt ("Always") asked nobody,
        # so a gated tool ran ungated.
        if self.approval not in ("never", "always", "policy"):
            raise ConfigurationError(f"tool {self.name!r}: approval is 'never', 'always' or "
                                     f"'policy', not {self.approval!r}")
        if not (isinstance(self.args, type) and issubclass(self.args, BaseModel)):
            raise ConfigurationError(f"tool {self.name!r}: args is a pydantic model class, not "
                                     f"{self.args!r}")
        require_flags(f"tool {self.name!r}", self, "mutating", "idempotent")
        _check_definition(self)

    def needs_approval(self) -> bool:
        return self.approval == "always" or (self.approval == "policy" and self.mutating)

    def spec(self) -> ToolSpec:
        return ToolSpec(self.name, self.description, self.args.model_json_schema())


def tool(
    name: str | None = None,
    *,
    args: type[BaseModel],
    description: str | None = None,
    approval: ApprovalMode = "never",
    mutating: bool = False,
    timeout: float | None = None,
    idempotent: bool = True,
) -> Callable[[Handler], Tool]:
    """Decorator: ``@tool(args=DeployArgs, approval="policy", mutating=True)`` on a handler
    ``def deploy(args: DeployArgs, ctx: CallContext) -> str``."""

    def wrap(fn: Handler) -> Tool:
        # getattr: a functools.partial or a callable object has no __name__ of its own.
        named = name if name is not None else getattr(fn, "__name__", None)
        if named is None:
            raise ConfigurationError(f"tool(): {fn!r} has no __name__: give the tool a name")
        return Tool(
            name=named,
            description=description or (getattr(fn, "__doc__", None) or "").strip() or named,
            args=args,
            handler=fn,
            approval=approval,
            mutating=mutating,
            timeout=timeout,
            idempotent=idempotent,
        )

    return wrap


TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""What a tool's name may be: what OpenAI's and Anthropic's APIs accept (a name outside it
gets every request that offers the tool refused)."""


def _check_definition(tool: Tool) -> None:
    """The rest of what is checked when a tool is defined (a mistake found at the first call
    is a turn's failure, or a success recorded for a handler that never ran)."""
    where = f"tool {tool.name!r}"
    if not isinstance(tool.name, str) or not TOOL_NAME.fullmatch(tool.name):
        raise ConfigurationError(f"{where}: a name is 1 to 64 letters, digits, '_' or '-' "
                                 "(what model APIs accept)")
    timeout = tool.timeout
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float)
                                or not timeout > 0
                                or (isinstance(timeout, int) and timeout > sys.float_info.max)):
        raise ConfigurationError(f"{where}: timeout is seconds above 0 (math.inf for no "
                                 f"limit) or None, not {shown(timeout)}")
    handler = tool.handler
    if not callable(handler):
        raise ConfigurationError(f"{where}: the handler {handler!r} is not callable")
    if inspect.isgeneratorfunction(handler) or inspect.isasyncgenfunction(handler):
        raise ConfigurationError(f"{where}: the handler is a generator function; a handler "
                                 "returns its result (an async def handler is awaited)")
    try:
        inspect.signature(handler).bind(None, None)
    except TypeError:
        raise ConfigurationError(f"{where}: the handler is called as handler(args, ctx); "
                                 f"{handler!r} cannot take those two arguments") from None
    except ValueError:
        pass  # no signature to read (some builtins): the call itself will tell


def call_handler(tool: Tool, parsed: BaseModel, ctx: CallContext) -> Any:
    """The handler's result; an ``async def`` handler's coroutine is run to its end on an
    event loop of its own (on a thread of its own when this thread already runs a loop)."""
    result = tool.handler(parsed, ctx)
    if not inspect.isawaitable(result):
        return result
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(_awaited(result))
    done, box = handed_over(lambda: asyncio.run(_awaited(result)))
    done.wait()
    ok, value = box[0]
    if not ok:
        raise value
    return value


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


def describe_error(exc: BaseException) -> str:
    """``Type: message`` for a log or a result — also for an exception whose ``str()``
    raises (the handler's failure is what is reported, not a second one in its text)."""
    try:
        detail = str(exc)
    except Exception:  # noqa: BLE001 - any failure of a user's __str__
        detail = "<its message could not be shown>"
    return type(exc).__name__ + (f": {detail}" if detail else "")


@dataclass(frozen=True)
class Veto:
    """A pre-execute hook's refusal; surfaces to the model as a tool-result error."""

    reason: str


@dataclass(frozen=True)
class ToolOutcome:
    content: str
    is_error: bool = False
    stop: BaseException | None = field(default=None, compare=False, repr=False)
    """Raised by the loop once this outcome is recorded: the turn stops (a cancel seen while the
    handler ran, a ``KeyboardInterrupt`` or ``SystemExit``)."""


PreExecuteHook = Callable[[Tool, CallContext], Veto | None]


@dataclass
class ToolContext:
    """A node of the context tree: the runtime's root context and one fork per agent.
    ``pre_execute`` hooks run parent first (R9)."""

    parent: ToolContext | None = None
    pre_execute: list[PreExecuteHook] = field(default_factory=list)

    def fork(self) -> ToolContext:
        return ToolContext(parent=self)

    def waterfall(self) -> list[PreExecuteHook]:
        chain = self.parent.waterfall() if self.parent is not None else []
        return chain + list(self.pre_execute)


Gate = Callable[[Tool, CallContext], ToolOutcome | None]
"""The execute stage's gate: returns an outcome to stop the call (a denial), or None to run it."""

StartHook = Callable[[Tool, CallContext], None]
"""Called right before the handler of a tool that is not ``idempotent`` runs (the loop appends
``tool/started``); if it raises, the handler does not run."""


class ToolPipeline:
    """``timeout`` is the default for tools without their own; ``cancel`` is the turn's cancel
    event, watched (every ``poll`` seconds) while a handler runs; ``on_start`` runs before the
    handler of a tool that is not idempotent; ``asked`` says whether the log holds an approval
    asked for the call (by an app that asked about the tool), which the gate then settles
    whatever this app's tool says."""

    def __init__(self, tools: Sequence[Tool], context: ToolContext, gate: Gate | None, *,
                 timeout: float | None = None, cancel: threading.Event | None = None,
                 poll: float = 0.05, on_start: StartHook | None = None,
                 asked: Callable[[CallContext], bool] = lambda ctx: False) -> None:
        self.tools = {t.name: t for t in tools}
        self.context = context
        self.gate = gate
        self.timeout = timeout
        self.cancel = cancel
        self.poll = poll
        self.on_start = on_start
        self.asked = asked
        # Tools are immutable: their JSON schemas are built once, not on every model request.
        self._specs = [t.spec() for t in self.tools.values()]

    def specs(self) -> list[ToolSpec]:
        return list(self._specs)

    def run(self, ctx: CallContext) -> ToolOutcome:
        """The call's outcome, its content storable (see ``storable``). Raises ``TurnCancelled``
        when the turn's cancel is seen before the handler starts."""
        outcome = self._run(ctx)
        content = storable(outcome.content, name=ctx.name)
        return outcome if content is outcome.content else dataclasses.replace(
            outcome, content=content)

    def _run(self, ctx: CallContext) -> ToolOutcome:
        # The pipeline's stages in order (lookup, validation, the pre-execute waterfall, the
        # approval gate, the handler): each branch is a stage that can end the call.
        tool = self.tools.get(ctx.name)
        if tool is None:
            return ToolOutcome(f"unknown tool {ctx.name!r}", is_error=True)
        try:
            parsed = tool.args.model_validate(ctx.args)
        except ValidationError as exc:
            problems = describe_validation(exc, "arguments")
            return ToolOutcome(f"invalid arguments for {tool.name}: {problems}", is_error=True)
        vetoed = self._vetoed(tool, ctx)
        if vetoed is not None:
            return vetoed
        # A request recorded under a release that asked about the tool waits for its verdict
        # (and a verdict recorded is kept) though this release's tool asks nobody: R12.
        if self.gate is not None and (tool.needs_approval() or self.asked(ctx)):
            stopped = self.gate(tool, ctx)
            if stopped is not None:
                return stopped
            # The call may have waited days for its verdict: a policy set meanwhile (a
            # deny-all as an emergency stop) applies to it as to any next call (R23).
            vetoed = self._vetoed(tool, ctx)
            if vetoed is not None:
                return vetoed
        return self._execute(tool, parsed, ctx)

    def _vetoed(self, tool: Tool, ctx: CallContext) -> ToolOutcome | None:
        """The pre-execute waterfall, parent first (R9): the first veto ends the call."""
        for hook in self.context.waterfall():
            veto = hook(tool, ctx)
            if veto is not None and not isinstance(veto, Veto):
                # `return False` reads as "do not veto": said, not an AttributeError.
                raise ConfigurationError(
                    f"pre-execute hook {getattr(hook, '__qualname__', hook)!r} returned "
                    f"{veto!r}: a hook returns None or a terret.runtime.Veto")
            if veto is not None:
                return ToolOutcome(f"vetoed: {veto.reason}", is_error=True)
        return None

    def _execute(self, tool: Tool, parsed: BaseModel, ctx: CallContext) -> ToolOutcome:
        """Run the handler: on the turn's own thread, or — when a timeout applies — on a
        handler thread the turn waits on, so that it can stop waiting at the timeout or at a
        cancel while the handler goes on. A hand-over to another thread costs the step a
        millisecond or more while the projection runner works on the step's own appends, so a
        call without a timeout does not pay it; its cancel is honoured when it returns."""
        if self.cancel is not None and self.cancel.is_set():
            raise TurnCancelled(f"turn {ctx.turn} of {ctx.session_id} was cancelled")
        if not tool.idempotent and self.on_start is not None:
            self.on_start(tool, ctx)  # durable before the handler runs; raises: it never runs
        limit = tool.timeout if tool.timeout is not None else self.timeout
        if limit is None:
            try:
                return _outcome(tool, True, call_handler(tool, parsed, ctx))
            except BaseException as exc:  # noqa: BLE001 - a failure or a stop, recorded
                return _outcome(tool, False, exc)
        return self._execute_within(limit, tool, parsed, ctx)

    def _execute_within(self, limit: float, tool: Tool, parsed: BaseModel,
                        ctx: CallContext) -> ToolOutcome:
        """The handler on a handler thread; the turn waits for it until ``limit`` seconds or
        the turn's cancel, whichever comes first."""
        deadline = time.monotonic() + limit
        try:
            done, box = handed_over(lambda: call_handler(tool, parsed, ctx))
            while not done.wait(max(0.0, min(self.poll, deadline - time.monotonic()))):
                if self.cancel is not None and self.cancel.is_set():
                    log.warning("session %s: call %s (%s) abandoned by the turn's cancel; its "
                                "handler may still be running", ctx.session_id, ctx.call_id,
                                tool.name)
                    return ToolOutcome(
                        f"{tool.name} was abandoned: the turn was cancelled while it ran",
                        is_error=True,
                        stop=TurnCancelled(f"turn {ctx.turn} of {ctx.session_id} was cancelled"))
                if time.monotonic() >= deadline:
                    log.warning("session %s: call %s (%s) timed out after %gs; its handler may "
                                "still be running", ctx.session_id, ctx.call_id, tool.name, limit)
                    return ToolOutcome(f"{tool.name} timed out after {limit:g} s", is_error=True)
        except BaseException as exc:  # a Ctrl-C in the turn's thread while the handler ran
            return ToolOutcome(_interrupted(tool, exc), is_error=True, stop=exc)
        return _outcome(tool, *box[0])


def _outcome(tool: Tool, ok: bool, value: Any) -> ToolOutcome:
    """The outcome of a handler that returned ``value`` (``ok``) or raised it."""
    if not ok:
        if isinstance(value, STOPS):
            return ToolOutcome(_interrupted(tool, value), is_error=True, stop=value)
        # A failing tool is the model's problem — any BaseException but a stop of the process
        # (an asyncio.CancelledError from an async handler's own work, a GeneratorExit).
        return ToolOutcome(describe_error(value), is_error=True)
    try:
        return ToolOutcome(_content(value))
    except Exception as exc:
        return ToolOutcome(f"{tool.name} returned a result that cannot be shown: "
                           f"{type(exc).__name__}: {exc}", is_error=True)


STOPS = (KeyboardInterrupt, SystemExit)
"""What a handler raises to stop the process, not to fail the call: recorded, then re-raised."""


def _interrupted(tool: Tool, exc: BaseException) -> str:
    return f"{tool.name} was interrupted: {describe_error(exc)}"


def storable(content: str, *, name: str = "a tool", limit: int = MAX_RESULT_BYTES,
             what: str = "result") -> str:
    """``content`` as an event can hold it: lone surrogates (which UTF-8 cannot encode)
    replaced by U+FFFD — a surrogate pair becomes the character it encodes — and, past
    ``limit`` bytes as stored (``MAX_RESULT_BYTES``: a ``tool/result``'s), cut to fit, ending
    with a marker that says how long it was. Returns ``content`` itself when it is storable as
    it is."""
    if not content.isascii():
        try:
            content.encode("utf-8")
        except UnicodeEncodeError:
            content = content.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    if len(content) * 6 <= limit:  # no character takes more than six bytes escaped
        return content
    size = _stored_size(content)
    if size <= limit:
        return content
    mark = (f"\n\n{TRUNCATED_MARK} the {what} was {size:,} bytes, over the limit of "
            f"{limit:,}; only its start is shown]")
    budget = max(0, limit - _stored_size(mark))
    lo, hi = 0, min(len(content), budget)  # the longest prefix that fits the budget
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _stored_size(content[:mid]) <= budget:
            lo = mid
        else:
            hi = mid - 1
    log.warning("%s: the %s is %d bytes; it is cut to %d", name, what, size, limit)
    return content[:lo] + mark


def _stored_size(text: str) -> int:
    return len(pydantic_core.to_json(text)) - 2


def _content(result: Any) -> str:
    if result is None:
        return ""
    if isinstance(result, str):
        return result
    if isinstance(result, BaseModel):
        return result.model_dump_json()
    try:
        # Strict JSON (NaN is not), values JSON has no type for (a datetime, a set) as their
        # str(); a result JSON cannot hold at all (tuple keys) as its str().
        return json.dumps(result, allow_nan=False, default=str)
    except (TypeError, ValueError):
        return str(result)
