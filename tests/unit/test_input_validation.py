"""Text the domain refuses (issue 11): lone surrogates anywhere in a payload, malformed allow-list
patterns, specs, roles and agent names — with ``InvalidPayload`` (a ``TerretError``) when the
payload is created, before anything is written, and before the session's rules are consulted.
Events already in a log are read as written. Error messages quote values cut short."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any
from uuid import uuid4

import pytest

from terret.adapters.stores import MemoryStore
from terret.domain import (
    Session,
    SessionRepository,
    catalogue,
    decode,
    encode,
    errors,
    session_stream,
)
from terret.domain.events import (
    Actor,
    AssistantMessage,
    ModelSet,
    PolicyUpdated,
    SessionStarted,
    ToolCallData,
    UserMessage,
    validate_model_spec,
    validate_pattern,
)
from terret.domain.store import NewRecord

BAD = "caf\udce9"  # b"caf\xe9" (Latin-1) read from a UTF-8 command line: surrogateescape
OPERATOR = Actor(actor="operator")


# --- lone surrogates -----------------------------------------------------------------------


@pytest.mark.parametrize("make, field", [
    (lambda: UserMessage(text=BAD), "text"),
    (lambda: UserMessage(text="ok", inbox_id=BAD), "inbox_id"),
    (lambda: AssistantMessage(text="ok", tool_calls=[
        ToolCallData(id="c1", name="deploy", args={"svc": ["a", {"v": BAD}]})]),
     "tool_calls.0.args.svc.1.v"),
    (lambda: SessionStarted(roles={"main": "a:b"}, policy_floor=["x"],
                            agent="ops"), None),
    (lambda: PolicyUpdated(patterns=["x"], by=Actor(actor="operator", id=BAD)), "by.id"),
])
def test_a_lone_surrogate_anywhere_in_a_payload_is_an_invalid_payload(
        make: Callable[[], Any], field: str | None) -> None:
    if field is None:
        make()  # the control: valid text passes
        return
    with pytest.raises(errors.InvalidPayload) as info:
        make()
    assert isinstance(info.value, errors.TerretError)
    assert info.value.field == field
    assert "not valid Unicode" in str(info.value)
    str(info.value).encode("utf-8")  # the message itself can be printed


def test_a_lone_surrogate_in_a_key_is_refused_too() -> None:
    call = ToolCallData(id="c1", name="x", args={BAD: 1})  # a part: checked with its payload
    with pytest.raises(errors.InvalidPayload) as info:
        AssistantMessage(tool_calls=[call])
    assert "key" in str(info.value)
    info.value.field.encode("utf-8")  # the field's name is printable too


Command = Callable[[Session], object]

# Each command given bad text, on a session where its rule would refuse it anyway (closed, or
# no open turn): the bad text is reported, not the rule, so the same input is always refused
# the same way.
COMMANDS: list[tuple[str, Command, str]] = [
    ("queue", lambda s: s.queue(BAD), "text"),
    ("start_turn", lambda s: s.start_turn(text=BAD), "text"),
    ("request_cancel", lambda s: s.request_cancel(by=OPERATOR, reason=BAD), "reason"),
    ("resolve_approval", lambda s: s.resolve_approval("c1", "denied", by=OPERATOR,
                                                      reason=BAD), "reason"),
    ("resolve_approval id", lambda s: s.resolve_approval(BAD, "approved", by=OPERATOR),
     "call_id"),
    ("record_tool_result", lambda s: s.record_tool_result("c1", "x", BAD), "content"),
    ("request_approval", lambda s: s.request_approval(BAD, "x", {}), "call_id"),
    ("record_assistant", lambda s: s.record_assistant(BAD), "text"),
    ("end_turn", lambda s: s.end_turn("failed", error=BAD), "error"),
    ("title", lambda s: s.title(BAD), "title"),
    ("compact", lambda s: s.compact(BAD, mark=s.version), "summary"),
    ("update_policy", lambda s: s.update_policy(["fs.*", "a]b["]), "patterns"),
    ("set_model", lambda s: s.set_model("main", "a:b\n"), "spec"),
    ("close", lambda s: s.close(by=OPERATOR, reason=BAD), "reason"),
]


@pytest.mark.parametrize("name, command, field", COMMANDS, ids=[c[0] for c in COMMANDS])
@pytest.mark.parametrize("closed", [False, True], ids=["idle", "closed"])
def test_commands_refuse_bad_text_first_and_record_nothing(
        name: str, command: Command, field: str, closed: bool) -> None:
    store = MemoryStore()
    repo = SessionRepository(store)
    session = Session.start()
    if closed:
        session.close(by=OPERATOR)
    repo.save(session)
    version = store.stream_version(session_stream(session.id))
    session = repo.get(session.id)
    with pytest.raises(errors.InvalidPayload) as info:
        command(session)
    assert info.value.field.startswith(field), info.value
    assert repo.save(session) is None  # nothing pending
    assert store.stream_version(session_stream(session.id)) == version


def test_runtime_style_start_turn_with_bad_text_leaves_the_session_idle() -> None:
    session = Session.start()
    with pytest.raises(errors.InvalidPayload):
        session.start_turn(text="ok" + BAD)
    assert not session.turn_open and session.current_turn == 0


# --- patterns, specs, roles, agent names ---------------------------------------------------


@pytest.mark.parametrize("pattern", [
    "deploy", "fs.*", "*", "?", "service_*", "mcp:github/create-issue", "fs.[rw]*", "[!x]*",
    "[a-z]?", "a-b.c_d:e/f",
])
def test_valid_patterns(pattern: str) -> None:
    assert validate_pattern(pattern) == pattern
    assert PolicyUpdated(patterns=[pattern]).patterns == [pattern]


@pytest.mark.parametrize("pattern, needle", [
    ("a]b[", "unbalanced brackets"),
    ("a[b", "unbalanced brackets"),
    ("]", "unbalanced brackets"),
    ("[]", "empty set"),
    ("[!]", "empty set"),
    ("[[a]]", "unbalanced brackets"),
    ("deploy!", "'!' only negates a set"),
    ("!deploy", "'!' only negates a set"),
    ("[a!]", "'!' only negates a set"),
    ("deploy\n", "use a glob"),
    ("deploy\r", "use a glob"),
    ("bad pattern", "use a glob"),
    ("", "use a glob"),
    ("fs.\\*", "use a glob"),
    ("d\u00e9ploy", "use a glob"),
    (BAD, "use a glob"),
])
def test_malformed_patterns_are_refused(pattern: str, needle: str) -> None:
    with pytest.raises(ValueError, match="invalid pattern") as info:
        validate_pattern(pattern)
    assert needle in str(info.value)
    with pytest.raises(errors.InvalidPayload) as refused:
        PolicyUpdated(patterns=["fs.*", pattern])
    assert refused.value.field.startswith("patterns")
    with pytest.raises(errors.InvalidPayload) as floor:
        SessionStarted(policy_floor=[pattern])
    assert floor.value.field.startswith("policy_floor")


@pytest.mark.parametrize("spec", ["a:b\n", "a:b\n\n", "a:b c", "a\n:b", ":b", "a:", "",
                                  "A:b", "a:" + BAD, "scripted:t\x1b]52;c;ZXZpbA==\x07",
                                  "a:b\x00", "a:b\u202egnp.exe"])
def test_malformed_model_specs_are_refused(spec: str) -> None:
    with pytest.raises(ValueError):
        validate_model_spec(spec)
    with pytest.raises(errors.InvalidPayload) as info:
        ModelSet(role="main", spec=spec)
    assert info.value.field == "spec"
    with pytest.raises(errors.InvalidPayload) as started:
        SessionStarted(roles={"main": spec})
    assert started.value.field.startswith("roles")


@pytest.mark.parametrize("role", ["main\n", "Main", "", "ma in", BAD])
def test_malformed_roles_are_refused(role: str) -> None:
    with pytest.raises(errors.InvalidPayload) as info:
        ModelSet(role=role, spec="a:b")
    assert info.value.field == "role"


@pytest.mark.parametrize("agent, needle", [
    ("", "at least 1"), ("   ", "blank"), ("\t", "blank"), (" ops", "whitespace"),
    ("ops\n", "whitespace"), ("o\x00ps", "control"), (BAD, "Unicode"),
])
def test_malformed_agent_names_are_refused(agent: str, needle: str) -> None:
    with pytest.raises(errors.InvalidPayload) as info:
        Session.start(agent=agent)
    assert info.value.field == "agent" and needle.lower() in str(info.value).lower()


def test_agent_names_people_use_are_accepted() -> None:
    for agent in ("default", "ops", "Ops Bot", "équipe-2", "a.b/c"):
        assert Session.start(agent=agent).state.agent == agent


# --- events already in a log are read as written -------------------------------------------


def test_records_an_older_release_accepted_stay_readable() -> None:
    """The old checks let a trailing newline and '!' through; sessions holding such events must
    still load (the stricter rules apply to new events only)."""
    store = MemoryStore()
    repo = SessionRepository(store)
    session = Session.start(roles={"main": "a:b"})
    repo.save(session)
    stream = session_stream(session.id)

    def raw(wire: str, data: str) -> NewRecord:
        return NewRecord(uuid4(), wire, data.encode(), b'{"schema_version":1}')

    store.append(stream, [raw("policy/updated", '{"patterns": ["deploy!", "a]b["]}'),
                          raw("model/set", '{"role": "main", "spec": "a:b\\n"}')], 1)
    events = [decode(r) for r in store.read_stream(stream)]
    assert events[1].payload == PolicyUpdated.model_validate({"patterns": ["deploy!", "a]b["]})
    assert isinstance(events[2].payload, ModelSet) and events[2].payload.spec == "a:b\n"
    assert repo.get(session.id).version == 3
    # Types are still checked on read.
    store.append(stream, [raw("model/set", '{"role": "main", "spec": 7}')], 3)
    with pytest.raises(errors.CorruptRecord):
        decode(store.read_stream(stream)[-1])


def test_valid_unicode_round_trips() -> None:
    payload = UserMessage(text="ok \u2603 \U0001f600 caf\u00e9")
    record = encode(payload)
    assert catalogue.decode(record.wire_name, 1, json.loads(record.data)) == payload


# --- messages quote values cut short -------------------------------------------------------


def test_a_huge_call_id_is_not_echoed_whole() -> None:
    session = Session.start()
    session.start_turn(text="hi")
    huge = "x" * 5_000_000
    for command in (lambda: session.resolve_approval(huge, "approved", by=OPERATOR),
                    lambda: session.record_tool_result(huge, huge, "r"),
                    lambda: session.request_approval(huge, "t", {})):
        with pytest.raises(errors.RuleViolation) as info:
            command()
        assert len(str(info.value)) < 300
        assert "5000000 characters" in str(info.value)


def test_a_huge_pattern_is_not_echoed_whole() -> None:
    with pytest.raises(errors.InvalidPayload) as info:
        PolicyUpdated(patterns=["x" * 1_000_000 + "!"])
    assert len(str(info.value)) < 400


def test_extension_payloads_get_the_same_text_check() -> None:
    from terret.domain import EventPayload, event_type

    @event_type
    class Noted(EventPayload):
        wire_name = "test.input/noted"
        text: str

    try:
        with pytest.raises(errors.InvalidPayload) as info:
            Noted(text=BAD)
        assert (info.value.wire_name, info.value.field) == ("test.input/noted", "text")
    finally:
        catalogue.unregister("test.input/noted")



def _nested(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


@pytest.mark.parametrize("levels", [199, 250, 257, 300, 900])
def test_a_payload_nested_deeper_than_the_log_can_read_back_is_refused(levels: int) -> None:
    """Tool arguments ~200 levels deep were written and then could not be decoded (the JSON
    parser's depth limit): the session's log no longer read. Deeper ones failed the append
    with pydantic's serialization error. Refused when the payload is made, typed."""
    from terret.domain.events import AssistantMessage, ToolCallData

    with pytest.raises(errors.InvalidPayload) as info:
        AssistantMessage(text="", tool_calls=[ToolCallData(id="c", name="f",
                                                            args=_nested(levels))])
    assert info.value.field.startswith("tool_calls.0.args")


def test_a_payload_nested_as_deep_as_providers_accept_is_written_and_read_back() -> None:
    from terret.adapters.providers.stream import MAX_ARGUMENT_DEPTH
    from terret.domain.codec import encode
    from terret.domain.events import AssistantMessage, ToolCallData

    made = AssistantMessage(text="", tool_calls=[ToolCallData(
        id="c", name="f", args=_nested(MAX_ARGUMENT_DEPTH))])
    assert AssistantMessage.model_validate_json(encode(made).data) == made
