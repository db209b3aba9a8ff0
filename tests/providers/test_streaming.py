"""Streaming chat completions against a real local server: text, tool calls, usage, wire format."""

from __future__ import annotations

import json

import pytest

from terret.adapters.providers import OpenAICompatibleProvider
from terret.domain.messages import Message, ToolCall, Usage
from terret.runtime.model import ModelProvider, ModelRequest, ToolSpec
from tests.providers.conftest import API_KEY, CHAT, ProviderFactory
from tests.support.sse_server import (
    DONE,
    KEEPALIVE,
    Reply,
    ScriptedServer,
    chunk,
    event,
    openai_usage,
    text_stream,
    tool_call_stream,
)

HELLO = ModelRequest(model="anthropic/claude-sonnet-4", messages=(Message("user", "hi"),))


def test_it_satisfies_the_model_port(provider: OpenAICompatibleProvider) -> None:
    assert isinstance(provider, ModelProvider)
    assert provider.name == "openrouter"


def test_text_deltas_reach_on_text_in_order_and_make_the_reply(
    server: ScriptedServer, provider: OpenAICompatibleProvider
) -> None:
    server.script(CHAT, Reply.sse(text_stream(["Hel", "lo, ", "world", "!"])))
    seen: list[str] = []

    reply = provider.complete(HELLO, on_text=seen.append)

    assert seen == ["Hel", "lo, ", "world", "!"]
    assert reply.text == "Hello, world!"
    assert reply.tool_calls == ()
    assert reply.finish_reason == "stop"


def test_openrouter_usage_with_cost_comes_from_the_final_chunk(
    server: ScriptedServer, provider: OpenAICompatibleProvider
) -> None:
    usage = {"prompt_tokens": 1200, "completion_tokens": 34, "total_tokens": 1234, "cost": 0.0123}
    server.script(CHAT, Reply.sse(text_stream(["ok"], usage=usage)))

    reply = provider.complete(HELLO)

    assert reply.usage == Usage(prompt_tokens=1200, completion_tokens=34, cost=0.0123)


def test_openai_usage_chunk_with_empty_choices(
    server: ScriptedServer, provider: OpenAICompatibleProvider
) -> None:
    server.script(CHAT, Reply.sse(text_stream(["ok"], style="openai", usage=openai_usage(7, 2))))

    reply = provider.complete(HELLO)

    assert reply.usage == Usage(prompt_tokens=7, completion_tokens=2, cost=None)


def test_no_usage_reported_gives_none(
    server: ScriptedServer, provider: OpenAICompatibleProvider
) -> None:
    server.script(CHAT, Reply.sse(text_stream(["ok"], usage={})))
    assert provider.complete(HELLO).usage is None


def test_request_body_asks_for_stream_usage_and_carries_auth(
    server: ScriptedServer, provider: OpenAICompatibleProvider
) -> None:
    server.script(CHAT, Reply.sse(text_stream(["ok"])))

    provider.complete(HELLO)

    (request,) = server.requests
    body = request.json()
    assert request.method == "POST" and request.path == CHAT
    assert request.headers["authorization"] == f"Bearer {API_KEY}"
    assert request.headers["content-type"] == "application/json"
    assert body["model"] == "anthropic/claude-sonnet-4"
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert "tools" not in body


def test_stream_usage_can_be_turned_off_and_extra_body_and_headers_are_sent(
    server: ScriptedServer, make_provider: ProviderFactory
) -> None:
    provider = make_provider(
        stream_usage=False,
        extra_body={"temperature": 0.2, "max_tokens": 64},
        headers={"X-Title": "terret"},
        api_key=None,
    )
    server.script(CHAT, Reply.sse(text_stream(["ok"])))

    provider.complete(HELLO)

    (request,) = server.requests
    body = request.json()
    assert "stream_options" not in body
    assert body["temperature"] == 0.2 and body["max_tokens"] == 64
    assert request.headers["x-title"] == "terret"
    assert "authorization" not in request.headers


