"""The runtime's API refuses text it cannot record with a typed ``InvalidPayload`` (issue 11) —
not a ``PydanticSerializationError`` from deep inside an append — and writes nothing: lone
surrogates in a turn's text or an injected one, malformed allow-list patterns and specs. On
SQLite and on the EventStoreDB adapter."""

from __future__ import annotations

import pytest

from terret import Actor, AgentDefinition
from terret.domain.errors import InvalidPayload, SessionNotFound, TerretError
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


def test_run_turn_with_a_message_too_large_writes_nothing_and_the_same_on_every_store(
        make_runtime: MakeRuntime, store) -> None:
    """The claim (``agent/attached``) was written before the store refused the message; and a
    message under the 1 MiB a record may take was run on SQLite but refused on EventStoreDB
    (its ``turn/start`` and claim in one append over the 1 MiB an append may take), after the
    claim. A person's text is bounded alike on every store: ``MAX_MESSAGE_BYTES``."""
    from terret.domain.errors import PayloadTooLarge
    from terret.domain.events import MAX_MESSAGE_BYTES

    rt = make_runtime()
    sid = rt.create_session()
    before = read_log(store, sid)
    overhead = len('{"text":""}')
    for text in ("x" * (store.max_record_bytes + 1), "x" * (MAX_MESSAGE_BYTES - overhead + 1),
                 "é" * (MAX_MESSAGE_BYTES // 2)):
        with pytest.raises(PayloadTooLarge) as info:
            rt.run_turn(sid, text)
        assert (info.value.wire_name, info.value.limit) == ("user/message", MAX_MESSAGE_BYTES)
        with pytest.raises(PayloadTooLarge):
            rt.inject(sid, text)
    assert read_log(store, sid) == before
    assert rt.run_turn(sid, "x" * (MAX_MESSAGE_BYTES - overhead)).status == "completed"
    rt.inject(sid, "y" * (MAX_MESSAGE_BYTES - overhead - 64))


def test_inbox_entries_too_large_for_one_step_together_ride_the_steps_after(
        make_runtime: MakeRuntime, store) -> None:
    """Each accepted, three 400 KB inbox entries were injected into one step's append, which
    EventStoreDB refused whole: every turn after failed, the text never delivered. The turn's
    start takes as many as fit beside its input (they were queued before it), each step as many
    as fit; the rest ride the next steps."""
    from terret import ScriptedProvider
    from tests.runtime.kit import calls, final, only

    texts = [c * 400_000 for c in "abc"]
    rt = make_runtime(ScriptedProvider([calls(("status", {"env": "prod"})),
                                        calls(("status", {"env": "prod"})),
                                        final("read it all")]))
    sid = rt.create_session()
    for text in texts:
        rt.inject(sid, text)
    assert rt.run_turn(sid, "hi").status == "completed"
    log = read_log(store, sid)
    step, injected = 0, []  # (the entry's letter, the step that took it)
    for event in log:
        step += event.name == "step/start"
        if event.name == "context/injected":
            injected.append((event.data["text"][0], step))
    assert injected == [("a", 0), ("b", 1), ("c", 2)], injected
    assert len(only(log, "turn/end")) == 1


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


def test_an_agent_definition_the_log_could_not_record_is_refused_when_made() -> None:
    """A malformed floor or a name with whitespace around it was taken, and refused only when
    a session was created (``InvalidPayload`` on ``policy_floor``, ``agent``): the definition
    says so itself, as docs/runtime.md promises of every field."""
    from terret.domain.errors import ConfigurationError

    for made, said in [(dict(name="ops", allow=["deploy!"]), "agent 'ops': allow: "),
                       (dict(name="ops "), "agent 'ops ': name: ")]:
        with pytest.raises(ConfigurationError, match=f"^{said}"):
            AgentDefinition(**made)  # type: ignore[arg-type]


# --- what an outside probe of the API found -------------------------------------------------


def test_a_session_is_taken_as_a_uuid_its_string_or_its_stream_name(
        make_runtime: MakeRuntime, store) -> None:
    rt = make_runtime()
    sid = rt.create_session()
    for given in (str(sid), f"session-{sid}", str(sid).upper()):
        rt.set_title(given, f"titled via {given[:8]}", by=OPERATOR)
        rt.inject(given, "note")
        assert rt.pending(given) == [] and rt.resumable(given) is False
    assert rt.run_turn(str(sid), "hello").status == "completed"
    assert rt.run_turn(f"session-{sid}", "again").status == "completed"
    before = read_log(store, sid)
    for bad in ("not-a-session", 123, None, f"session-{sid}x"):
        with pytest.raises(SessionNotFound, match="is not a session id"):
            rt.run_turn(bad, "x")  # type: ignore[arg-type]
        with pytest.raises(SessionNotFound):
            rt.set_policy(bad, ["x"], by=OPERATOR)  # type: ignore[arg-type]
    assert read_log(store, sid) == before


def test_one_string_for_a_policy_a_title_that_is_no_text_and_blank_inbox_text_are_refused(
        make_runtime: MakeRuntime, store) -> None:
    rt = make_runtime()
    sid = rt.create_session()
    before = read_log(store, sid)
    with pytest.raises(InvalidPayload, match="a list of patterns, not one string") as info:
        rt.set_policy(sid, "deploy", by=OPERATOR)
    assert (info.value.wire_name, info.value.field) == ("policy/updated", "patterns")
    for title in (None, 123):
        with pytest.raises(InvalidPayload) as info:
            rt.set_title(sid, title, by=OPERATOR)  # type: ignore[arg-type]
        assert info.value.field == "title"
    for blank in ("", "  \n"):
        with pytest.raises(InvalidPayload) as info:
            rt.inject(sid, blank)
        assert (info.value.wire_name, info.value.field) == ("inbox/queued", "text")
    assert read_log(store, sid) == before
    rt.set_policy(sid, ["deploy"], by=OPERATOR)
    (updated,) = [e for e in read_log(store, sid) if e.name == "policy/updated"]
    assert updated.data["patterns"] == ["deploy"]


def test_the_typed_errors_import_as_terret_errors() -> None:
    import terret
    from terret.errors import SessionNotFound as Imported
    from terret.errors import TurnSuspended

    assert Imported is SessionNotFound is terret.errors.SessionNotFound
    assert issubclass(TurnSuspended, TerretError)
    assert terret.errors.TurnSuspended is TurnSuspended


def test_usage_and_title_of_an_unknown_session_are_session_not_found(
        make_runtime: MakeRuntime) -> None:
    from uuid import uuid4

    rt = make_runtime()
    for read in (rt.usage, rt.title, rt.pending, rt.budget):
        with pytest.raises(SessionNotFound):
            read(uuid4())


def test_a_refused_first_turn_claims_nothing(make_runtime: MakeRuntime, store) -> None:
    """No agent yet: the refused input is checked before the session is claimed, so not even
    ``agent/attached`` is written (and none has to be undone at close)."""
    rt = make_runtime()
    sid = rt.create_session()
    before = read_log(store, sid)
    with pytest.raises(InvalidPayload):
        rt.run_turn(sid, BAD)
    assert read_log(store, sid) == before
    assert rt.agent_for_session(sid) is None
    rt.close()
    assert read_log(store, sid) == before


@pytest.mark.parametrize("role", ["Main!", "", " main", "main\n", "ma in"])
def test_a_session_cannot_start_with_a_role_model_set_would_refuse(
        make_runtime: MakeRuntime, store, role: str) -> None:
    rt = make_runtime()
    head = store.head_position()
    with pytest.raises(InvalidPayload, match="invalid role") as info:
        rt.create_session(roles={role: "scripted:x"})
    assert (info.value.wire_name, info.value.field) == ("session/started", "roles")
    assert store.head_position() == head
    sid = rt.create_session(roles={"main": "scripted:x", "titler_2": "scripted:y"})
    rt.set_model(sid, "titler_2", "scripted:z", by=OPERATOR)


def test_an_agent_definition_refuses_one_string_for_its_floor() -> None:
    from terret.domain.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="not one string"):
        AgentDefinition(name="ops", allow="deploy")  # type: ignore[arg-type]
    assert AgentDefinition(name="ops", allow=["deploy"]).allow == ["deploy"]


@pytest.mark.parametrize("pattern", ["a b", "[]", "dep!oy", "", "fs[rw"])
def test_an_agent_definition_refuses_a_malformed_pattern_in_its_floor(pattern: str) -> None:
    """It was accepted, and so was a runtime built with it: only ``create_session`` refused
    it, and a turn on an existing session ran with that floor without a word."""
    from terret.domain.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match=r"^agent 'ops': allow: invalid pattern"):
        AgentDefinition(name="ops", allow=["deploy", pattern])
    assert AgentDefinition(name="ops", allow=["fs_[rw]*", "[!x]?", "*"]).allow
