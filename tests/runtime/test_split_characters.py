"""A model server that cuts text by UTF-16 units (JavaScript's ``slice``) sends a character
beyond the BMP as two escaped halves in two chunks. The turn's reply was repaired when
recorded, but nothing else was: ``terret chat`` printing the stream failed the turn
(``UnicodeEncodeError``: the reply, paid for, was not recorded), and a summary or a title made
over HTTP was refused by the log (``InvalidPayload``: the request paid for, the compaction
lost). The provider now puts the halves together, so the streamed text, the reply, the summary
and the title all hold the character — on SQLite and on the EventStoreDB adapter."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import terret
from terret.adapters.providers import EndpointConfig, ProviderRegistry, ProvidersConfig
from terret.domain.events import SessionCompacted, SessionTitled
from terret.domain.store import EventStore
from tests.providers.conftest import API_KEY, CHAT, FAST_RETRY, FAST_TIMEOUTS
from tests.runtime.kit import read_log, wait_for_event
from tests.support.sse_server import Reply, ScriptedServer, text_stream

PARTY = ["Done \ud83c", "\udf89 all green"]
"""🎉 in two halves, each chunk's JSON escaping its half (``json.dumps``' default)."""


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with ScriptedServer() as scripted:
        yield scripted


def test_a_character_split_across_chunks_reaches_the_stream_the_log_the_summary_and_title(
        store: EventStore, server: ScriptedServer) -> None:
    registry = ProviderRegistry(ProvidersConfig(
        endpoints={"openrouter": EndpointConfig(base_url=server.url + "/api/v1",
                                                api_key_env="OPENROUTER_API_KEY")},
        retry=FAST_RETRY, timeouts=FAST_TIMEOUTS), environ={"OPENROUTER_API_KEY": API_KEY})
    # The title after the turn, then the summary: one after the other (the title waits for
    # the turn's end, the compaction below for the title).
    server.script(CHAT, Reply.sse(text_stream(PARTY)), Reply.sse(text_stream(PARTY)),
                  Reply.sse(text_stream(PARTY)))
    runtime = terret.Runtime(store, resolver=registry, config=terret.RuntimeConfig(
        roles={"main": "openrouter:acme/m", "titler": "openrouter:acme/t",
               "compactor": "openrouter:acme/c"})).start()
    try:
        sid = runtime.create_session()
        streamed: list[str] = []
        runtime.spawn_agent(sid).on_text = streamed.append
        result = runtime.run_turn(sid, "status?")
        assert result.status == "completed" and result.text == "Done 🎉 all green"
        assert "".join(streamed) == result.text
        assert all(piece.encode() for piece in streamed)  # each printable as it came
        wait_for_event(store, sid, SessionTitled.wire_name)
        assert runtime.compact(sid) is not None
        log = read_log(store, sid)
        titles = [e.data["title"] for e in log if e.name == SessionTitled.wire_name]
        summaries = [e.data["summary"] for e in log if e.name == SessionCompacted.wire_name]
        assert titles == ["Done 🎉 all green"], titles
        assert len(summaries) == 1 and "Done 🎉 all green" in summaries[0], summaries
    finally:
        runtime.close()
        registry.close()

