"""Failure handling: retries before the first token only, Retry-After, broken and malformed
streams, timeouts and cancellation — all against a real local server."""

from __future__ import annotations

import json
import threading
import time

import pytest

from terret.adapters.providers import (
    OpenAICompatibleProvider,
    ProviderHTTPError,
    RetryConfig,
    StreamBroken,
    TimeoutConfig,
    UpstreamError,
)
from terret.adapters.providers.retry import parse_retry_after, policy_for
from terret.adapters.providers.stream import MAX_ARGUMENT_DEPTH
from terret.domain.errors import MalformedStream, ModelCancelled, ProviderError
from terret.domain.messages import Message
from terret.runtime.model import ModelRequest
from tests.providers.conftest import CHAT, ProviderFactory
from tests.support.sse_server import (
    DONE,
    Reply,
    ScriptedServer,
    chunk,
    event,
    free_port,
    openrouter_usage,
    text_stream,
    tool_call_stream,
)

HELLO = ModelRequest(model="m", messages=(Message("user", "hi"),))
OVERLOADED = {"error": {"message": "overloaded", "code": 503}}


# --- retries before the first token ------------------------------------------------------------


def test_500_then_success_is_retried(
    server: ScriptedServer, provider: OpenAICompatibleProvider
) -> None:
    server.script(CHAT, Reply.json(OVERLOADED, status=500), Reply.sse(text_stream(["ok"])))

    assert provider.complete(HELLO).text == "ok"
    assert len(server.requests) == 2
    assert server.requests[0].body == server.requests[1].body  # the same request, resent


def test_429_with_retry_after_seconds_is_honoured(
    server: ScriptedServer, provider: OpenAICompatibleProvider
) -> None:
    slow_down = Reply.json(
        {"error": {"message": "rate limited"}}, status=429, headers={"Retry-After": "0.25"}
    )
    server.script(CHAT, slow_down, Reply.sse(text_stream(["ok"])))

    started = time.monotonic()
    assert provider.complete(HELLO).text == "ok"
    assert time.monotonic() - started >= 0.25


def test_retry_after_is_capped(server: ScriptedServer, provider: OpenAICompatibleProvider) -> None:
    # The fixture caps Retry-After at 0.3 s: an hour-long ask must not park a turn for an hour.
    slow_down = Reply.json(
        {"error": {"message": "later"}}, status=429, headers={"Retry-After": "3600"}
    )
    server.script(CHAT, slow_down, Reply.sse(text_stream(["ok"])))

    started = time.monotonic()
    assert provider.complete(HELLO).text == "ok"
    assert time.monotonic() - started < 2.0


def test_retries_are_bounded_and_the_last_http_error_surfaces(
    server: ScriptedServer, provider: OpenAICompatibleProvider
) -> None:
    server.repeat(CHAT, Reply.json({"error": {"message": "bad gateway"}}, status=502))

    with pytest.raises(ProviderHTTPError) as caught:
        provider.complete(HELLO)

    assert caught.value.status == 502
    assert "openrouter: HTTP 502: bad gateway" in str(caught.value)
    assert any("gave up after 3 attempts" in note for note in caught.value.__notes__)
    assert len(server.requests) == 3  # 1 + max_retries (2)


def test_a_400_is_not_retried(server: ScriptedServer, provider: OpenAICompatibleProvider) -> None:
    server.script(CHAT, Reply.json({"error": {"message": "context length exceeded"}}, status=400))

    with pytest.raises(ProviderHTTPError, match="context length exceeded") as caught:
        provider.complete(HELLO)

    assert caught.value.status == 400
    assert len(server.requests) == 1


def test_a_refused_connection_is_retried_then_reported(make_provider: ProviderFactory) -> None:
    provider = make_provider(base_url=f"http://127.0.0.1:{free_port()}/v1")

    with pytest.raises(ProviderError, match="request failed: ConnectError"):
        provider.complete(HELLO)


