"""The role summarizer, the role titler and Morph's Compact API summarizer."""

from __future__ import annotations

import json
import traceback
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from terret.adapters.providers import ProviderRegistry, ProvidersConfig, RetryConfig, RoleResolver
from terret.adapters.providers.config import EndpointConfig
from terret.adapters.summarizers import MorphSummarizer, RoleSummarizer, SummarizerDeclined
from terret.adapters.titler import RoleTitler, clean_title
from terret.domain.errors import ConfigurationError, ProviderError
from terret.domain.messages import Message, ToolCall
from terret.runtime.model import ModelProvider
from terret.runtime.scripted import Reply as ScriptedReply
from terret.runtime.scripted import ScriptedProvider
from terret.runtime.summarizer import FixedSummarizer, RoleBound, Summarizer, render_history
from tests.support.sse_server import Reply, ScriptedServer, free_port, text_stream

HISTORY = (
    Message("user", "Deploy the api service to staging"),
    Message("assistant", "Deploying.", tool_calls=(ToolCall("c1", "deploy", {"service": "api"}),)),
    Message(
        "tool",
        "deploy id d-4711 failed: quota\nretry later",
        tool_call_id="c1",
        tool_name="deploy",
        is_error=True,
    ),
    Message("assistant", "The deploy failed on quota; I will retry."),
)
MORPH_KEY = "morph-SECRET-key-42"


def resolver(provider: ModelProvider, roles: dict[str, str]) -> RoleResolver:
    registry = ProviderRegistry(environ={})
    registry.register("scripted", provider)
    return registry.role_resolver(roles)


# --- RoleSummarizer ------------------------------------------------------------------------------


def test_role_summarizer_makes_one_utility_request_to_the_compactor_role() -> None:
    provider = ScriptedProvider([ScriptedReply(text="  Deploy d-4711 failed on quota.  ")])
    summarizer = RoleSummarizer(
        resolver(provider, {"main": "scripted:big", "compactor": "scripted:small"})
    )

    summary = summarizer.summarize(HISTORY)

    assert isinstance(summarizer, Summarizer)
    assert summary == "Summary of earlier conversation:\nDeploy d-4711 failed on quota."
    (request,) = provider.requests
    assert request.model == "small" and request.tools == ()
    system, user = request.messages
    assert system.role == "system" and "summary" in system.text.lower()
    assert user == Message("user", render_history(HISTORY))


def test_role_summarizer_raises_when_the_role_is_unconfigured() -> None:
    summarizer = RoleSummarizer(resolver(ScriptedProvider(), {"main": "scripted:big"}))
    with pytest.raises(ConfigurationError, match="'compactor' is not configured"):
        summarizer.summarize(HISTORY)
    with pytest.raises(ConfigurationError):
        summarizer.summarize(())  # even with nothing to summarize


def test_role_summarizer_lets_provider_errors_through_and_declines_on_empty_replies() -> None:
    provider = ScriptedProvider(
        [ScriptedReply(raises=ProviderError("scripted", "down")), ScriptedReply(text=" \n")]
    )
    summarizer = RoleSummarizer(resolver(provider, {"compactor": "scripted:small"}))
    with pytest.raises(ProviderError, match="down"):
        summarizer.summarize(HISTORY)
    assert summarizer.summarize(HISTORY) is None


def test_role_summarizer_over_http(server: ScriptedServer) -> None:
    server.script("/v1/chat/completions", Reply.sse(text_stream(["The deploy ", "failed."])))
    config = ProvidersConfig(
        endpoints={"local": EndpointConfig(base_url=server.url + "/v1")},
        retry=RetryConfig(max_retries=0),
        roles={"compactor": "local:summarizer-model"},
    )
    registry = ProviderRegistry(config, environ={})
    try:
        summary = RoleSummarizer(registry.role_resolver()).summarize(HISTORY)
    finally:
        registry.close()

    assert summary == "Summary of earlier conversation:\nThe deploy failed."
    body = server.requests[0].json()
    assert body["model"] == "summarizer-model"
    assert body["messages"][1] == {"role": "user", "content": render_history(HISTORY)}


