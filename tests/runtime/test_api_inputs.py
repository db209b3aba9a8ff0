"""What the embedding API refuses, typed, with nothing written (found by a probe written from
docs/runtime.md): values of the wrong type that were decoded or coerced silently ("5" as a
budget of $5, bytes as text) or that escaped as Python's own errors, an agent definition's
fields, ids that are no session's, and every call on a closed runtime."""

from __future__ import annotations

from typing import Any
from uuid import uuid4

import pytest

from terret import Actor, AgentDefinition, Runtime, StaticResolver
from terret.domain.errors import (
    ConfigurationError,
    InvalidPayload,
    RuntimeStopping,
    SessionNotFound,
)
from terret.domain.store import EventStore
from tests.runtime.conftest import MakeRuntime, OpenedStore
from tests.runtime.kit import read_log

OPERATOR = Actor(actor="operator", id="api-inputs")


@pytest.mark.parametrize("call", [
    lambda rt, sid: rt.run_turn(sid, 42),
    lambda rt, sid: rt.run_turn(sid, b"hi there"),
    lambda rt, sid: rt.run_turn(sid, ["hi"]),
    lambda rt, sid: rt.inject(sid, b"later"),
    lambda rt, sid: rt.set_policy(sid, None, by=OPERATOR),
    lambda rt, sid: rt.set_policy(sid, 3, by=OPERATOR),
    lambda rt, sid: rt.set_budget(sid, "5", by=OPERATOR),
    lambda rt, sid: rt.set_budget(sid, True, by=OPERATOR),
    lambda rt, sid: rt.set_title(sid, b"title", by=OPERATOR),
    lambda rt, sid: rt.create_session(roles="main"),
    lambda rt, sid: rt.set_title(sid, "T", by={"actor": "operator", "id": b"ops-1"}),
    lambda rt, sid: rt.set_budget(sid, 1.0, by={"actor": "operator", "id": bytearray(b"x")}),
    lambda rt, sid: rt.set_model(sid, "main", b"scripted:x", by=OPERATOR),
    lambda rt, sid: rt.set_policy(sid, [b"deploy"], by=OPERATOR),
])
def test_a_value_of_the_wrong_type_is_invalid_and_writes_nothing(
        make_runtime: MakeRuntime, store: EventStore, call: Any) -> None:
    rt = make_runtime()
    sid = rt.create_session()
    before = read_log(store, sid)
    head = store.head_position()
    with pytest.raises(InvalidPayload):
        call(rt, sid)
    assert read_log(store, sid) == before and store.head_position() == head


def test_the_parts_of_payloads_refuse_a_bad_field_as_payloads_do(
        make_runtime: MakeRuntime) -> None:
    """``Actor``, ``ToolCallData`` and ``UsageData`` raised pydantic's own error, and an
    actor's id given as bytes was decoded and recorded."""
    from decimal import Decimal

    from terret.domain.events import ToolCallData, UsageData

    for make, field in ((lambda: Actor(actor="robot"), "actor"),
                        (lambda: Actor(actor="operator", id=b"ops-1"), "id"),
                        (lambda: ToolCallData(id="", name="x"), "id"),
                        (lambda: UsageData(prompt_tokens=-1, completion_tokens=0),
                         "prompt_tokens")):
        with pytest.raises(InvalidPayload, match=f"field '{field}'"):
            make()
    rt = make_runtime()
    sid = rt.create_session()
    rt.set_budget(sid, Decimal("1.5"), by=OPERATOR)  # a number, though not a float
    assert rt.budget(sid).limit == 1.5  # type: ignore[union-attr]


@pytest.mark.parametrize("fields", [
    {"revision": "2"}, {"revision": 0}, {"revision": True}, {"revision": 1.5},
    {"max_steps": "3"}, {"max_steps": 0}, {"max_steps": -1},
    {"tools": [print]}, {"tools": print}, {"instructions": None}, {"pre_step": [3]},
    {"allow": (p for p in ["deploy"])}, {"allow": [3]},
])
def test_an_agent_definition_with_a_field_it_cannot_use_is_refused_when_made(
        fields: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError, match=f"{next(iter(fields))}"):
        AgentDefinition(**fields)


def test_patterns_given_as_any_iterable_are_read_once(
        make_runtime: MakeRuntime, store: EventStore) -> None:
    """A generator of patterns is read at the boundary, once: a command re-run on a conflict
    would have found it empty and recorded deny-all."""
    rt = make_runtime()
    sid = rt.create_session()
    rt.set_policy(sid, (p for p in ["deploy", "fs.*"]), by=OPERATOR)
    assert rt.writer.load(sid).state.policy == ["deploy", "fs.*"]
    rt.set_policy(sid, {"deploy": 1}.keys(), by=OPERATOR)
    assert rt.writer.load(sid).state.policy == ["deploy"]
    assert AgentDefinition(allow=("deploy",)).allow == ("deploy",)


