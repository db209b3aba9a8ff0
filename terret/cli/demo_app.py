"""The demo's app: a deterministic model and two tools, the second needing approval.

The model is a pure function of the conversation, so a fresh process after a SIGKILL continues
exactly where the dead one stopped — which is what the demo shows.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from terret.cli._app import App
from terret.domain.messages import Usage
from terret.runtime.definition import AgentDefinition
from terret.runtime.model import ModelRequest, StaticResolver
from terret.runtime.runtime import RuntimeConfig
from terret.runtime.scripted import Reply, ScriptedProvider, call
from terret.runtime.summarizer import FixedSummarizer
from terret.runtime.tools import CallContext, tool

COMPACTION_BUDGET = 4000


class ServiceArgs(BaseModel):
    service: str = Field(description="Service name, e.g. checkout")


class DeployArgs(BaseModel):
    service: str
    version: str = Field(pattern=r"^v\d+$")


@tool(args=ServiceArgs, description="Read a service's health and running version.")
def service_status(args: ServiceArgs, ctx: CallContext) -> dict[str, str]:
    return {"service": args.service, "health": "ok", "version": "v1"}


@tool(args=DeployArgs, approval="policy", mutating=True,
      description="Deploy a version of a service (needs a human's approval).")
def deploy(args: DeployArgs, ctx: CallContext) -> str:
    return f"{args.service} {args.version} rolled out to 3/3 instances"


RELEASE_NOTES = (
    "Release notes for checkout v2:\n"
    "- Faster payment confirmation (p95 1.2s → 0.4s).\n"
    "- Retries idempotent on the gateway side.\n"
    "- Deployed after an operator's approval; health checks green."
)


def demo_model(request: ModelRequest) -> Reply:
    messages = [m for m in request.messages if m.role != "system"]
    last = messages[-1] if messages else None
    chars = sum(len(m.text) for m in messages)
    usage = Usage(prompt_tokens=900 + chars // 4, completion_tokens=40,
                  cost=round((900 + chars // 4) * 3e-6 + 40 * 15e-6, 6))
    last_user = next((m.text for m in reversed(messages) if m.role == "user"), "")
    if last is not None and last.role == "tool":
        if last.tool_name == "service_status":
            deploy_v2 = call("deploy", {"service": "checkout", "version": "v2"}, id="call-deploy")
            return Reply(tool_calls=[deploy_v2], usage=usage)
        if last.tool_name == "deploy":
            return Reply(text=f"Done: {last.text}." if not last.is_error
                         else f"The deploy did not happen: {last.text}", usage=usage)
    if "release notes" in last_user.lower():
        # A long context: this turn's prompt passes the compaction budget.
        big = Usage(prompt_tokens=COMPACTION_BUDGET + 1500, completion_tokens=180,
                    cost=round((COMPACTION_BUDGET + 1500) * 3e-6 + 180 * 15e-6, 6))
        return Reply(text=RELEASE_NOTES, usage=big)
    if "deploy" in last_user.lower():
        return Reply(text="Checking the service first.",
                     tool_calls=[call("service_status", {"service": "checkout"}, id="call-status")],
                     usage=usage)
    return Reply(text=f"You said: {last_user}", usage=usage)


def demo_app() -> App:
    provider = ScriptedProvider(name="demo", default=demo_model, keep=0)  # served for weeks
    agent = AgentDefinition(
        name="demo",
        instructions="You operate services. Check before you deploy.",
        tools=[service_status, deploy],
        allow=["service_status", "deploy"],
    )
    config = RuntimeConfig(roles={"main": "demo:ops-model-1"},
                           compaction_budget=COMPACTION_BUDGET)
    # The demo configures no `compactor` or `titler` role: it compacts with the fixed
    # summarizer, chosen explicitly (no model call; it keeps the latest turn), where the
    # runtime's default role summarizer would refuse; titles fall back to the first message.
    return App(resolver=StaticResolver({"demo": provider}), agents=[agent], config=config,
               summarizer=FixedSummarizer(limit=300))
