"""A key the server echoes back, in every error path of the OpenAI-compatible provider, never
shows: not in the exception's text, repr, attributes, notes or chain, not in the locals of its
traceback's frames, not in a retry WARNING line. And a key no header can carry (a CRLF ``.env``
file's trailing ``\\r``) is refused at configuration, before any request could quote it.

Every reply comes from the real scripted server (``tests/support/sse_server.py``); nothing in
httpx is mocked. Replies are built inline, never kept in a local: the checks read the locals
of every frame of the traceback, this test's own included."""

from __future__ import annotations

import base64
import json
import logging
import traceback
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from urllib.parse import quote

import pytest

from terret.adapters.providers import OpenAICompatibleProvider, ProviderRegistry, ProvidersConfig
from terret.adapters.providers.config import EndpointConfig
from terret.adapters.secret import Secret, bearer_key
from terret.adapters.summarizers import MorphSummarizer
from terret.domain.errors import ConfigurationError, ProviderError
from terret.domain.messages import Message
from terret.runtime.model import ModelRequest
from tests.providers.conftest import API_KEY, CHAT, FAST_RETRY, FAST_TIMEOUTS, ProviderFactory
from tests.support.sse_server import (
    DONE,
    Reply,
    ScriptedServer,
    chunk,
    event,
    text_stream,
    tool_call_stream,
)

HELLO = ModelRequest(model="m", messages=(Message("user", "hi"),))

#: A key with every character an escaping may change: repr and JSON double the backslash and
#: escape the quote, URL encoding turns most of the rest into %XX.
ODD_KEY = 'sk-odd\\back"quote/slash+plus=eq%pct-0123456789abcdef'

WINDOW = 8
TESTS = str(Path(__file__).parents[1])


def fragments(key: str) -> set[str]:
    """Every run of WINDOW characters of the key, raw and as repr, JSON and URL encoding
    spell it (built here independently of the code under test)."""
    forms = {
        key,
        repr(key)[1:-1],
        repr(key.encode())[2:-1],
        json.dumps(key)[1:-1],
        quote(key, safe=""),
    }
    forms |= {repr(form)[1:-1] for form in forms}
    return {form[i : i + WINDOW] for form in forms for i in range(len(form) - WINDOW + 1)}


def leaks(text: str, key: str = API_KEY) -> list[str]:
    return sorted(fragment for fragment in fragments(key) if fragment in text)


def everything_shown(error: BaseException, *, frame_locals: bool = True) -> str:
    """What anything may display of an error: its text, repr, args, attributes and notes, the
    whole chain, and the locals of every frame (``--showlocals``, rich, error trackers)."""
    shown = traceback.TracebackException.from_exception(error, capture_locals=frame_locals)
    pending: list[traceback.TracebackException | None] = [shown]
    while pending:  # the test's own frames hold the key it planted: not theirs to show
        summary = pending.pop()
        if summary is not None:
            for frame in summary.stack:
                if frame.filename.startswith(TESTS):
                    frame.locals = None
            pending += [summary.__cause__, summary.__context__]
    parts = ["".join(shown.format())]
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        parts += [str(current), repr(current), repr(current.args), repr(vars(current))]
        parts += getattr(current, "__notes__", [])
        current = current.__cause__ or current.__context__
    return "\n".join(parts)


# --- the error paths ----------------------------------------------------------------------------


def _error_chunk(key: str) -> list[bytes]:
    return [event({"error": {"message": f"upstream refused key {key}", "code": key}})]


def _error_chunk_after_text(key: str) -> list[bytes]:
    return [
        event(chunk({"content": "Hel"})),
        event({"error": {"message": f"key {key} revoked mid-stream", "code": 401}}),
    ]


def _named_error_event(key: str) -> list[bytes]:
    return [f"event: error\ndata: bad key {key}\n\n".encode()]


def _wrong_shape_fast(key: str) -> list[bytes]:
    # One whole event per network chunk: the provider's fast path.
    return [event({"choices": [{"delta": {"content": 5}}], "echo": key}), DONE]