def test_messages_and_tools_are_sent_in_the_openai_wire_format(
    server: ScriptedServer, provider: OpenAICompatibleProvider
) -> None:
    server.script(CHAT, Reply.sse(text_stream(["done"])))
    schema = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
    request = ModelRequest(
        model="m",
        messages=(
            Message("system", "be brief"),
            Message("user", "read two files"),
            Message(
                "assistant",
                "",
                tool_calls=(
                    ToolCall("call_1", "read", {"path": "a.txt"}),
                    ToolCall("call_2", "read", {"path": "é.txt"}),
                ),
            ),
            Message("tool", "contents of a", tool_call_id="call_1", tool_name="read"),
            Message("tool", "no such file", tool_call_id="call_2", tool_name="read", is_error=True),
        ),
        tools=(ToolSpec("read", "Read a file", schema), ToolSpec("now", "The time")),
    )

    provider.complete(request)

    body = server.requests[0].json()
    assert body["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "read two files"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "read", "arguments": '{"path": "a.txt"}'},
                },
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "read", "arguments": '{"path": "é.txt"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "contents of a"},
        {"role": "tool", "tool_call_id": "call_2", "content": "Error: no such file"},
    ]
    assert body["tools"] == [
        {
            "type": "function",
            "function": {"name": "read", "description": "Read a file", "parameters": schema},
        },
        {
            "type": "function",
            "function": {
                "name": "now",
                "description": "The time",
                "parameters": {"type": "object", "properties": {}},
            },
        },
    ]
    # Arguments are JSON strings that decode back to the call's args.
    assert json.loads(body["messages"][2]["tool_calls"][1]["function"]["arguments"]) == {
        "path": "é.txt"
    }


def test_several_tool_calls_with_arguments_split_across_chunks_are_assembled(
    server: ScriptedServer, provider: OpenAICompatibleProvider
) -> None:
    calls = [
        ("call_a", "search", json.dumps({"query": "event sourcing", "limit": 5})),
        ("call_b", "read", json.dumps({"path": "/etc/hosts", "lines": [1, 2, 3]})),
        ("call_c", "now", ""),
    ]
    server.script(CHAT, Reply.sse(tool_call_stream(calls, text="Let me look.", pieces=4)))
    seen: list[str] = []

    reply = provider.complete(HELLO, on_text=seen.append)

    assert reply.text == "Let me look." and seen == ["Let me look."]
    assert reply.finish_reason == "tool_calls"
    assert reply.tool_calls == (
        ToolCall("call_a", "search", {"query": "event sourcing", "limit": 5}),
        ToolCall("call_b", "read", {"path": "/etc/hosts", "lines": [1, 2, 3]}),
        ToolCall("call_c", "now", {}),
    )


def test_interleaved_tool_call_fragments_are_assembled_by_index(
    server: ScriptedServer, provider: OpenAICompatibleProvider
) -> None:
    def frag(index: int, **function: str) -> bytes:
        part: dict[str, object] = {"index": index, "function": function}
        if "name" in function:
            part.update(id=f"call_{index}", type="function")
        return event(chunk({"tool_calls": [part]}))

    parts = [
        frag(0, name="a", arguments=""),
        frag(1, name="b", arguments='{"y"'),
        frag(0, arguments='{"x": '),
        frag(1, arguments=": 2}"),
        frag(0, arguments="1}"),
        event(chunk({}, finish_reason="tool_calls")),
        DONE,
    ]
    server.script(CHAT, Reply.sse(parts))

    reply = provider.complete(HELLO)

    assert reply.tool_calls == (
        ToolCall("call_0", "a", {"x": 1}),
        ToolCall("call_1", "b", {"y": 2}),
    )


def test_keepalive_comments_crlf_lines_and_multi_line_data_are_understood(
    server: ScriptedServer, provider: OpenAICompatibleProvider
) -> None:
    first = json.dumps(chunk({"content": "one "}), indent=1)  # a JSON document over several lines
    multi_line = "".join(f"data: {line}\n" for line in first.splitlines()).encode() + b"\n"
    crlf = event(chunk({"content": "two"})).replace(b"\n", b"\r\n")
    named = b"event: message\n" + event(chunk({"content": " three"}))
    ignored = b"event: ping\n" + event({"ping": 1})
    parts = [KEEPALIVE, multi_line, KEEPALIVE, crlf, named, ignored]
    parts += [event(chunk({}, finish_reason="stop")), DONE]
    server.script(CHAT, Reply.sse(parts))

    assert provider.complete(HELLO).text == "one two three"