def test_role_summarizer_without_a_resolver_is_bound_by_the_runtime_to_a_sessions_roles() -> None:
    provider = ScriptedProvider([ScriptedReply(text="summary")])
    unbound = RoleSummarizer()
    assert isinstance(unbound, RoleBound) and unbound.role == "compactor"
    with pytest.raises(ConfigurationError, match="no role resolver"):
        unbound.summarize(HISTORY)
    bound = unbound.for_session(resolver(provider, {"compactor": "scripted:small"}))
    assert bound is not unbound and bound.instruction == unbound.instruction
    assert bound.summarize(HISTORY) == "Summary of earlier conversation:\nsummary"
    assert provider.requests[0].model == "small"
    assert bound.for_session(resolver(provider, {})) is bound  # its own resolver is kept


def test_role_summarizer_asks_to_keep_the_latest_exchange() -> None:
    # the summary replaces the whole history, the latest turn included (R17, R18)
    assert "latest exchange" in RoleSummarizer().instruction


# --- FixedSummarizer -----------------------------------------------------------------------------


def test_fixed_summarizer_keeps_the_latest_lines_that_fit() -> None:
    summary = FixedSummarizer(limit=120).summarize(HISTORY)
    assert summary == (
        "Summary of earlier conversation:\n"
        "[3 earlier lines left out]\n"
        "[tool error deploy#c1] deploy id d-4711 failed: quota retry later\n"
        "[assistant] The deploy failed on quota; I will retry."
    )
    whole = FixedSummarizer(limit=1000).summarize(HISTORY)
    assert whole == "Summary of earlier conversation:\n" + render_history(HISTORY)


def test_fixed_summarizer_keeps_the_end_of_a_last_line_longer_than_its_limit() -> None:
    history = [Message("user", "hello"), Message("assistant", "x" * 50 + "THE END")]
    summary = FixedSummarizer(limit=20).summarize(history)
    assert summary == "Summary of earlier conversation:\n[1 earlier line left out]\n…" + (
        "x" * 13 + "THE END")
    assert FixedSummarizer(decline=True).summarize(history) is None
    assert FixedSummarizer().summarize([]) == "Summary of earlier conversation:\n"


@given(st.lists(st.text(max_size=60), max_size=12), st.integers(min_value=1, max_value=200))
def test_fixed_summarizer_always_ends_with_the_end_of_the_history(
        texts: list[str], limit: int) -> None:
    history = [Message("user" if i % 2 else "assistant", t) for i, t in enumerate(texts)]
    rendered = render_history(history)
    summary = FixedSummarizer(limit=limit).summarize(history)
    assert summary is not None and summary.startswith("Summary of earlier conversation:\n")
    assert summary.endswith(rendered.split("\n")[-1][-limit:])
    body = summary.removeprefix("Summary of earlier conversation:\n")
    note = len("[12 earlier lines left out]\n")
    assert len(body) <= limit + note + 1  # + 1: the ellipsis of a cut last line

# --- RoleTitler ----------------------------------------------------------------------------------


def test_role_titler_asks_the_titler_role_and_cleans_the_reply() -> None:
    provider = ScriptedProvider(
        [ScriptedReply(text='Title: "Staging deploy of the api service."\n')]
    )
    titler = RoleTitler(resolver(provider, {"titler": "scripted:tiny"}))

    assert titler.title(HISTORY) == "Staging deploy of the api service"
    assert provider.requests[0].model == "tiny"


def test_role_titler_raises_when_unconfigured_and_returns_none_on_empty() -> None:
    with pytest.raises(ConfigurationError):
        RoleTitler(resolver(ScriptedProvider(), {})).title(HISTORY)
    provider = ScriptedProvider([ScriptedReply(text=' "" ')])
    assert RoleTitler(resolver(provider, {"titler": "scripted:tiny"})).title(HISTORY) is None


@pytest.mark.parametrize(
    ("reply", "title"),
    [
        ("Fixing the flaky CI", "Fixing the flaky CI"),
        ("  'Quoted'  ", "Quoted"),
        ("“Curly quotes”", "Curly quotes"),
        ("**Bold title**", "Bold title"),
        ("Deploy to *prod*", "Deploy to prod"),  # the ends alone: 'Deploy to *prod'
        ("Greeting the **World**", "Greeting the World"),
        ("**Summary**: A and B", "Summary: A and B"),
        ("_Draft_ notes", "Draft notes"),
        ('Title: "Greeting the **World**".', "Greeting the World"),
        ("rename user_id to account_id", "rename user_id to account_id"),
        ("*Dangling marker", "Dangling marker"),
        ("# Heading title\nextra explanation", "Heading title"),
        ("\n\nSecond line wins\n", "Second line wins"),
        ("word " * 40, ("word " * 16).strip()),
        ("x" * 200, "x" * 80),
        ("", None),
        ('""', None),
    ],
)
def test_clean_title(reply: str, title: str | None) -> None:
    assert clean_title(reply) == title


