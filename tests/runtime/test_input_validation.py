"""The runtime's API refuses text it cannot record with a typed ``InvalidPayload`` (issue 11) —
not a ``PydanticSerializationError`` from deep inside an append — and writes nothing: lone
surrogates in a turn's text or an injected one, malformed allow-list patterns and specs. On
SQLite and on the EventStoreDB adapter."""

from __future__ import annotations

import pytest

from terret import Actor, AgentDefinition
from terret.domain.errors import InvalidPayload, TerretError
from tests.runtime.conftest import MakeRuntime
from tests.runtime.kit import read_log

BAD = "deploy caf\udce9"  # what b"caf\xe9" becomes in a UTF-8 process's argv
OPERATOR = Actor(actor="operator")


def test_run_turn_with_a_lone_surrogate_is_a_typed_error_and_writes_nothing(
        make_runtime: MakeRuntime, store) -> None:
    rt = make_runtime()
    sid = rt.create_session()
    rt.spawn_agent(sid)
    before = read_log(store, sid)
    with pytest.raises(InvalidPayload) as info:
        rt.run_turn(sid, BAD)
    assert isinstance(info.value, TerretError)
    assert (info.value.wire_name, info.value.field) == ("user/message", "text")
    assert read_log(store, sid) == before
    # The agent is not left claimed or broken: a good turn runs next.
    assert rt.run_turn(sid, "deploy café").status == "completed"


def test_inject_set_model_and_verdicts_with_bad_text_are_typed_errors(
        make_runtime: MakeRuntime, store) -> None:
    rt = make_runtime()
    sid = rt.create_session()
    before = read_log(store, sid)
    refusals = [
        lambda: rt.inject(sid, BAD),
        lambda: rt.set_model(sid, "main", "scripted:x\n", by=OPERATOR),
        lambda: rt.set_model(sid, "main\n", "scripted:x", by=OPERATOR),
        lambda: rt.cancel(sid, by=OPERATOR, reason=BAD),  # refused before NoOpenTurn
        lambda: rt.approve(sid, BAD, by=OPERATOR),  # refused before ApprovalNotPending
        lambda: rt.deny(sid, "call-1", by=OPERATOR, reason=BAD),
    ]
    for refuse in refusals:
        with pytest.raises(InvalidPayload):
            refuse()
    assert read_log(store, sid) == before


@pytest.mark.parametrize("pattern", ["a]b[", "deploy!", "deploy\n", "[]", "fs.*\n"])
def test_set_policy_refuses_malformed_patterns(make_runtime: MakeRuntime, store,
                                               pattern: str) -> None:
    rt = make_runtime()
    sid = rt.create_session()
    before = read_log(store, sid)
    with pytest.raises(InvalidPayload) as info:
        rt.set_policy(sid, ["fs.*", pattern], by=OPERATOR)
    assert info.value.field.startswith("patterns")
    assert read_log(store, sid) == before
    rt.set_policy(sid, ["fs.[rw]*", "[!x]*"], by=OPERATOR)  # well-formed sets pass


def test_an_agent_definition_with_a_malformed_floor_cannot_start_a_session(
        make_runtime: MakeRuntime, store) -> None:
    rt = make_runtime(definition=AgentDefinition(name="ops", allow=["deploy!"]))
    head = store.head_position()
    with pytest.raises(InvalidPayload) as info:
        rt.create_session(agent="ops")
    assert info.value.field.startswith("policy_floor")
    assert store.head_position() == head