def _wrong_shape_general(key: str) -> list[bytes]:
    # Two events in one network chunk: the general SSE decoder.
    return [event(chunk({"content": "x"})) + event({"choices": [key]}), DONE]


def _not_json(key: str) -> list[bytes]:
    return [f"data: oops {key}\n\n".encode()]


def _tool_args_not_an_object(key: str) -> list[bytes]:
    call = {"index": 0, "id": "c1", "function": {"name": "t", "arguments": json.dumps([key])}}
    return [event(chunk({"tool_calls": [call]})), event(chunk({}, finish_reason="tool_calls")),
            DONE]


def _tool_args_not_json(key: str) -> list[bytes]:
    call = {"index": 0, "id": "c1", "function": {"name": "t", "arguments": f"{{oops {key}"}}
    return [event(chunk({"tool_calls": [call]})), event(chunk({}, finish_reason="tool_calls")),
            DONE]


def _tool_args_cut_by_length(key: str) -> list[bytes]:
    call = {"index": 0, "id": "c1", "function": {"name": "t", "arguments": f'{{"k": "{key}'}}
    return [event(chunk({"tool_calls": [call]})), event(chunk({}, finish_reason="length")), DONE]


def _tool_call_without_name(key: str) -> list[bytes]:
    call = {"index": 0, "id": "c1", "function": {"arguments": json.dumps({"k": key})}}
    return [event(chunk({"tool_calls": [call]})), event(chunk({}, finish_reason="tool_calls")),
            DONE]


STREAMS: dict[str, Callable[[str], list[bytes]]] = {
    "error chunk": _error_chunk,
    "error chunk after text": _error_chunk_after_text,
    "named error event": _named_error_event,
    "wrong shape (fast path)": _wrong_shape_fast,
    "wrong shape (decoder)": _wrong_shape_general,
    "data not JSON": _not_json,
    "tool args not an object": _tool_args_not_an_object,
    "tool args not JSON": _tool_args_not_json,
    "tool args cut by the token limit": _tool_args_cut_by_length,
    "tool call without a name": _tool_call_without_name,
}


def _bodies(key: str) -> dict[str, Reply]:
    message = {"error": {"message": f"Incorrect API key provided: {key}", "code": key}}
    return {
        "HTTP 401 JSON": Reply.json(message, status=401),
        # httpcore logs the response's headers at DEBUG, in its own words.
        "HTTP 400, key echoed in a response header": Reply.json(
            message, status=400, headers={"X-Echo": key}),
        "HTTP 503 JSON (retried)": Reply.json(message, status=503),
        "HTTP 400 text, key at the 500-character cut": Reply.text("x" * 490 + key, status=400),
        "HTTP 400 text, escaped key": Reply.text(f"bad {key!r} / {json.dumps(key)}", status=400),
        "JSON completion not JSON": Reply(
            headers={"Content-Type": "application/json"}, parts=[f"{{{key}".encode()],
            framing="length",
        ),
        "JSON completion of the wrong shape": Reply.json({"choices": [{"message": key}]}),
    }


PATHS = [*STREAMS, *_bodies("k")]


def reply_for(path: str, key: str) -> Reply:
    if path in STREAMS:
        return Reply.sse(STREAMS[path](key))
    return _bodies(key)[path]