def test_a_cut_before_any_token_is_retried(
    server: ScriptedServer, provider: OpenAICompatibleProvider
) -> None:
    keepalive_only = Reply.sse(text_stream(["never"])[:3], cut=True)  # comments + role chunk
    server.script(CHAT, keepalive_only, Reply.sse(text_stream(["second try"])))

    assert provider.complete(HELLO).text == "second try"
    assert len(server.requests) == 2


def test_an_upstream_error_chunk_before_any_token_is_retried(
    server: ScriptedServer, provider: OpenAICompatibleProvider
) -> None:
    error_chunk = {
        **chunk({}, finish_reason="error"),
        "error": {"message": "Provider disconnected", "code": 502},
    }
    server.script(CHAT, Reply.sse([event(error_chunk), DONE]), Reply.sse(text_stream(["ok"])))

    assert provider.complete(HELLO).text == "ok"


def test_an_error_carried_with_a_client_status_code_is_not_retried(
    server: ScriptedServer, provider: OpenAICompatibleProvider
) -> None:
    """OpenRouter answers 200 and puts ``{"error": {"code": 404, "message": "No endpoints
    found"}}`` in the body: it was retried four times, as if the upstream were failing."""
    error_chunk = {**chunk({}, finish_reason="error"),
                   "error": {"message": "No endpoints found for x/y", "code": 404}}
    server.repeat(CHAT, Reply.sse([event(error_chunk), DONE]))

    with pytest.raises(UpstreamError, match="No endpoints found"):
        provider.complete(HELLO)
    assert len(server.requests) == 1


def test_a_read_timeout_before_the_first_byte_is_retried(
    server: ScriptedServer, make_provider: ProviderFactory
) -> None:
    provider = make_provider(timeouts=TimeoutConfig(read=0.2))
    server.script(CHAT, Reply.sse(text_stream(["late"]), delay=0.5), Reply.sse(text_stream(["ok"])))

    assert provider.complete(HELLO).text == "ok"


# --- no retry, no truncation after the first token -----------------------------------------------


def test_a_cut_after_tokens_raises_and_is_not_retried(
    server: ScriptedServer, provider: OpenAICompatibleProvider
) -> None:
    server.script(CHAT, Reply.sse(text_stream(["partial ", "answer", " and more"])[:5], cut=True))
    seen: list[str] = []

    with pytest.raises(StreamBroken, match="after the reply began") as caught:
        provider.complete(HELLO, on_text=seen.append)

    assert seen == ["partial ", "answer"]
    assert isinstance(caught.value, ProviderError) and caught.value.provider == "openrouter"
    assert len(server.requests) == 1


def test_a_stream_that_just_ends_after_tokens_is_broken_not_truncated(
    server: ScriptedServer, provider: OpenAICompatibleProvider
) -> None:
    # Close-delimited body, clean EOF, but no finish_reason and no [DONE].
    parts = text_stream(["half"], finish_reason=None, usage={}, done=False)
    server.script(CHAT, Reply.sse(parts, framing="close"))

    with pytest.raises(StreamBroken, match=r"without \[DONE\] or a finish_reason"):
        provider.complete(HELLO)
    assert len(server.requests) == 1


def test_a_stream_torn_mid_line_after_tokens_is_broken(
    server: ScriptedServer, provider: OpenAICompatibleProvider
) -> None:
    parts = text_stream(["a", "b"], finish_reason=None, usage={}, done=False)
    parts.append(b'data: {"choices":[{"delta":{"content":"c')
    server.script(CHAT, Reply.sse(parts, framing="close"))

    with pytest.raises(StreamBroken, match="in the middle of a line"):
        provider.complete(HELLO)


def test_a_cut_after_the_finish_reason_keeps_the_complete_reply(
    server: ScriptedServer, provider: OpenAICompatibleProvider
) -> None:
    # Text and finish_reason arrived; the usage chunk and [DONE] were lost.
    server.script(CHAT, Reply.sse(text_stream(["all ", "there"], usage={}, done=False), cut=True))

    reply = provider.complete(HELLO)

    assert (reply.text, reply.finish_reason, reply.usage) == ("all there", "stop", None)
    assert len(server.requests) == 1


