"""A whole turn through the runtime against the real local HTTP server: the OpenAI-compatible
provider streams a tool call (arguments split over chunks), the tool runs, a second request
streams the answer; the usage projection equals what the server reported, and the log holds
``provider/model`` only — never the key."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

import terret
from terret.adapters.providers import EndpointConfig, ProviderRegistry, ProvidersConfig
from terret.adapters.providers.stream import MAX_ARGUMENT_DEPTH
from terret.adapters.stores.sqlite import SQLiteStore
from terret.domain.errors import MalformedStream
from terret.domain.store import session_stream
from tests.providers.conftest import API_KEY, CHAT, FAST_RETRY, FAST_TIMEOUTS
from tests.support.sse_server import (
    Reply,
    ScriptedServer,
    openrouter_usage,
    text_stream,
    tool_call_stream,
)


class WeatherArgs(BaseModel):
    city: str


@terret.tool(args=WeatherArgs, description="Today's weather in a city.")
def weather(args: WeatherArgs, ctx: terret.CallContext) -> str:
    return f"{args.city}: sunny, 21°C"


def test_a_turn_with_a_tool_call_over_http_records_the_servers_usage(
    server: ScriptedServer, tmp_path: Path
) -> None:
    server.script(
        CHAT,
        Reply.sse(tool_call_stream([("call_w1", "weather", '{"city": "Paris"}')],
                                   usage=openrouter_usage(120, 18, 0.00123))),
        Reply.sse(text_stream(["It is sunny ", "in Paris."],
                              usage=openrouter_usage(171, 9, 0.00077))),
    )
    store = SQLiteStore(tmp_path / "e2e.db")
    runtime, registry = _on_openrouter(server, store, "openrouter:acme/weather-1", weather)
    try:
        sid = runtime.create_session()
        streamed: list[str] = []
        agent = runtime.spawn_agent(sid)
        agent.on_text = streamed.append
        result = runtime.run_turn(sid, "What's the weather in Paris?")

        assert result.status == "completed"
        assert result.text == "It is sunny in Paris."
        assert "".join(streamed) == "It is sunny in Paris."
        assert runtime.usage(sid) == {"prompt_tokens": 291, "completion_tokens": 27,
                                      "cost": 0.002, "steps": 2}
        by_model = runtime.views.usage_by_model(sid)
        assert list(by_model) == ["openrouter:acme/weather-1"]

        # The second request carried the tool's result under the model's call id.
        second = server.requests[-1].json()
        tool_message = next(m for m in second["messages"] if m["role"] == "tool")
        assert tool_message == {"role": "tool", "tool_call_id": "call_w1",
                                "content": "Paris: sunny, 21°C"}
        assert second["model"] == "acme/weather-1"
        assert second["tools"][0]["function"]["parameters"]["properties"]["city"]

        raw = b"".join(r.data + r.metadata
                       for r in store.read_stream(session_stream(sid)))
        assert API_KEY.encode() not in raw
        starts = [json.loads(r.data) for r in store.read_stream(session_stream(sid))
                  if r.wire_name == "step/start"]
        assert [s["model"] for s in starts] == ["openrouter:acme/weather-1"] * 2
    finally:
        runtime.close()
        registry.close()
        store.close()


class AnyArgs(BaseModel):
    a: Any = None


@terret.tool(args=AnyArgs, description="Takes anything.")
def take(args: AnyArgs, ctx: terret.CallContext) -> str:
    return "taken"


@pytest.mark.parametrize("depth", [MAX_ARGUMENT_DEPTH, MAX_ARGUMENT_DEPTH + 1, 5_000])
def test_tool_arguments_too_deep_to_record_fail_the_turn_with_a_malformed_stream(
    depth: int, server: ScriptedServer, tmp_path: Path
) -> None:
    """Arguments as deep as the log can record make a turn like any other; deeper ones fail
    it with the documented MalformedStream — not a RecursionError or a serialization error
    — and nothing of the reply is written."""
    arguments = '{"a": ' + "[" * (depth - 1) + "]" * (depth - 1) + "}"
    server.script(CHAT, Reply.sse(tool_call_stream([("call_d1", "take", arguments)])),
                  Reply.sse(text_stream(["done"])))
    store = SQLiteStore(tmp_path / "deep.db")
    runtime, registry = _on_openrouter(server, store, "openrouter:acme/m", take)
    try:
        sid = runtime.create_session()
        if depth <= MAX_ARGUMENT_DEPTH:
            result = runtime.run_turn(sid, "go")
            assert result.status == "completed" and result.text == "done"
            return
        with pytest.raises(MalformedStream, match="nested more than"):
            runtime.run_turn(sid, "go")
        records = list(store.read_stream(session_stream(sid)))
        names = [r.wire_name for r in records]
        (end,) = [json.loads(r.data) for r in records if r.wire_name == "turn/end"]
        assert end["status"] == "failed"
        assert end["error"].startswith(
            f"MalformedStream: openrouter: arguments of tool call 'take' are nested more than "
            f"{MAX_ARGUMENT_DEPTH} levels deep"
        )
        assert "assistant/message" not in names and "tool/result" not in names
        assert len(server.requests) == 1
    finally:
        runtime.close()
        registry.close()
        store.close()


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_tool_arguments_with_numbers_json_has_not_fail_the_turn_with_a_malformed_stream(
    number: str, server: ScriptedServer, tmp_path: Path
) -> None:
    """Python's decoder reads them; the log (strict JSON) cannot store them: it failed the
    append with InvalidPayload. They are malformed arguments, as documented."""
    server.script(CHAT, Reply.sse(tool_call_stream([("call_n1", "take", f'{{"x": {number}}}')])))
    store = SQLiteStore(tmp_path / "nan.db")
    runtime, registry = _on_openrouter(server, store, "openrouter:acme/m", take)
    try:
        sid = runtime.create_session()
        with pytest.raises(MalformedStream, match="arguments of tool call 'take' are not a "
                                                  "JSON object"):
            runtime.run_turn(sid, "go")
        records = list(store.read_stream(session_stream(sid)))
        (end,) = [json.loads(r.data) for r in records if r.wire_name == "turn/end"]
        assert end["status"] == "failed" and end["error"].startswith("MalformedStream")
        assert "assistant/message" not in [r.wire_name for r in records]
    finally:
        runtime.close()
        registry.close()
        store.close()


def _on_openrouter(server: Any, store: SQLiteStore, main: str, tool: Any
                   ) -> tuple[terret.Runtime, ProviderRegistry]:
    """A started runtime whose ``main`` role is the fake OpenRouter ``server``, with one
    agent allowed its one ``tool``; and its registry, to close."""
    config = ProvidersConfig(
        endpoints={"openrouter": EndpointConfig(base_url=server.url + "/api/v1",
                                                api_key_env="OPENROUTER_API_KEY")},
        retry=FAST_RETRY, timeouts=FAST_TIMEOUTS,
    )
    registry = ProviderRegistry(config, environ={"OPENROUTER_API_KEY": API_KEY})
    return terret.Runtime(
        store, resolver=registry, config=terret.RuntimeConfig(roles={"main": main}),
        agents=[terret.AgentDefinition(tools=[tool], allow=[tool.name])],
    ).start(), registry


def test_an_empty_reply_in_the_history_is_left_out_of_later_requests(
    server: ScriptedServer, tmp_path: Path
) -> None:
    """A model that answered nothing (an empty end_turn, or a reply whose calls the log could
    not hold) left an ``assistant/message`` with no text and no calls: every later request
    carried ``{"role": "assistant", "content": ""}``, which Anthropic's models refuse anywhere
    but last — the session failed for good there. The log keeps the reply (its usage); the
    requests leave it out."""
    server.script(CHAT, Reply.sse(text_stream([], usage=openrouter_usage(10, 0, 0.0001))),
                  Reply.sse(text_stream(["hello again"])))
    store = SQLiteStore(tmp_path / "e2e.db")
    runtime, registry = _on_openrouter(server, store, "openrouter:acme/weather-1", weather)
    try:
        sid = runtime.create_session()
        assert runtime.run_turn(sid, "say nothing").status == "completed"
        assert runtime.run_turn(sid, "and now?").status == "completed"
        second = server.requests[-1].json()["messages"]
        assert [m["role"] for m in second] == ["user", "user"]
        assert all(m.get("content") for m in second)
        replies = [json.loads(r.data) for r in store.read_stream(session_stream(sid))
                   if r.wire_name == "assistant/message"]
        assert replies[0]["text"] == "" and replies[0]["usage"]["cost"] == 0.0001
    finally:
        runtime.close()
        registry.close()
        store.close()