@pytest.mark.parametrize("size", [1, 5, 4096])
def test_a_server_ending_lines_with_a_bare_cr_is_read_whole(
    server: ScriptedServer, provider: OpenAICompatibleProvider, size: int
) -> None:
    """SSE allows a bare CR as a line's end: such a stream was read as one line that never
    ended, and the reply was lost (a stream with no reply). Cut anywhere by the network."""
    whole = b"".join([KEEPALIVE, *text_stream(["one ", "two"])]).replace(b"\n", b"\r")
    server.script(CHAT, Reply.sse([whole[i:i + size] for i in range(0, len(whole), size)]))

    reply = provider.complete(HELLO)
    assert reply.text == "one two" and reply.usage is not None


def test_events_split_at_awkward_byte_boundaries(
    server: ScriptedServer, provider: OpenAICompatibleProvider
) -> None:
    whole = b"".join(text_stream(["α", "β", "γ"]))
    # Network chunks that cut through lines, JSON and a multi-byte character.
    parts = [whole[i : i + 7] for i in range(0, len(whole), 7)]
    server.script(CHAT, Reply.sse(parts))

    assert provider.complete(HELLO).text == "αβγ"


def test_a_stream_that_ends_with_a_finish_reason_but_no_done_is_complete(
    server: ScriptedServer, provider: OpenAICompatibleProvider
) -> None:
    server.script(CHAT, Reply.sse(text_stream(["fine"], done=False), framing="close"))
    reply = provider.complete(HELLO)
    assert reply.text == "fine" and reply.finish_reason == "stop"