def test_a_page_that_is_not_an_event_stream_says_so(
    server: ScriptedServer, provider: OpenAICompatibleProvider
) -> None:
    server.repeat(CHAT, Reply.text("<html>captive portal</html>", status=200))

    with pytest.raises(ProviderError, match="content-type 'text/plain', not an event stream"):
        provider.complete(HELLO)


def test_a_stall_after_tokens_times_out_as_a_broken_stream(
    server: ScriptedServer, make_provider: ProviderFactory
) -> None:
    provider = make_provider(timeouts=TimeoutConfig(read=0.2))
    server.script(CHAT, Reply.sse(text_stream(["a", "b"])[:4], stall=1.0))

    with pytest.raises(StreamBroken, match="ReadTimeout"):
        provider.complete(HELLO)
    assert len(server.requests) == 1


def test_a_cut_during_tool_call_arguments_is_broken(
    server: ScriptedServer, provider: OpenAICompatibleProvider
) -> None:
    parts = tool_call_stream([("c1", "write", json.dumps({"path": "x", "text": "y" * 50}))])
    server.script(CHAT, Reply.sse(parts[:3], cut=True))

    with pytest.raises(StreamBroken):
        provider.complete(HELLO)
    assert len(server.requests) == 1


def test_an_upstream_error_after_tokens_fails_the_step(
    server: ScriptedServer, provider: OpenAICompatibleProvider
) -> None:
    error_chunk = {
        **chunk({}, finish_reason="error"),
        "error": {"message": "Provider disconnected", "code": 502},
    }
    parts = text_stream(["so far"], finish_reason=None, usage={}, done=False) + [
        event(error_chunk),
        DONE,
    ]
    server.script(CHAT, Reply.sse(parts))

    with pytest.raises(UpstreamError, match="Provider disconnected") as caught:
        provider.complete(HELLO)
    assert caught.value.code == 502
    assert len(server.requests) == 1


# --- malformed streams ---------------------------------------------------------------------------


def test_a_chunk_that_is_not_json_is_a_malformed_stream_naming_provider_and_data(
    server: ScriptedServer, provider: OpenAICompatibleProvider
) -> None:
    parts = text_stream(["ok"])
    parts.insert(3, b"data: {not json at all\n\n")
    server.script(CHAT, Reply.sse(parts))

    with pytest.raises(MalformedStream) as caught:
        provider.complete(HELLO)

    assert caught.value.provider == "openrouter"
    assert caught.value.data == "{not json at all"
    assert "openrouter:" in str(caught.value) and "{not json at all" in str(caught.value)
    assert len(server.requests) == 1  # malformed streams are not retried


@pytest.mark.parametrize(
    "bad",
    [
        [1, 2, 3],
        {"choices": "nope"},
        {"choices": [{"delta": {"content": 42}}]},
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": "x"}]}}]},
        {"choices": [], "usage": {"prompt_tokens": "many"}},
    ],
)
def test_chunks_of_the_wrong_shape_are_malformed(
    server: ScriptedServer, provider: OpenAICompatibleProvider, bad: object
) -> None:
    server.script(CHAT, Reply.sse([event(bad), DONE]))

    with pytest.raises(MalformedStream, match="unexpected chunk shape") as caught:
        provider.complete(HELLO)
    assert caught.value.data == json.dumps(bad)


def test_tool_arguments_that_are_not_a_json_object_are_malformed(
    server: ScriptedServer, provider: OpenAICompatibleProvider
) -> None:
    server.script(CHAT, Reply.sse(tool_call_stream([("c1", "f", '{"a": 1,')])))

    with pytest.raises(MalformedStream, match="arguments of tool call 'f'") as caught:
        provider.complete(HELLO)
    assert caught.value.data == '{"a": 1,'


