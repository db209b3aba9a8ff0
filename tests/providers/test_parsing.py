"""The SSE decoder and the chunk parser on their own, held to the reference behaviour
(``json.loads`` and the SSE line rules) by property tests."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from terret.adapters.providers.chunks import ChunkParser
from terret.adapters.providers.sse import SSEDecoder
from tests.support.sse_server import KEEPALIVE, text_stream

ENVELOPE = '{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"gpt-x",'

json_scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=8)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)
choices = st.lists(
    st.fixed_dictionaries(
        {
            "index": st.just(0),
            "delta": st.dictionaries(st.sampled_from(["content", "role"]), st.text(max_size=6)),
        }
    ),
    max_size=2,
)


def chunk_text(members: dict[str, Any], choices_value: Any, tail: dict[str, Any]) -> str:
    body = json.dumps(members, separators=(",", ":"))[1:-1]
    text = (
        "{"
        + body
        + ("," if body else "")
        + '"choices":'
        + json.dumps(choices_value, separators=(",", ":"))
    )
    if tail:
        text += "," + json.dumps(tail, separators=(",", ":"))[1:-1]
    return text + "}"


def agrees(parsed: Any, expected: Any) -> bool:
    """Equal, or equal but for envelope members the assembler never reads."""
    if parsed == expected:
        return True
    if not (isinstance(parsed, dict) and isinstance(expected, dict)):
        return False
    dropped = expected.keys() - parsed.keys()
    return all(parsed[k] == expected[k] for k in parsed) and not dropped & {
        "choices",
        "error",
        "usage",
    }


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(
                [
                    {"id": "a", "model": "m"},
                    {"id": "b", "model": "m"},
                    {"id": "a", "usage": None},
                    {"error": None},
                    {},
                ]
            ),
            choices | json_values,
            st.dictionaries(
                st.sampled_from(["usage", "obfuscation", "x"]), json_values, max_size=2
            ),
            st.sampled_from(["", "", "", " ", "}", ",}", ", ", "x", "]"]),
        ),
        min_size=1,
        max_size=8,
    )
)
def test_the_chunk_parser_agrees_with_json_loads(
    chunks: list[tuple[dict[str, Any], Any, dict[str, Any], str]],
) -> None:
    parser = ChunkParser()
    for members, choices_value, tail, garbage in chunks:
        text = chunk_text(members, choices_value, tail) + garbage
        try:
            expected = json.loads(text)
        except ValueError:
            with pytest.raises(ValueError):
                parser.parse(text)
            continue
        assert agrees(parser.parse(text), expected), text


def test_the_chunk_parser_skips_a_known_envelope_and_honours_offsets() -> None:
    parser = ChunkParser()
    first = "data: " + ENVELOPE + '"choices":[{"delta":{"content":"a"}}]}' + "\n\n"
    second = (
        "data: "
        + ENVELOPE
        + '"choices":[{"delta":{"content":"b"}}],"usage":{"prompt_tokens":1}}'
        + "\n\n"
    )
    assert parser.parse(first, 6, len(first) - 2)["model"] == "gpt-x"  # parsed in full, learned
    assert parser.parse(second, 6, len(second) - 2) == {
        "choices": [{"delta": {"content": "b"}}],
        "usage": {"prompt_tokens": 1},
    }
    with pytest.raises(ValueError):
        parser.parse(ENVELOPE + '"choices":[]},}')
    with pytest.raises(ValueError):
        parser.parse(ENVELOPE + '"choices":[] garbage')


def test_an_envelope_holding_usage_or_error_is_never_skipped() -> None:
    parser = ChunkParser()
    envelope = '{"usage":{"prompt_tokens":3},"choices":'
    for _ in range(3):
        assert parser.parse(envelope + "[]}") == {"usage": {"prompt_tokens": 3}, "choices": []}


def events_of(data: bytes, cuts: list[int]) -> tuple[list[tuple[bytes, bytes]], bool]:
    decoder = SSEDecoder()
    events: list[tuple[bytes, bytes]] = []
    bounds = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    for start, end in zip(bounds, bounds[1:], strict=False):
        events.extend(decoder.feed(data[start:end]))
    events.extend(decoder.close())
    return events, decoder.torn


@given(
    st.lists(st.text(min_size=1, max_size=5), min_size=1, max_size=6),
    st.lists(st.integers(0, 10_000), max_size=12),
)
def test_sse_events_do_not_depend_on_where_the_network_cut_the_bytes(
    pieces: list[str], cuts: list[int]
) -> None:
    data = b"".join(text_stream(pieces))
    whole, _ = events_of(data, [])
    split, torn = events_of(data, cuts)
    assert split == whole and not torn
    assert [d for _, d in whole][-1] == b"[DONE]"
    assert sum(1 for _, d in whole if d.startswith(b"{")) == len(pieces) + 3  # role, stop, usage


def test_sse_line_rules() -> None:
    stream = (
        KEEPALIVE
        + b'event: error\r\ndata: {"a":1}\r\n\r\n'
        + b"data:no-space\n\n"
        + b"data: one\ndata: two\n\n"
        + b"id: 7\nretry: 10\ndata: x\n\n"
        + b"data: pending-without-blank-line\n"
    )
    events, torn = events_of(stream, [])
    assert events == [
        (b"error", b'{"a":1}'),
        (b"", b"no-space"),
        (b"", b"one\ntwo"),
        (b"", b"x"),
        (b"", b"pending-without-blank-line"),
    ]
    assert not torn
    _, torn = events_of(b'data: {"half', [])
    assert torn


@given(
    st.lists(st.text(min_size=1, max_size=5), min_size=1, max_size=6),
    st.lists(st.integers(0, 10_000), max_size=12),
    st.sampled_from([b"\r\n", b"\r"]),
)
def test_lines_ended_by_crlf_or_a_bare_cr_give_the_events_lf_gives_wherever_the_cuts_fall(
        pieces: list[str], cuts: list[int], ending: bytes) -> None:
    """SSE lets a line end in LF, CRLF or a bare CR: a server ending them with a bare CR was
    read as one line that never ended — the reply was lost."""
    lf = b"".join(text_stream(pieces)) + b": keep-alive\nevent: error\ndata: x\n\n"
    expected, _ = events_of(lf, [])
    events, torn = events_of(lf.replace(b"\n", ending), cuts)
    assert events == expected and not torn
    assert events[-1] == (b"error", b"x")


def test_a_bare_cr_ending_a_chunk_ends_its_line_at_once() -> None:
    """The reply's last event is handed on when its blank line arrives, not when the next
    chunk comes (which may be never: the server holds the stream open); an LF opening the next
    chunk is then the rest of a CRLF, not another blank line."""
    decoder = SSEDecoder()
    assert decoder.feed(b"data: one\r\r") == [(b"", b"one")]
    assert decoder.feed(b"\ndata: two\r\n") == []  # the LF finishes the CR; no empty event
    assert decoder.feed(b"\r") == [(b"", b"two")]
    assert decoder.feed(b"\n") == [] and decoder.idle
    assert decoder.feed(b"data: three\n\n") == [(b"", b"three")]


@given(st.lists(st.integers(0, 40), max_size=4))
def test_a_byte_order_mark_opening_the_stream_is_ignored_wherever_the_network_cuts_it(
        cuts: list[int]) -> None:
    """SSE says a leading U+FEFF is ignored: the first event (the reply's first text) was
    dropped without a word — its line read as a field with an unknown name."""
    stream = "\ufeff".encode() + b'data: {"a":1}\n\ndata: [DONE]\n\n'
    events, torn = events_of(stream, cuts)
    assert events == [(b"", b'{"a":1}'), (b"", b"[DONE]")] and not torn
    later, _ = events_of(b'data: {"b":2}\n\n' + "\ufeff".encode() + b"data: x\n\n", [])
    assert later[0] == (b"", b'{"b":2}')  # only the stream's first bytes may be a mark


def test_an_empty_chunk_after_a_trailing_cr_does_not_split_the_crlf() -> None:
    """The CR-then-LF bookkeeping was reset by an empty chunk between them: the LF then read
    as a blank line and cut an event in two."""
    decoder = SSEDecoder()
    events = [e for chunk in (b"data: x\r", b"", b"\n", b"data: y\n\n")
              for e in decoder.feed(chunk)]
    assert events == [(b"", b"x\ny")]