def test_an_id_that_is_no_sessions_is_refused_before_any_read(make_runtime: MakeRuntime) -> None:
    rt = make_runtime()
    for garbage in ("zzz", 123, "session-zzz", f"session-{rt.create_session()}x"):
        with pytest.raises(SessionNotFound):
            rt.catch_up_views(garbage)
    rt.catch_up_views(rt.create_session())  # a real one is fine, in any of its forms


def test_a_closed_runtime_refuses_every_call_typed_and_writes_nothing(
        make_runtime: MakeRuntime, store: EventStore) -> None:
    """Reads failed with SQLite's own error, ``compact`` waited 30 s for views that were
    closed, and writes still reached the log from a runtime that no longer serves."""
    rt = make_runtime()
    sid = rt.create_session()
    rt.run_turn(sid, "hello")
    rt.close(grace=1.0)
    head = store.head_position()
    for call in (lambda: rt.usage(sid), lambda: rt.title(sid), lambda: rt.compact(sid),
                 lambda: rt.inject(sid, "later"), lambda: rt.set_title(sid, "x", by=OPERATOR),
                 lambda: rt.create_session(), lambda: rt.close_session(sid, by=OPERATOR),
                 lambda: rt.run_turn(sid, "again"), rt.start, rt.serve_start,
                 lambda: rt.catch_up_views(sid)):
        with pytest.raises(RuntimeStopping, match="closed"):
            call()
    # The runtime's views, read directly (docs/runtime.md): SQLite's ProgrammingError before.
    views = rt.views
    for read in (views.status, views.messages, views.usage, views.title, views.pending,
                 lambda _: views.sessions()):
        with pytest.raises(RuntimeStopping, match="closed"):
            read(sid)
    assert store.head_position() == head
    rt.close()  # closing twice is harmless


@pytest.mark.parametrize("grace", ["1", -1, float("nan"), True, 10**400, 40_000_000])
def test_a_grace_that_is_no_number_of_seconds_is_refused(store: EventStore, grace: Any) -> None:
    rt = Runtime(store, resolver=StaticResolver())
    with pytest.raises(ConfigurationError, match="grace"):
        rt.close(grace=grace)
    rt.close()


PASTED_KEYS = ["openai:sk-proj-PASTED0123456789abcdefXYZ",
               "openrouter:Zq3Lk9Vb2Xw8Rt5Yp1Nm4Hs7Jd6Fg0Ca",  # a random run: upper, lower, digits
               "scripted:AKIAIOSFODNN7EXAMPLE"]


@pytest.mark.parametrize("spec", PASTED_KEYS)
def test_a_spec_that_looks_like_an_api_key_is_refused_by_the_python_api_too(
        make_runtime: MakeRuntime, opened: OpenedStore, spec: str) -> None:
    """The command line refused a key pasted where a model spec belongs; the Python API
    recorded it (model/set, session/started), in the log for good. Refused now, typed, with
    nothing written and the key quoted nowhere — from another process too; ``not_a_key=True``
    records a model name that only looks like one."""
    from terret import RuntimeConfig
    from tests.runtime.kit import other_process

    store = opened.store
    rt = make_runtime()
    sid = rt.create_session()
    head = store.head_position()
    with pytest.raises(InvalidPayload) as refused:
        rt.set_model(sid, "main", spec, by=OPERATOR)
    assert refused.value.field == "spec" and "API key" in str(refused.value)
    with pytest.raises(InvalidPayload) as refused_at_start:
        rt.create_session(roles={"main": spec})
    assert refused_at_start.value.field == "roles"
    with pytest.raises(ConfigurationError) as refused_in_config:
        RuntimeConfig(roles={"main": spec})
    model = spec.partition(":")[2]
    for error in (refused, refused_at_start, refused_in_config):
        assert model not in str(error.value)
    assert store.head_position() == head
    before = read_log(store, sid)
    other_process(opened.uri, "model", str(sid), "main", spec, returncode=1)
    assert read_log(store, sid) == before  # (the head: the runtime's beats move it meanwhile)

    rt.set_model(sid, "titler", spec, by=OPERATOR, not_a_key=True)
    assert [e.data["spec"] for e in read_log(store, sid) if e.name == "model/set"] == [spec]