def _nested(depth: int) -> str:
    """An arguments object ``depth`` levels deep, itself the first level: ``{"a": [[...]]}``."""
    return '{"a": ' + "[" * (depth - 1) + "]" * (depth - 1) + "}"


def _nested_objects(depth: int) -> str:
    return '{"a": ' + '{"a": ' * (depth - 1) + "1" + "}" * depth


def test_tool_arguments_nested_as_deep_as_can_be_recorded_are_accepted(
    server: ScriptedServer, provider: OpenAICompatibleProvider
) -> None:
    calls = [("c1", "f", _nested(MAX_ARGUMENT_DEPTH)),
             ("c2", "g", _nested_objects(MAX_ARGUMENT_DEPTH))]
    server.script(CHAT, Reply.sse(tool_call_stream(calls)))

    first, second = provider.complete(HELLO).tool_calls

    assert first.args == json.loads(_nested(MAX_ARGUMENT_DEPTH))
    assert second.args == json.loads(_nested_objects(MAX_ARGUMENT_DEPTH))


@pytest.mark.parametrize(
    "arguments",
    [
        _nested(MAX_ARGUMENT_DEPTH + 1),
        _nested_objects(MAX_ARGUMENT_DEPTH + 1),
        _nested(5_000),  # too deep for the JSON decoder itself (a RecursionError)
        _nested(50_000),
    ],
    ids=["one level too deep", "objects one level too deep", "5000 deep", "50000 deep"],
)
def test_tool_arguments_nested_too_deeply_are_malformed(
    server: ScriptedServer, provider: OpenAICompatibleProvider, arguments: str
) -> None:
    """Arguments the event log could not record: a typed, documented error, not the
    RecursionError or serialization error that would otherwise surface later."""
    server.script(CHAT, Reply.sse(tool_call_stream([("c1", "f", arguments)])))

    with pytest.raises(MalformedStream) as caught:
        provider.complete(HELLO)

    assert str(caught.value).startswith(
        f"openrouter: arguments of tool call 'f' are nested more than {MAX_ARGUMENT_DEPTH} "
        "levels deep (data: "
    )
    assert caught.value.data == arguments
    assert len(server.requests) == 1  # not retried


def test_json_nested_too_deeply_to_decode_is_malformed_wherever_it_is(
    server: ScriptedServer, make_provider: ProviderFactory
) -> None:
    deep = "[" * 50_000 + "]" * 50_000
    whole = '{"choices": [{"index": 0, "delta": {"content": ' + deep + "}}]}"
    as_object = json.dumps(chunk({"tool_calls": [{"index": 0, "id": "c1", "function": {
        "name": "f", "arguments": {"x": "DEEP"}}}]}), separators=(",", ":"))
    # Arguments sent as an object (a lenient server), deep enough to be refused.
    as_object = as_object.replace('"DEEP"', "[" * 900 + "]" * 900)
    server.script(
        CHAT,
        Reply.sse([b"data: " + whole.encode() + b"\n\n", DONE]),  # the fast path
        Reply.sse([event(chunk({"content": "a"})), b"data: " + whole.encode() + b"\n", b"\n"]),
        Reply(headers={"Content-Type": "application/json"},
              parts=[('{"choices": [{"message": {"content": ' + deep + "}}]}").encode()],
              framing="length"),
        Reply.sse([b"data: " + as_object.encode() + b"\n\n", DONE]),
    )
    provider = make_provider()

    for expected in ("an SSE data line is JSON nested too deeply to decode",
                     "an SSE data line is JSON nested too deeply to decode",
                     "the JSON reply is nested too deeply to decode",
                     "arguments of tool call 'f' are nested more than"):
        with pytest.raises(MalformedStream, match=expected):
            provider.complete(HELLO)
    assert len(server.requests) == 4  # none retried


