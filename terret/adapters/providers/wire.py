"""Terret's provider-neutral messages and tools in the OpenAI chat-completions wire format."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from terret.domain.messages import Message
from terret.runtime.model import ModelRequest, ToolSpec

#: The prefix a failed tool result carries on the wire: chat completions has no error flag on
#: tool messages, and the model must still be told that its call failed.
TOOL_ERROR_PREFIX = "Error: "

_EMPTY_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}


def wire_message(message: Message) -> dict[str, Any]:
    if message.role == "tool":
        text = TOOL_ERROR_PREFIX + message.text if message.is_error else message.text
        return {"role": "tool", "tool_call_id": message.tool_call_id or "", "content": text}
    if message.role == "assistant" and message.tool_calls:
        return {
            "role": "assistant",
            # OpenAI wants null rather than "" beside tool calls; some servers reject "".
            "content": message.text or None,
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {
                        "name": call.name,
                        # Arguments travel as a JSON *string*, not an object.
                        "arguments": json.dumps(call.args, ensure_ascii=False),
                    },
                }
                for call in message.tool_calls
            ],
        }
    return {"role": message.role, "content": message.text}


def wire_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """The request's messages. An assistant message with neither text nor calls (an empty
    reply, or one whose calls the log could not hold) is left out: Anthropic's models, through
    OpenRouter say, refuse empty content anywhere but last, so one such reply in the history
    failed every later request of the session."""
    return [wire_message(message) for message in messages
            if message.role != "assistant" or message.text or message.tool_calls]


def wire_tool(tool: ToolSpec) -> dict[str, Any]:
    # An empty schema is replaced by an explicit empty object: OpenAI rejects ``{}`` for
    # strict tools and some local servers reject it outright.
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters or _EMPTY_SCHEMA,
        },
    }


def request_body(
    request: ModelRequest,
    *,
    stream_usage: bool,
    extra_body: Mapping[str, Any] | None = None,
) -> bytes:
    """The encoded JSON body of one streamed chat request. Encoded once and reused by every
    retry, so a retry sends byte-for-byte the same request."""
    body: dict[str, Any] = dict(extra_body or {})
    body["model"] = request.model
    body["messages"] = wire_messages(request.messages)
    body["stream"] = True
    if stream_usage:
        body["stream_options"] = {"include_usage": True}
    if request.tools:
        body["tools"] = [wire_tool(tool) for tool in request.tools]
    return json.dumps(body, ensure_ascii=False).encode()