@given(st.text())
def test_clean_title_is_short_and_tidy(reply: str) -> None:
    title = clean_title(reply)
    if title is not None:
        assert 0 < len(title) <= 80
        assert title == title.strip() and "\n" not in title
        assert title[0] not in "\"'`“”‘’" and title[-1] not in "\"'`“”‘’"


# --- MorphSummarizer -----------------------------------------------------------------------------

COMPACT = "/v1/compact"


MorphFactory = Callable[..., MorphSummarizer]


@pytest.fixture
def morph(server: ScriptedServer) -> Iterator[MorphFactory]:
    built: list[MorphSummarizer] = []

    def factory(**options: Any) -> MorphSummarizer:
        options.setdefault("environ", {"MORPH_API_KEY": MORPH_KEY})
        options.setdefault("base_url", server.url)
        options.setdefault("timeout", 1.0)
        summarizer = MorphSummarizer(**options)
        built.append(summarizer)
        return summarizer

    yield factory
    for summarizer in built:
        summarizer.close()


def compact_reply(*contents: str) -> Reply:
    messages = [
        {
            "role": "user",
            "content": content,
            "compacted_line_ranges": [{"start": 2, "end": 2}],
            "kept_line_ranges": [],
        }
        for content in contents
    ]
    return Reply.json(
        {"id": "cmp-1", "output": "\n".join(contents), "messages": messages, "usage": {}}
    )


def test_morph_sends_role_tagged_lines_and_returns_the_kept_text(
    server: ScriptedServer, morph: MorphFactory
) -> None:
    server.script(
        COMPACT,
        compact_reply("[user] Deploy the api service to staging", "", "[tool error deploy#c1] x"),
    )
    summarizer = morph(compression_ratio=0.4, preserve_recent=1, options={"include_markers": False})

    summary = summarizer.summarize(HISTORY)

    assert isinstance(summarizer, Summarizer)
    assert summary == (
        "Earlier conversation, condensed (lines removed, none reworded):\n"
        "[user] Deploy the api service to staging\n[tool error deploy#c1] x"
    )
    (request,) = server.requests
    assert request.path == COMPACT
    assert request.headers["authorization"] == f"Bearer {MORPH_KEY}"
    body = request.json()
    assert body["compression_ratio"] == 0.4 and body["preserve_recent"] == 1
    assert body["include_markers"] is False
    assert body["query"] == "Deploy the api service to staging"  # the last real user message
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user", "assistant"]
    assert [m["content"] for m in body["messages"]] == [render_history([m]) for m in HISTORY]


def test_morph_wraps_kept_messages_in_keep_context_and_strips_the_tags(
    server: ScriptedServer, morph: MorphFactory
) -> None:
    line = "[tool error deploy#c1] deploy id d-4711 failed: quota retry later"
    kept = f"<keepContext>\n{line}\n</keepContext>"
    server.script(COMPACT, Reply.json({"output": kept}))
    summarizer = morph(keep_context=lambda m: m.is_error, header="")

    assert (
        summarizer.summarize(HISTORY)
        == "[tool error deploy#c1] deploy id d-4711 failed: quota retry later"
    )
    sent = server.requests[0].json()["messages"][2]["content"]
    assert sent.startswith("<keepContext>\n") and sent.endswith("\n</keepContext>")


def _declines(summarizer: MorphSummarizer, reason: str) -> None:
    with pytest.warns(SummarizerDeclined, match=reason) as record:
        assert summarizer.summarize(HISTORY) is None
    for warning in record:
        assert MORPH_KEY not in str(warning.message)