def test_arguments_cut_by_the_token_limit_say_so(
    server: ScriptedServer, provider: OpenAICompatibleProvider
) -> None:
    parts = tool_call_stream([("c1", "f", '{"a": "long')])
    parts = [p.replace(b'"finish_reason":"tool_calls"', b'"finish_reason":"length"') for p in parts]
    server.script(CHAT, Reply.sse(parts))

    with pytest.raises(ProviderError, match="token limit") as caught:
        provider.complete(HELLO)
    assert not isinstance(caught.value, MalformedStream)


# --- cancellation --------------------------------------------------------------------------------


def test_cancel_between_chunks_closes_the_stream(
    server: ScriptedServer, provider: OpenAICompatibleProvider
) -> None:
    cancel = threading.Event()
    server.script(CHAT, Reply.sse(text_stream([f"t{i} " for i in range(40)]), part_delay=0.02))
    seen: list[str] = []

    def sink(text: str) -> None:
        seen.append(text)
        cancel.set()

    started = time.monotonic()
    with pytest.raises(ModelCancelled):
        provider.complete(HELLO, on_text=sink, cancel=cancel)

    assert seen == ["t0 "]
    assert time.monotonic() - started < 0.5  # did not read the remaining ~0.8 s of stream


def test_a_reply_completed_by_the_chunk_in_hand_when_cancelled_is_kept_with_its_usage(
    server: ScriptedServer, provider: OpenAICompatibleProvider
) -> None:
    """docs/runtime.md: a reply that raced the cancel is kept with its usage. The cancel lands
    while the stream waits; the next chunk brings the rest, usage (billed) and ``[DONE]``: that
    reply is whole, and dropping it lost a cost the provider charged."""
    cancel = threading.Event()
    head, *rest = text_stream(["all ", "done"], style="openai", usage=openrouter_usage(cost=0.1))
    server.script(CHAT, Reply.sse([head, b"".join(rest)], part_delay=0.3))
    threading.Timer(0.1, cancel.set).start()

    reply = provider.complete(HELLO, cancel=cancel)

    assert cancel.is_set()
    assert reply.text == "all done"
    assert reply.usage is not None and reply.usage.cost == 0.1


@pytest.mark.parametrize("cancelled_before_usage", [False, True],
                         ids=["after-its-usage", "before-its-usage"])
def test_a_whole_reply_is_kept_with_its_usage_when_the_cancel_lands_before_done(
    server: ScriptedServer, provider: OpenAICompatibleProvider, cancelled_before_usage: bool
) -> None:
    """The reply finished (its finish reason read) when the cancel landed, and keep-alive
    comments came before ``[DONE]`` (OpenRouter sends them): the next one raised the cancel
    and the reply, billed, was dropped with its cost. Kept now — its usage read on for when
    it had not come yet."""
    cancel = threading.Event()
    *reply, usage, done = text_stream(["all ", "done"], style="openai",
                                      usage=openrouter_usage(cost=0.25))
    keepalives = [b": OPENROUTER PROCESSING\n\n"] * 4
    parts = [*reply, *keepalives, usage, done] if cancelled_before_usage \
        else [*reply, usage, *keepalives, done]
    server.script(CHAT, Reply.sse(parts, part_delay=0.1))
    # The finish reason arrives at ~0.4 s (the 4th part); [DONE] after the keep-alives.
    threading.Timer(0.55, cancel.set).start()

    started = time.monotonic()
    reply_kept = provider.complete(HELLO, cancel=cancel)

    assert cancel.is_set()
    assert reply_kept.text == "all done"
    assert reply_kept.usage is not None and reply_kept.usage.cost == 0.25
    if not cancelled_before_usage:  # nothing left to wait for: it stopped reading at once
        assert time.monotonic() - started < 0.85