def test_a_spec_holding_a_hosts_user_and_password_is_refused_whatever_the_flags(
        make_runtime: MakeRuntime, opened: OpenedStore) -> None:
    """``openai-compatible:admin:hunter2@gpu-box`` (no scheme) passed the URL check, was
    recorded, and its next step's error quoted it into turn/end. Refused by every writer
    (``not_a_key`` does not let it through: it is no model name), unquoted, nothing written."""
    from terret import RuntimeConfig
    from tests.runtime.kit import other_process

    spec = "openai-compatible:admin:hunter2SECRET@gpu-box"
    store = opened.store
    rt = make_runtime()
    sid = rt.create_session()
    before = read_log(store, sid)
    refusals = []
    for attempt in (lambda: rt.set_model(sid, "main", spec, by=OPERATOR),
                    lambda: rt.set_model(sid, "main", spec, by=OPERATOR, not_a_key=True),
                    lambda: rt.create_session(roles={"main": spec})):
        with pytest.raises(InvalidPayload) as refused:
            attempt()
        refusals.append(refused)
    with pytest.raises(ConfigurationError) as refused_in_config:
        RuntimeConfig(roles={"titler": spec})
    for error in (*refusals, refused_in_config):
        assert "hunter2" not in str(error.value) and "credentials" in str(error.value)
    other_process(opened.uri, "model", str(sid), "main", spec, returncode=1)
    assert read_log(store, sid) == before


def test_a_purged_sessions_id_is_not_taken_by_a_new_session(
        make_runtime: MakeRuntime, opened: OpenedStore) -> None:
    """On SQLite a purged id was taken: the new session then read as the purge unfinished,
    and doctor advised purging it — the new, live session. Refused on every store, typed,
    nothing written (EventStoreDB's tombstone refused it untyped)."""
    from tests.runtime.kit import other_process

    rt = make_runtime()
    sid = rt.create_session()
    other_process(opened.uri, "purge", str(sid))
    for given in (sid, str(sid)):
        with pytest.raises(InvalidPayload, match="was purged") as refused:
            rt.create_session(session_id=given)
        assert refused.value.field == "session_id"
    assert read_log(opened.store, sid) == []
    assert rt.create_session(session_id=uuid4()) != sid  # any other id is taken


class _OwnProvider:
    """A provider of the application's own, returning whatever it is given."""

    name = "own"

    def __init__(self, reply: object) -> None:
        self.reply = reply

    def complete(self, request: Any, *, on_text: Any = None, cancel: Any = None) -> Any:
        return self.reply


@pytest.mark.parametrize("reply, wrong", [
    (None, "returned NoneType, not a ModelReply"),
    ({"text": "hi"}, "returned dict, not a ModelReply"),
    ("ModelReply(text=None)", "text is NoneType, not str"),
    ("ModelReply(tool_calls=[{'id': 'a', 'name': 'x', 'args': {}}])", "tool_calls are not"),
    ("ModelReply(text='hi', usage={'prompt_tokens': 1})", "usage is dict"),
])
def test_a_provider_that_returns_no_model_reply_fails_the_turn_with_a_provider_error(
        store: EventStore, reply: Any, wrong: str) -> None:
    """An application's provider returning None, a dict, or a reply of the wrong types failed
    the turn with an AttributeError from deep in the loop; now a ProviderError naming the
    provider and what is wrong, recorded on the turn's end."""
    from terret.domain.errors import ProviderError
    from terret.runtime.model import ModelReply

    if isinstance(reply, str):
        reply = eval(reply, {"ModelReply": ModelReply})  # noqa: S307 - the cases above
    rt = Runtime(store, resolver=StaticResolver({"scripted": _OwnProvider(reply)}))
    try:
        sid = rt.create_session()
        with pytest.raises(ProviderError, match=wrong) as raised:
            rt.run_turn(sid, "go")
        assert raised.value.provider == "own"
        (end,) = [e for e in read_log(store, sid) if e.name == "turn/end"]
        assert end.data["status"] == "failed" and "ProviderError" in end.data["error"]
    finally:
        rt.close()


def test_a_runtime_of_parts_of_the_wrong_kind_is_refused_when_made(store: EventStore) -> None:
    """A dict given as the resolver was taken, and the first turn failed with an
    AttributeError; a path given as the store failed as obscurely."""
    with pytest.raises(ConfigurationError, match="resolver"):
        Runtime(store, resolver={"scripted": _OwnProvider(None)})  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="resolver"):
        Runtime(store, resolver=None)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="store"):
        Runtime("terret.db", resolver=StaticResolver())  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="config"):
        Runtime(store, resolver=StaticResolver(), config={"max_steps": 3})  # type: ignore[arg-type]


def test_create_session_takes_its_id_in_every_form_the_other_calls_take(
        make_runtime: MakeRuntime, store: EventStore) -> None:
    """``session_id`` as text raised a TypeError from the aggregate; anything else that is no
    id is InvalidPayload, with nothing written."""
    from uuid import uuid4

    rt = make_runtime()
    wanted = uuid4()
    assert rt.create_session(session_id=str(wanted)) == wanted
    assert rt.create_session(session_id=f"session-{uuid4()}") is not None
    head = store.head_position()
    for bad in ("not-an-id", 42):
        with pytest.raises(InvalidPayload, match="session_id"):
            rt.create_session(session_id=bad)  # type: ignore[arg-type]
    assert store.head_position() == head
