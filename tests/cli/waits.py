"""Sessions whose open turn waits on something other than an approval, built through the
``Session`` aggregate as a dead process leaves them (nothing serves them): parked on its spend
budget, or on a call in doubt."""

from __future__ import annotations

from uuid import UUID

from terret.domain.events import Actor, ToolCallData, UsageData
from tests.cli.conftest import DEPLOY_ARGS, Target

MODEL = "demo:ops-model-1"


def parked_on_budget(target: Target) -> UUID:
    """Turn 1 spent 0.08 in two model calls (0.04 each) and parked before its third step on
    a budget of 0.1."""
    writer = target.writer()
    sid = target.new_session()
    writer.execute(sid, lambda s: s.set_budget(0.1, by=Actor(actor="operator")))
    writer.execute(sid, lambda s: s.start_turn(trigger="user", text="spend"))
    for n in (1, 2):
        writer.execute(sid, lambda s: s.start_step(MODEL))
        writer.execute(sid, lambda s, n=n: s.record_assistant(
            "", [ToolCallData(id=f"c{n}", name="service_status", args={"service": "x"})],
            model=MODEL, usage=UsageData(prompt_tokens=10, completion_tokens=1, cost=0.04)))
        writer.execute(sid, lambda s, n=n: (s.record_tool_result(f"c{n}", "service_status",
                                                                 "ok"), s.end_step()))
    writer.execute(sid, lambda s: s.park_on_budget(limit=0.1, spent=0.08, estimate=0.04))
    return sid


def in_doubt(target: Target) -> UUID:
    """Turn 1's call ``call-deploy`` (of a ``deploy`` that may not run twice) started, its
    process died, and a resume parked on it."""
    writer = target.writer()
    sid = target.new_session()
    writer.execute(sid, lambda s: s.start_turn(trigger="user", text="pay"))
    writer.execute(sid, lambda s: s.start_step(MODEL))
    writer.execute(sid, lambda s: s.record_assistant(
        "", [ToolCallData(id="call-deploy", name="deploy", args=DEPLOY_ARGS)], model=MODEL,
        usage=UsageData(prompt_tokens=20, completion_tokens=2, cost=0.01)))
    writer.execute(sid, lambda s: s.start_tool("call-deploy", "deploy"))
    writer.execute(sid, lambda s: s.mark_in_doubt("call-deploy", "deploy"))
    return sid