def test_a_whole_reply_whose_usage_never_follows_is_kept_within_a_bound(
    server: ScriptedServer, provider: OpenAICompatibleProvider
) -> None:
    """Reading on for the usage of a reply already whole is bounded: keep-alives that never
    end would have held the cancel for good."""
    from terret.adapters.providers.openai_compat import USAGE_AFTER_CANCEL

    cancel = threading.Event()
    *reply, _usage, _done = text_stream(["all ", "done"], style="openai")
    server.script(CHAT, Reply.sse([*reply, *[b": OPENROUTER PROCESSING\n\n"] * 80],
                                  part_delay=0.1))
    threading.Timer(0.55, cancel.set).start()
    started = time.monotonic()
    kept = provider.complete(HELLO, cancel=cancel)
    assert kept.text == "all done" and kept.usage is None
    assert time.monotonic() - started < 0.55 + USAGE_AFTER_CANCEL + 1.5  # not the 8 s


def test_a_stream_cut_after_the_cancel_is_a_cancel(
    server: ScriptedServer, provider: OpenAICompatibleProvider
) -> None:
    cancel = threading.Event()
    head, second, *_ = text_stream(["all ", "done"], style="openai")
    server.script(CHAT, Reply.sse([head, second], part_delay=0.3, stall=0.3))
    threading.Timer(0.1, cancel.set).start()
    with pytest.raises(ModelCancelled):
        provider.complete(HELLO, cancel=cancel)


def test_cancel_before_the_request_sends_nothing(
    server: ScriptedServer, provider: OpenAICompatibleProvider
) -> None:
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(ModelCancelled):
        provider.complete(HELLO, cancel=cancel)
    assert server.requests == []


def test_cancel_interrupts_a_backoff_wait(
    server: ScriptedServer, make_provider: ProviderFactory
) -> None:
    provider = make_provider(retry=RetryConfig(max_retries=3, retry_after_cap=30))
    server.repeat(
        CHAT, Reply.json({"error": {"message": "later"}}, status=429, headers={"Retry-After": "20"})
    )
    cancel = threading.Event()
    threading.Timer(0.2, cancel.set).start()

    started = time.monotonic()
    with pytest.raises(ModelCancelled):
        provider.complete(HELLO, cancel=cancel)
    assert time.monotonic() - started < 2.0
    assert len(server.requests) == 1


# --- the policy on its own -----------------------------------------------------------------------


def test_backoff_grows_exponentially_with_jitter_and_caps() -> None:
    policy = policy_for(RetryConfig(backoff_base=1.0, backoff_cap=5.0, jitter=0.5))
    for attempt, ceiling in [(0, 1.0), (1, 2.0), (2, 4.0), (3, 5.0), (10, 5.0)]:
        delays = [policy.delay(attempt) for _ in range(200)]
        assert all(ceiling * 0.5 <= d <= ceiling for d in delays)
        assert len(set(delays)) > 1  # jittered


def test_retry_after_forms() -> None:
    assert parse_retry_after({"retry-after": "7"}) == 7.0
    assert parse_retry_after({"retry-after": "1.5"}) == 1.5
    assert parse_retry_after({"retry-after-ms": "250", "retry-after": "9"}) == 0.25
    assert (
        parse_retry_after({"retry-after": "Wed, 21 Oct 2015 07:28:10 GMT"}, now=1445412480.0)
        == 10.0
    )
    assert parse_retry_after({"retry-after": "soon"}) is None
    assert parse_retry_after({}) is None
    assert policy_for(RetryConfig(retry_after_cap=3.0)).delay(0, retry_after=100.0) == 3.0


def test_a_cancel_during_a_stall_after_tokens_is_a_cancel(
    server: ScriptedServer, make_provider: ProviderFactory
) -> None:
    """docs/providers.md: the cancel is noticed at the next chunk or at the read timeout, and
    raises ``ModelCancelled`` — it raised ``StreamBroken`` when the stream had begun."""
    provider = make_provider(timeouts=TimeoutConfig(read=0.5))
    server.script(CHAT, Reply.sse(text_stream(["start ", "more"])[:4], stall=2.0))
    cancel = threading.Event()
    threading.Timer(0.2, cancel.set).start()
    with pytest.raises(ModelCancelled):
        provider.complete(HELLO, cancel=cancel)
    assert len(server.requests) == 1