@pytest.mark.parametrize("key", [API_KEY, ODD_KEY], ids=["plain key", "odd key"])
@pytest.mark.parametrize("path", PATHS)
def test_an_echoed_key_never_shows(
    path: str,
    key: str,
    server: ScriptedServer,
    make_provider: ProviderFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    server.repeat(CHAT, reply_for(path, key))
    provider = make_provider(api_key=key)
    caplog.set_level(logging.DEBUG)

    with pytest.raises(ProviderError) as caught:
        provider.complete(HELLO)

    assert server.requests[0].headers["authorization"] == f"Bearer {key}"  # it was sent...
    assert leaks(everything_shown(caught.value), key) == []  # ...and is never shown
    assert leaks(caplog.text, key) == []
    assert leaks(str(caught.value.data), key) == []


@pytest.mark.parametrize("path", PATHS)
def test_a_credential_sent_in_a_header_of_the_endpoint_never_shows(
    path: str,
    server: ScriptedServer,
    make_provider: ProviderFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An endpoint authenticated by a header of its own (Azure's ``api-key``, ``x-api-key``),
    with no bearer key: its value echoed back is masked as a key is."""
    server.repeat(CHAT, reply_for(path, API_KEY))
    provider = make_provider(api_key=None, headers={"api-key": API_KEY, "X-Title": "Terret"})
    caplog.set_level(logging.DEBUG)

    with pytest.raises(ProviderError) as caught:
        provider.complete(HELLO)

    assert server.requests[0].headers["api-key"] == API_KEY  # it was sent...
    assert leaks(everything_shown(caught.value)) == []  # ...and is never shown
    assert leaks(caplog.text) == []
    assert leaks(str(caught.value.data)) == []


@pytest.mark.parametrize("value", [API_KEY + "\r", API_KEY + "\n", "k\u00e9y-" + API_KEY,
                                   "\x1b[31m" + API_KEY])
def test_a_header_value_no_request_can_carry_is_refused_when_configured_unquoted(
        value: str, make_provider: ProviderFactory) -> None:
    """It failed every turn with the value quoted (``Illegal header value b'…\\r'``, or a
    bare ``UnicodeEncodeError``): refused when the endpoint is configured or the provider
    built, naming the header and never the value."""
    with pytest.raises(ValueError) as configured:
        EndpointConfig(base_url="https://h.example/v1", headers={"api-key": value})
    with pytest.raises(ConfigurationError) as built:
        make_provider(headers={"api-key": value})
    for caught in (configured, built):
        assert "'api-key'" in str(caught.value) and leaks(str(caught.value)) == []


def test_retried_failures_log_a_clean_warning_per_retry(
    server: ScriptedServer, provider: OpenAICompatibleProvider, caplog: pytest.LogCaptureFixture
) -> None:
    server.script(
        CHAT,
        Reply.sse(_error_chunk(API_KEY)),
        Reply.json({"error": {"message": f"busy {API_KEY}"}}, status=503),
        Reply.sse(_error_chunk(API_KEY)),
    )
    caplog.set_level(logging.WARNING, logger="terret.providers")

    with pytest.raises(ProviderError) as caught:
        provider.complete(HELLO)

    retries = [r.getMessage() for r in caplog.records if "retry" in r.getMessage()]
    assert len(retries) == 2
    assert "upstream refused key ***" in retries[0] and "HTTP 503: busy ***" in retries[1]
    assert leaks("\n".join(retries)) == []
    assert "gave up after 3 attempts" in "".join(caught.value.__notes__)
    assert leaks(everything_shown(caught.value)) == []


def test_the_masked_text_still_says_what_went_wrong(
    server: ScriptedServer, provider: OpenAICompatibleProvider
) -> None:
    server.script(CHAT, Reply.sse(_tool_args_not_an_object(API_KEY)))

    with pytest.raises(ProviderError) as caught:
        provider.complete(HELLO)

    assert str(caught.value) == (
        "openrouter: arguments of tool call 't' are not a JSON object (data: '[\"***\"]')"
    )


# --- keys no header can carry -------------------------------------------------------------------

CRLF_KEYS = [
    API_KEY + "\r", API_KEY + "\r\n", API_KEY + "\n", " " + API_KEY,
    API_KEY[:9] + "\t" + API_KEY[9:],
]


@pytest.mark.parametrize("bad", CRLF_KEYS, ids=["CR", "CRLF", "LF", "leading space", "tab"])
def test_a_key_no_header_can_carry_is_refused_when_the_provider_is_built(
    bad: str, server: ScriptedServer, make_provider: ProviderFactory
) -> None:
    server.repeat(CHAT, Reply.sse(text_stream(["ok"])))

    with pytest.raises(ConfigurationError) as caught:
        make_provider(api_key=bad)

    message = str(caught.value)
    assert message.startswith("provider 'openrouter': the API key ")
    assert "HTTP header cannot carry it" in message
    # The frames that refused it unbound it: their locals do not show it either.
    assert leaks(everything_shown(caught.value)) == []
    assert server.requests == []


def test_a_key_refused_through_from_endpoint_is_in_no_frame(server: ScriptedServer) -> None:
    endpoint = EndpointConfig(base_url=server.url + "/api/v1")

    with pytest.raises(ConfigurationError) as caught:
        OpenAICompatibleProvider.from_endpoint("openrouter", endpoint,
                                               api_key=API_KEY + "\r\n")

    assert "HTTP header cannot carry it" in str(caught.value)
    assert leaks(everything_shown(caught.value)) == []


def test_a_crlf_key_in_the_environment_is_refused_naming_the_variable(
    server: ScriptedServer,
) -> None:
    config = ProvidersConfig(
        endpoints={"openrouter": EndpointConfig(base_url=server.url + "/api/v1",
                                                api_key_env="OPENROUTER_API_KEY")},
        retry=FAST_RETRY, timeouts=FAST_TIMEOUTS,
    )
    registry = ProviderRegistry(config, environ={"OPENROUTER_API_KEY": API_KEY + "\r\n"})

    with pytest.raises(ConfigurationError) as caught:
        registry.resolve("openrouter:acme/m")

    assert str(caught.value) == (
        "model spec 'openrouter:acme/m': provider 'openrouter': the API key in "
        "OPENROUTER_API_KEY ends with a carriage return (\\r) and a line feed (\\n) (a .env "
        "file saved with CRLF line endings?); an HTTP header cannot carry it. Fix the value: "
        "keys are not trimmed silently"
    )
    assert leaks(everything_shown(caught.value)) == []
    assert server.requests == []


def test_a_key_given_where_its_variable_name_belongs_is_refused_unquoted() -> None:
    """A key as ``api_key_env`` would be quoted by every error naming the variable (into a
    turn's recorded error); config built in code hides pydantic's input values too."""
    for build in (lambda: EndpointConfig(base_url="http://h/v1", api_key_env=API_KEY),
                  lambda: ProvidersConfig(openai_compatible_key_env=API_KEY),
                  lambda: EndpointConfig(base_url=API_KEY)):
        with pytest.raises(ValueError) as caught:
            build()
        assert leaks(everything_shown(caught.value, frame_locals=False)) == [], caught.value
    with pytest.raises(ConfigurationError, match="must name an environment variable") as morph:
        MorphSummarizer(api_key_env=API_KEY)
    assert leaks(everything_shown(morph.value)) == []  # frame locals included
    assert EndpointConfig(base_url="http://h/v1", api_key_env="_My_KEY2").api_key_env == "_My_KEY2"


def test_bearer_key_names_the_position_not_the_character() -> None:
    with pytest.raises(ConfigurationError, match=r"a non-ASCII character at position 4 of"):
        bearer_key("sk-é" + API_KEY)
    with pytest.raises(ConfigurationError, match=r"starts with a space"):
        bearer_key(" " + API_KEY)
    assert bearer_key(ODD_KEY).reveal() == ODD_KEY  # printable ASCII is fine


def test_morph_declines_a_crlf_key_without_showing_it(server: ScriptedServer) -> None:
    server.repeat("/v1/compact", Reply.json({"output": "kept"}))
    summarizer = MorphSummarizer(base_url=server.url, environ={"MORPH_API_KEY": API_KEY + "\r"})
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert summarizer.summarize([Message("user", "hello")]) is None
    finally:
        summarizer.close()
    assert caught
    assert leaks("\n".join(str(w.message) for w in caught)) == []


# --- the scrubber itself ------------------------------------------------------------------------


def _spellings_of(key: str) -> Iterable[str]:
    yield f"raw {key} end"
    yield f"repr {key!r} end"
    yield f"bytes repr {key.encode()!r} end"
    yield f"json {json.dumps(key)} end"
    yield f"json twice {json.dumps(json.dumps(key))} end"
    yield f"url {quote(key, safe='')} end"
    yield f"url lower {quote(key, safe='').lower()} end"
    yield f"repr of repr {repr(repr(key))} end"
    yield f"header Illegal header value {('Bearer ' + key).encode()!r} end"
    yield f"cut {key[:-5]} end"
    yield f"cut {key[4:]} end"
    yield f"upper {key.upper()} end"


@pytest.mark.parametrize("key", [API_KEY, ODD_KEY, API_KEY + "\r", API_KEY + "\r\n"])
def test_scrub_masks_every_spelling(key: str) -> None:
    secret = Secret(key)  # a Secret holds anything; only bearer_key refuses
    for text in _spellings_of(key):
        scrubbed = secret.scrub(text)
        assert leaks(scrubbed, key.strip()) == [], (text, scrubbed)
        assert "***" in scrubbed and scrubbed.endswith(" end"), scrubbed


@pytest.mark.parametrize("prefix", ["", "u:", "ab:", "Bearer "])
def test_scrub_masks_the_key_base64_encoded_at_any_offset(prefix: str) -> None:
    """A server may echo a request back Base64-encoded (a Basic header, an encoded body)."""
    secret = Secret(API_KEY)
    for encode in (base64.b64encode, base64.urlsafe_b64encode):
        encoded = encode((prefix + API_KEY + " tail").encode()).decode()
        scrubbed = secret.scrub(f"echo {encoded} end")
        assert "***" in scrubbed, scrubbed
        kept = scrubbed.replace("***", "\n")
        # What is left of the encoding does not decode to a run of the key.
        for piece in kept.split("\n"):
            assert len(piece) < 16 or API_KEY[:8] not in _decoded(piece), (prefix, scrubbed)


def _decoded(piece: str) -> str:
    text = ""
    for start in range(4):
        chunk = piece[start:]
        chunk = chunk[: len(chunk) // 4 * 4]
        try:
            text += base64.b64decode(chunk.replace("-", "+").replace("_", "/")).decode(
                "latin-1")
        except ValueError:
            continue
    return text


def test_scrub_leaves_other_text_alone() -> None:
    secret = Secret(API_KEY)
    text = "HTTP 401: Incorrect API key provided (code invalid_api_key); see the docs"
    assert secret.scrub(text) == text
    assert secret.scrub(f"key={API_KEY}; retry") == "key=***; retry"


def test_redact_cleans_a_chain_its_notes_and_its_attributes() -> None:
    class Opaque(Exception):
        def __str__(self) -> str:
            return f"opaque {API_KEY}"

    try:
        try:
            raise Opaque()
        except Opaque as inner:
            raise ValueError(f"wrapped {API_KEY}") from inner
    except ValueError as exc:
        outer = ProviderError("p", f"failed: {API_KEY}", data=API_KEY)
        outer.add_note(f"note {API_KEY}")
        outer.__cause__ = exc

    Secret(API_KEY).redact(outer)

    shown = everything_shown(outer)
    assert leaks(shown) == []
    assert str(outer) == "p: failed: *** (data: '***')" and outer.data == "***"
    assert "wrapped ***" in shown and "a chained Opaque was dropped" in shown


@pytest.mark.parametrize("key", [API_KEY, ODD_KEY], ids=["plain key", "odd key"])
def test_a_key_echoed_inside_a_complete_reply_is_masked_in_what_is_recorded(
        key: str, server: ScriptedServer, make_provider: ProviderFactory) -> None:
    """A server that echoes the key inside a *successful* reply (its text, a call's id or
    arguments, a call's name): the reply went to the log as the model's content, key and
    all — a name too, which the unknown tool's result then repeated."""
    server.repeat(CHAT, Reply.sse(tool_call_stream(
        [(f"call-{key}", "deploy", json.dumps({"token": key, "keep": "v2"})),
         ("call-2", f"t_{key}", "{}")],
        text=f"your key is {key}")))
    provider = make_provider(api_key=key)

    reply = provider.complete(HELLO)

    assert leaks(reply.text, key) == [] and reply.text.startswith("your key is ")
    call, named = reply.tool_calls
    assert call.name == "deploy" and call.args["keep"] == "v2"
    assert leaks(call.id, key) == [] and leaks(json.dumps(call.args), key) == []
    assert leaks(named.name, key) == [] and named.name.startswith("t_")
