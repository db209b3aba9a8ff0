"""Issue 14 through the command line, on SQLite and the EventStoreDB emulator: ``terret budget
show|set|clear|list``, ``terret in-doubt rerun|skip``, calls in doubt in ``approvals list`` and
``sessions show``, turns parked on their budget in ``sessions show``/``list``, and the usage of
each model call in ``terret log``. The commands run in-process (``invoke``) and as real
processes (``run``) against a turn parked in this process's runtime."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from pydantic import BaseModel

from terret import (
    AgentDefinition,
    CallContext,
    Reply,
    Runtime,
    RuntimeConfig,
    ScriptedProvider,
    StaticResolver,
    Usage,
    call,
    tool,
)
from terret.domain.events import Actor, ToolCallData, UsageData
from tests.cli.conftest import DEPLOY_ARGS, Target, one_line_error
from tests.cli.waits import MODEL, in_doubt, parked_on_budget


def test_budget_show_set_clear_and_list(target: Target) -> None:
    sid = parked_on_budget(target)
    shown = target.json("budget", "show", str(sid))
    assert shown == {"session": str(sid), "budget": 0.1, "spent": pytest.approx(0.08),
                     "estimate": 0.04, "parked": {"turn": 1, "limit": 0.1,
                                                   "spent": pytest.approx(0.08),
                                                   "estimate": 0.04}}
    text = target.invoke("budget", "show", str(sid)).stdout
    assert "budget    $0.100000 (its own)" in text
    assert "parked    turn 1: spent $0.080000 of $0.100000" in text
    listed = target.json("budget", "list")
    assert [(p["session"], p["turn"]) for p in listed] == [(str(sid), 1)]
    assert str(sid) in target.invoke("budget", "list").stdout

    assert target.json("budget", "set", str(sid), "$5.00") == {"session": str(sid),
                                                              "budget": 5.0}
    (event,) = [e for e in target.events(sid) if e.wire_name == "budget/set"][1:]
    assert event.payload.limit == 5.0 and event.payload.by.actor == "operator"  # type: ignore[union-attr]
    assert target.json("budget", "show", str(sid))["budget"] == 5.0
    assert target.json("budget", "clear", str(sid)) == {"session": str(sid), "budget": None}
    assert target.json("budget", "show", str(sid))["budget"] is None
    assert "the serving deployment's default applies" in target.invoke(
        "budget", "show", str(sid)).stdout


def test_every_command_gives_one_figure_for_a_sum_of_costs(target: Target) -> None:
    """0.1 + 0.2 is 0.30000000000000004 in floats: every --json figure of the same spend is
    the same number (rounded as `usage` rounds), and the text the same amount."""
    writer = target.writer()
    sid = target.new_session()
    writer.execute(sid, lambda s: s.set_budget(0.3, by=Actor(actor="operator")))
    writer.execute(sid, lambda s: s.start_turn(trigger="user", text="spend"))
    for n, cost in ((1, 0.1), (2, 0.2)):
        writer.execute(sid, lambda s: s.start_step(MODEL))
        writer.execute(sid, lambda s, n=n, cost=cost: s.record_assistant(
            "", [ToolCallData(id=f"c{n}", name="service_status", args={})], model=MODEL,
            usage=UsageData(prompt_tokens=10, completion_tokens=1, cost=cost)))
        writer.execute(sid, lambda s, n=n: (s.record_tool_result(f"c{n}", "service_status",
                                                                 "ok"), s.end_step()))
    writer.execute(sid, lambda s: s.park_on_budget(limit=0.3, spent=0.1 + 0.2, estimate=0.2))
    shown = target.json("budget", "show", str(sid))
    (listed,) = target.json("budget", "list")
    session = target.json("sessions", "show", str(sid))
    figures = [shown["spent"], shown["parked"]["spent"], listed["spent"],
               session["budget"]["spent"], session["budget"]["parked"]["spent"],
               target.json("usage", str(sid))[str(sid)]["cost"],
               session["usage_by_model"][MODEL]["cost"]]
    assert figures == [0.3] * len(figures), figures
    for command in (["budget", "show"], ["sessions", "show"], ["usage"]):
        text = target.invoke(*command, str(sid)).stdout
        assert "$0.300000" in text and "0.3000000000" not in text, text


@pytest.mark.parametrize("bad", [["--", "-1"], ["abc"], ["inf"], ["nan"], [""], ["$-2"]])
def test_a_budget_that_is_not_an_amount_is_a_usage_error_and_writes_nothing(
        target: Target, bad: list[str]) -> None:
    sid = target.new_session()
    before = target.snapshot()
    result = target.invoke("budget", "set", str(sid), *bad)
    assert result.exit_code == 2
    assert one_line_error(result.stderr).startswith("Error: BadParameter: ")
    assert target.snapshot() == before


def test_sessions_show_and_list_show_a_turn_parked_on_its_budget(target: Target) -> None:
    sid = parked_on_budget(target)
    data = target.json("sessions", "show", str(sid))
    assert data["status"] == "waiting_budget"
    assert data["budget"] == {"limit": 0.1, "spent": pytest.approx(0.08), "parked": {
        "turn": 1, "limit": 0.1, "spent": pytest.approx(0.08), "estimate": 0.04}}
    text = target.invoke("sessions", "show", str(sid)).stdout.splitlines()
    assert "budget    $0.100000 (its own), spent $0.080000" in text
    assert any(line.startswith("parked    on its budget: spent $0.080000 of $0.100000")
               for line in text), text
    listed = target.json("sessions", "list", "--status", "waiting_budget")
    assert [s["id"] for s in listed] == [str(sid)]


def test_approvals_list_shows_calls_in_doubt_and_in_doubt_decides_them(target: Target) -> None:
    approval = target.parked()
    doubted = in_doubt(target)
    rows = target.json("approvals", "list")
    assert [(r["session"], r["call_id"], r["waiting"]) for r in rows] == [
        (str(approval), "call-deploy", "approval"), (str(doubted), "call-deploy", "in_doubt")]
    assert rows[1]["args"] == DEPLOY_ARGS and rows[1]["tool"] == "deploy"
    table = target.invoke("approvals", "list").stdout.splitlines()
    assert table[0].split()[-1] == "WAITING"
    assert table[2].startswith(str(doubted)) and table[2].endswith("in doubt")
    assert target.json("approvals", "list", str(doubted)) == rows[1:]

    show = target.json("sessions", "show", str(doubted))
    assert show["status"] == "waiting_in_doubt"
    assert show["in_doubt_calls"] == [{"call_id": "call-deploy", "tool": "deploy",
                                       "args": DEPLOY_ARGS}]
    assert any(line.startswith("in doubt  call-deploy: deploy")
               for line in target.invoke("sessions", "show", str(doubted)).stdout.splitlines())

    missing = target.invoke("in-doubt", "rerun", str(approval), "call-deploy")
    assert missing.exit_code == 1
    assert one_line_error(missing.stderr).startswith("Error: CallNotInDoubt: ")
    blank = target.invoke("in-doubt", "skip", str(doubted), "call-deploy", "--reason", " ")
    assert blank.exit_code == 2
    # A real process; the call by a unique prefix of its id, as for approve and deny.
    done = target.run("--json", "in-doubt", "skip", str(doubted), "call-d", "--reason",
                      "deployed already")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"session": str(doubted), "call_id": "call-deploy",
                                       "verdict": "skipped", "tool": "deploy",
                                       "args": DEPLOY_ARGS}
    (verdict,) = [e for e in target.events(doubted) if e.wire_name == "tool/in_doubt_resolved"]
    assert verdict.payload.verdict == "skipped"  # type: ignore[union-attr]
    assert verdict.payload.by.actor == "operator"  # type: ignore[union-attr]
    again = target.invoke("in-doubt", "rerun", str(doubted), "call-deploy")
    assert again.exit_code == 1  # decided already
    assert [r["waiting"] for r in target.json("approvals", "list")] == ["approval"]


def test_the_log_shows_each_model_call_with_its_reply_and_labels_only_real_resumes(
        target: Target) -> None:
    writer = target.writer()
    sid = target.new_session()
    model = "demo:ops-model-1"
    writer.execute(sid, lambda s: s.start_turn(trigger="user", text="go"))
    writer.execute(sid, lambda s: s.start_step(model))
    writer.execute(sid, lambda s: s.record_assistant(
        "", [ToolCallData(id="c1", name="noop")], model=model,
        usage=UsageData(prompt_tokens=111, completion_tokens=13, cost=0.01)))
    writer.execute(sid, lambda s: (s.record_tool_result("c1", "noop", "ok"),
                                   s.end_step(resumed=True)))
    writer.execute(sid, lambda s: s.start_step(model))
    writer.execute(sid, lambda s: s.record_assistant("done", model=model))
    writer.execute(sid, lambda s: (s.end_step(), s.end_turn("completed")))
    lines = target.invoke("log", str(sid)).stdout.splitlines()
    replies = [line for line in lines if "assistant/message" in line]
    ends = [line for line in lines if "step/end" in line]
    assert replies[0].endswith(f"[{model} 111+13 tokens $0.010000]")
    assert replies[1].endswith(f"[{model} no usage reported]")
    assert ends[0].endswith("turn 1 step 1 (resumed: no usage of its own)")
    assert ends[1].endswith("turn 1 step 2")  # not resumed: no such label
    usage = target.json("usage", str(sid))[str(sid)]
    assert (usage["prompt_tokens"], usage["completion_tokens"], usage["steps"]) == (111, 13, 2)


# --- against a live turn --------------------------------------------------------------------


class _Amount(BaseModel):
    amount: int


class _Deploy(BaseModel):
    service: str
    version: str


def _runtime(target: Target, provider: ScriptedProvider, **config: Any) -> Runtime:
    @tool(args=_Amount, idempotent=False)
    def pay(args: _Amount, ctx: CallContext) -> str:
        return f"paid {args.amount}"

    @tool(args=_Deploy, idempotent=False)
    def deploy(args: _Deploy, ctx: CallContext) -> str:
        return f"deployed {args.service} {args.version}"

    return Runtime(target.store(), resolver=StaticResolver({"demo": provider}),
                   agents=[AgentDefinition(name="demo", tools=[pay, deploy], allow=["*"])],
                   config=RuntimeConfig(**config)).start()


def test_budget_set_from_another_process_lets_a_parked_turn_go_on(target: Target) -> None:
    spend = Reply(tool_calls=[call("pay", {"amount": 1})], usage=Usage(1, 1, 0.04))
    rt = _runtime(target, ScriptedProvider([spend, spend, spend],
                                           default=Reply(text="done", usage=Usage(1, 1, 0.04))),
                  spend_cap=0.1)
    try:
        sid = target.new_session()
        outcome: dict[str, Any] = {}
        turn = threading.Thread(target=lambda: outcome.update(r=rt.run_turn(sid, "spend")))
        turn.start()
        target.wait_for(sid, lambda e: e.wire_name == "budget/exceeded", "the budget park")
        assert target.json("budget", "show", str(sid))["parked"]["spent"] == pytest.approx(0.08)
        assert target.json("budget", "list")[0]["session"] == str(sid)
        done = target.run("budget", "set", str(sid), "1")  # a real process: the store is the bus
        assert done.returncode == 0, done.stderr
        turn.join(30)
        assert outcome["r"].status == "completed"
        assert target.json("budget", "list") == []
        assert target.json("usage", str(sid))[str(sid)]["cost"] == pytest.approx(0.16)
    finally:
        rt.close()


def test_in_doubt_rerun_from_another_process_runs_the_call_once_more(target: Target) -> None:
    sid = in_doubt(target)
    rt = _runtime(target, ScriptedProvider(default=Reply(text="resumed")))
    try:
        from tests.runtime.kit import Background

        job = Background(lambda: rt.resume_turn(sid))
        target.wait_for(sid, lambda e: e.wire_name == "agent/attached", "the resume")
        done = target.run("in-doubt", "rerun", str(sid), "call-deploy", "--reason", "checked")
        assert done.returncode == 0, done.stderr
        assert job.join(30).status == "completed"
        names = target.types(sid)
        assert names[names.index("tool/in_doubt_resolved"):][:3] == [
            "tool/in_doubt_resolved", "tool/started", "tool/result"]
        (result,) = [e for e in target.events(sid) if e.wire_name == "tool/result"]
        assert result.payload.content == "deployed checkout v2"  # type: ignore[union-attr]
    finally:
        rt.close()


def test_resume_says_what_an_in_doubt_turn_waits_for_and_a_skip_from_another_shell_ends_it(
        target: Target) -> None:
    import subprocess
    import sys

    from tests.cli.conftest import DEMO_APP, subprocess_env

    sid = in_doubt(target)
    resume = subprocess.Popen(
        [sys.executable, "-m", "terret", *target.args("--json", "resume", str(sid), "--app",
                                                      DEMO_APP)],
        cwd=target.cwd, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    try:
        target.wait_for(sid, lambda e: e.wire_name == "agent/attached", "the resume")
        done = target.run("in-doubt", "skip", str(sid), "call-deploy", "--reason", "deployed")
        assert done.returncode == 0, done.stderr
        out, err = resume.communicate(timeout=60)
    finally:
        if resume.poll() is None:
            resume.kill()
            resume.wait(10)
    assert resume.returncode == 0, err
    assert f"`terret in-doubt rerun {sid} call-deploy`" in err
    assert json.loads(out)["status"] == "completed"
    (result,) = [e for e in target.events(sid) if e.wire_name == "tool/result"]
    assert result.payload.is_error  # type: ignore[union-attr]