def test_a_stream_that_ends_after_the_reply_without_usage_says_usage_may_be_missing(
    server: ScriptedServer, provider: OpenAICompatibleProvider,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A drop after the finish reason on a `Connection: close` stream ends the body cleanly:
    it was returned without the warning a drop on a chunked stream gives (its cost is 0)."""
    server.script(CHAT, Reply.sse(text_stream(["fine"], usage={}, done=False),
                                  framing="close"))
    with caplog.at_level("WARNING"):
        reply = provider.complete(HELLO)
    assert reply.text == "fine" and reply.usage is None
    assert any("usage may be missing" in r.getMessage() for r in caplog.records)
    caplog.clear()
    server.script(CHAT, Reply.sse(text_stream(["fine"], done=False), framing="close"))
    with caplog.at_level("WARNING"):
        assert provider.complete(HELLO).usage is not None  # usage came: nothing to say
    assert not any("usage may be missing" in r.getMessage() for r in caplog.records)


def test_a_server_that_ignores_stream_true_is_read_as_one_completion(
    server: ScriptedServer, provider: OpenAICompatibleProvider
) -> None:
    completion = {
        "id": "x",
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "whole",
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "f", "arguments": '{"a":1}'},
                        }
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 4},
    }
    server.script(CHAT, Reply.json(completion))
    seen: list[str] = []

    reply = provider.complete(HELLO, on_text=seen.append)

    assert seen == ["whole"]
    assert reply.tool_calls == (ToolCall("c1", "f", {"a": 1}),)
    assert reply.usage == Usage(3, 4)


def test_a_tool_call_without_an_id_gets_one(
    server: ScriptedServer, provider: OpenAICompatibleProvider
) -> None:
    parts = [
        event(chunk({"tool_calls": [{"index": 0, "function": {"name": "f", "arguments": "{}"}}]})),
        event(chunk({}, finish_reason="tool_calls")),
        DONE,
    ]
    server.script(CHAT, Reply.sse(parts))

    (call,) = provider.complete(HELLO).tool_calls

    assert call.name == "f" and call.id.startswith("call_") and call.args == {}


def test_tool_calls_given_one_id_twice_get_ids_of_their_own(
    server: ScriptedServer, provider: OpenAICompatibleProvider
) -> None:
    """A provider's bug: two calls of one reply with the same id. The turn failed with the
    log's ``InvalidPayload`` (duplicate call ids) and the reply and its usage were lost."""
    server.script(CHAT, Reply.sse(tool_call_stream([("same", "f", "{}"), ("same", "g", "{}"),
                                                    ("same", "h", "{}")])))

    calls = provider.complete(HELLO).tool_calls

    assert [(c.id, c.name) for c in calls] == [("same", "f"), ("same-2", "g"), ("same-3", "h")]


def test_connections_are_reused_across_requests(
    server: ScriptedServer, provider: OpenAICompatibleProvider
) -> None:
    server.repeat(CHAT, Reply.sse(text_stream(["x"])))
    for _ in range(3):
        assert provider.complete(HELLO).text == "x"
    assert len(server.requests) == 3
    assert len({request.client_port for request in server.requests}) == 1


def test_a_character_sent_as_two_halves_in_two_chunks_is_put_together(
    server: ScriptedServer, provider: OpenAICompatibleProvider
) -> None:
    """A server cutting text by UTF-16 units sends 🎉 as ``"x\\ud83c"`` then ``"\\udf89y"``:
    each chunk's JSON decodes to half a character. Those halves reached ``on_text`` and the
    reply, text no terminal could print nor the log store; they are one character now, and a
    half with no other becomes U+FFFD."""
    server.script(CHAT, Reply.sse(text_stream(["x\ud83c", "\udf89y", "\ud83c", "\udf89"])),
                  Reply.sse(text_stream(["a\udf89b", "c\ud83c"])))
    seen: list[str] = []
    reply = provider.complete(HELLO, on_text=seen.append)
    assert reply.text == "x🎉y🎉" and "".join(seen) == reply.text
    assert all(piece.encode() for piece in seen)  # each one whole: printable as it comes
    seen.clear()
    reply = provider.complete(HELLO, on_text=seen.append)
    assert reply.text == "a\ufffdbc\ufffd" and "".join(seen) == reply.text


def test_done_without_a_finish_reason_keeps_the_reply_and_says_so(
    server: ScriptedServer, provider: OpenAICompatibleProvider,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``[DONE]`` with no finish reason before it: the text is kept (the server says the
    reply is whole) with a warning, since a reply cut short reads the same — never silently.
    With nothing received at all, the empty stream is no reply: it is retried."""
    server.script(CHAT, Reply.sse(text_stream(["before done"], finish_reason=None)))
    with caplog.at_level("WARNING"):
        reply = provider.complete(HELLO)
    assert reply.text == "before done" and reply.finish_reason is None
    assert any("without a finish_reason" in r.getMessage() for r in caplog.records)
    server.script(CHAT, Reply.sse([DONE]), Reply.sse(text_stream(["second try"])))
    reply = provider.complete(HELLO)
    assert reply.text == "second try" and reply.finish_reason == "stop"


def test_a_character_split_across_tool_argument_fragments_is_put_together(
    server: ScriptedServer, provider: OpenAICompatibleProvider
) -> None:
    """Arguments cut by UTF-16 units as text may be: each fragment's half of 🎉 decoded
    alone, the call's arguments held a lone surrogate the log refused (the reply, paid for,
    was lost). They hold the character."""
    head = {"index": 0, "id": "call-1", "type": "function"}
    parts = [event(chunk({"tool_calls": [{**head, "function": {"name": "say",
                                                               "arguments": ""}}]})),
             event(chunk({"tool_calls": [{"index": 0, "function": {
                 "arguments": '{"text": "party \ud83c'}}]})),
             event(chunk({"tool_calls": [{"index": 0, "function": {
                 "arguments": '\udf89"}'}}]})),
             event(chunk({}, finish_reason="tool_calls")), DONE]
    server.script(CHAT, Reply.sse(parts))
    reply = provider.complete(HELLO)
    assert reply.tool_calls == (ToolCall(id="call-1", name="say", args={"text": "party 🎉"}),)