def test_morph_declines_without_a_key(server: ScriptedServer, morph: MorphFactory) -> None:
    _declines(morph(environ={}), "no API key \\(set MORPH_API_KEY\\)")
    assert server.requests == []


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        (Reply.json({"error": f"bad key {MORPH_KEY}"}, status=401), "HTTP 401"),
        (Reply.json({"error": "overloaded"}, status=503), "HTTP 503"),
        (Reply.text('{"output": "half', status=200), "not valid JSON"),
        (Reply.json({"unexpected": True}), "unexpected reply shape"),
        (Reply.json({"messages": [{"role": "user", "content": 3}]}), "unexpected reply shape"),
        (Reply.json({"output": "  \n "}), "kept nothing"),
        (
            Reply(
                status=200,
                headers={"Content-Type": "application/json"},
                parts=[b'{"output": "to'],
                framing="length",
                cut=True,
            ),
            "request failed",
        ),
        (Reply.json({"output": "late"}, status=200, headers={}), None),
    ],
)
def test_morph_declines_on_every_failure(
    server: ScriptedServer, morph: MorphFactory, reply: Reply, reason: str | None
) -> None:
    timeout = 1.0
    if reason is None:  # a timeout: the reply comes after the client gave up
        reply.delay, timeout, reason = 0.6, 0.2, "Timeout"
    server.script(COMPACT, reply)
    _declines(morph(timeout=timeout), reason)


def test_morph_declines_when_unreachable(morph: MorphFactory) -> None:
    _declines(morph(base_url=f"http://127.0.0.1:{free_port()}"), "ConnectError")


def test_morph_never_raises_even_when_a_callback_does(morph: MorphFactory) -> None:
    def explode(message: Message) -> bool:
        raise RuntimeError(f"boom {MORPH_KEY}")

    _declines(morph(api_key=MORPH_KEY, environ={}, keep_context=explode), "boom")


def test_morph_with_nothing_to_compact_returns_none_quietly(
    server: ScriptedServer, morph: MorphFactory
) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert morph().summarize(()) is None
    assert server.requests == []
    assert MORPH_KEY not in repr(morph(api_key=MORPH_KEY))


def test_morph_accepts_a_base_url_ending_in_v1(server: ScriptedServer, morph: MorphFactory) -> None:
    server.script(COMPACT, Reply.json({"output": "kept"}))
    assert morph(base_url=server.url + "/v1/", header="").summarize(HISTORY) == "kept"
    assert (
        morph(base_url="https://api.morphllm.com/v1/").url == "https://api.morphllm.com/v1/compact"
    )
    assert json.loads(server.requests[0].body)["messages"]


@pytest.mark.parametrize("source", ["environment", "argument"])
def test_morph_masks_the_key_in_a_reply_that_echoes_it(
    server: ScriptedServer, morph: MorphFactory, source: str
) -> None:
    """The summary is recorded (``session/compacted``): a key the service echoes into it is
    masked, as in a provider's reply."""
    server.script(COMPACT, compact_reply(f"[user] the key is {MORPH_KEY}", "[assistant] ok"),
                  Reply.json({"output": f"kept {MORPH_KEY!r} and {MORPH_KEY.upper()}"}))
    options: dict[str, Any] = {"api_key": MORPH_KEY, "environ": {}} if source == "argument" else {}
    summarizer = morph(header="", **options)

    assert summarizer.summarize(HISTORY) == "[user] the key is ***\n[assistant] ok"
    assert summarizer.summarize(HISTORY) == "kept '***' and ***"


def test_morph_repr_works_on_an_instance_its_constructor_refused() -> None:
    """Reporters that show a traceback's locals repr the half-built ``self`` too; the refused
    name (often the key itself) is in no local of the frames."""
    half_built = MorphSummarizer.__new__(MorphSummarizer)
    assert repr(half_built) == "MorphSummarizer(url=None, api_key_env=None)"

    with pytest.raises(ConfigurationError) as caught:
        MorphSummarizer(api_key=MORPH_KEY, api_key_env=MORPH_KEY + "-not-a-name")

    shown = traceback.TracebackException.from_exception(caught.value, capture_locals=True)
    (frame,) = [f for f in shown.stack if f.name == "__init__"]
    assert frame.locals is not None and frame.locals["self"].startswith("MorphSummarizer(")
    assert not any(MORPH_KEY in value for value in frame.locals.values())
    assert caught.value.__context__ is None and caught.value.__cause__ is None
