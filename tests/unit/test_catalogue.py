"""The event catalogue: validation, extension events, upcasting and opaque events — each read
back through real stores (memory and SQLite)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar
from uuid import uuid4

import pytest
from pydantic import BaseModel, Field

import terret
from terret.adapters.stores.memory import MemoryStore
from terret.adapters.stores.sqlite import SQLiteStore
from terret.domain import errors, payloads
from terret.domain.catalogue import EventCatalogue, EventPayload, OpaquePayload, catalogue
from terret.domain.codec import decode, encode
from terret.domain.events import (
    COMMUTATIVE,
    MODEL_VISIBLE,
    AssistantMessage,
    ModelSet,
    StepEnded,
    TurnStarted,
    UsageData,
)
from terret.domain.repository import SessionRepository
from terret.domain.session import Session
from terret.domain.store import (
    CaughtUp,
    EventStore,
    NewRecord,
    StoredRecord,
    StreamState,
    session_stream,
)


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[EventStore]:
    store: EventStore = (
        MemoryStore() if request.param == "memory" else SQLiteStore(tmp_path / "t.db")
    )
    try:
        yield store
    finally:
        store.close()


class Bookmark(EventPayload):
    """An extension event, as a user of the framework would write one."""

    wire_name: ClassVar[str] = "acme/bookmark"
    version: ClassVar[int] = 1
    model_visible: ClassVar[bool] = True
    url: str = Field(pattern=r"^https?://")
    note: str | None = None


@pytest.fixture
def bookmark() -> Iterator[type[Bookmark]]:
    terret.event_type(Bookmark)
    try:
        yield Bookmark
    finally:
        catalogue.unregister(Bookmark.wire_name)


def raw(wire_name: str, data: dict[str, Any] | bytes, schema_version: int | None = 1
        ) -> NewRecord:
    meta = {} if schema_version is None else {"schema_version": schema_version}
    body = data if isinstance(data, bytes) else json.dumps(data).encode()
    return NewRecord(uuid4(), wire_name, body, json.dumps(meta).encode())


def subscribe_until_caught_up(store: EventStore, after: int, wire_names: list[str] | None
                              ) -> list[StoredRecord]:
    found: list[StoredRecord] = []
    with store.subscribe(after=after, wire_names=wire_names) as sub:
        timer = threading.Timer(10, sub.stop)
        timer.start()
        try:
            for item in sub:
                if isinstance(item, CaughtUp):
                    break
                if isinstance(item, StoredRecord):
                    found.append(item)
        finally:
            timer.cancel()
    return found


# --- the builtin catalogue -----------------------------------------------------------------


def test_builtin_flags_follow_the_architecture() -> None:
    assert COMMUTATIVE == {  # R5
        "approval/resolved", "inbox/queued", "policy/updated", "policy/reset", "model/set",
        "session/titled",
        "turn/cancel_requested", "budget/set", "tool/in_doubt_resolved", "usage/recorded",
        "session/compacted",
    }
    assert MODEL_VISIBLE == {
        "user/message", "context/injected", "assistant/message", "tool/result",
        "session/compacted",
    }
    assert all(catalogue.is_builtin(cls.wire_name) for cls in catalogue
               if cls.__module__ == "terret.domain.events")


def test_registration_errors() -> None:
    local = EventCatalogue()

    class Nameless(EventPayload):
        pass

    with pytest.raises(errors.ConfigurationError, match="has no wire_name"):
        local.register(Nameless)
    for name in ("", 5):
        unnamed = type("Unnamed", (EventPayload,), {
            "__annotations__": {"wire_name": ClassVar[str]}, "wire_name": name})
        with pytest.raises(errors.ConfigurationError, match="has no wire_name"):
            local.register(unnamed)
    with pytest.raises(errors.ConfigurationError, match="not an event payload class"):
        local.register(type("Plain", (), {"wire_name": "acme/plain"}))  # type: ignore[type-var]

    class First(EventPayload):
        wire_name: ClassVar[str] = "acme/thing"

    class Second(EventPayload):
        wire_name: ClassVar[str] = "acme/thing"

    local.register(First)
    local.register(First)  # the same class again is fine
    with pytest.raises(errors.DuplicateEventType):
        local.register(Second)
    with pytest.raises(errors.DuplicateEventType):
        catalogue.register(type("Imposter", (EventPayload,), {
            "__annotations__": {"wire_name": ClassVar[str]}, "wire_name": "turn/start",
        }))
    with pytest.raises(errors.UnknownEventType):
        encode(First())  # registered elsewhere, not in the process catalogue


@pytest.mark.parametrize("version", [0, -1, "2", True, 1.5, 2**31, 10**20])
def test_a_version_is_a_whole_number_from_one(version: object) -> None:
    """A version 1.5 wrote a record that could never be read back; "2" failed at encode."""
    local = EventCatalogue()
    odd = type("Odd", (EventPayload,), {
        "__annotations__": {"wire_name": ClassVar[str], "version": ClassVar[int]},
        "wire_name": "acme/odd", "version": version})
    with pytest.raises(errors.ConfigurationError, match="version"):
        local.register(odd)
    with pytest.raises(errors.ConfigurationError, match="from_version"):
        local.upcaster("acme/odd", version)  # type: ignore[arg-type]


@pytest.mark.parametrize("wire_name", ["acme/bad name", "acme/two\nlines", "acme/\ttab",
                                       "acme/" + "x" * 200])
def test_a_wire_name_is_printable_without_whitespace(wire_name: str) -> None:
    """A newline in a wire name forged a line of ``terret log``."""
    local = EventCatalogue()
    odd = type("Odd", (EventPayload,), {"__annotations__": {"wire_name": ClassVar[str]},
                                        "wire_name": wire_name})
    with pytest.raises(errors.ConfigurationError, match="is not a wire name"):
        local.register(odd)
    fine = type("Fine", (EventPayload,), {"__annotations__": {"wire_name": ClassVar[str]},
                                          "wire_name": "Acme.Bookmark/Saved:v"})
    assert local.register(fine) is fine


@pytest.mark.parametrize("flag", ["commutative", "model_visible"])
@pytest.mark.parametrize("value", ["no", 1, None])
def test_the_class_flags_are_true_or_false(flag: str, value: object) -> None:
    """``commutative = "no"`` registered as commutative, folding the event into a running
    turn (R5)."""
    local = EventCatalogue()
    odd = type("Odd", (EventPayload,), {"__annotations__": {"wire_name": ClassVar[str]},
                                        "wire_name": "acme/odd", flag: value})
    with pytest.raises(errors.ConfigurationError, match=f"{flag} is True or False"):
        local.register(odd)


@pytest.mark.parametrize("name", ["version", "wire_name", "commutative", "model_visible"])
def test_a_field_may_not_take_a_class_settings_name(name: str) -> None:
    """A field ``version: int = 3`` was written as schema version 3: the process that wrote
    the event read it back as opaque."""
    import warnings

    local = EventCatalogue()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pydantic's "shadows an attribute in parent"
        odd = type("Odd", (EventPayload,), {
            "__annotations__": {"wire_name": ClassVar[str], name: int},
            "wire_name": "acme/odd", **({} if name == "wire_name" else {name: 3})})
        if name == "wire_name":
            odd.wire_name = "acme/odd"  # type: ignore[attr-defined]
    with pytest.raises(errors.ConfigurationError, match="may not be named"):
        local.register(odd)


@pytest.mark.parametrize("version", ['"2"', "1.5", "true", "null", "[1]"])
def test_a_stored_schema_version_that_is_no_whole_number_is_a_corrupt_record(
        store: EventStore, version: str) -> None:
    """``"2"`` read as 2, ``1.5`` and ``true`` as 1 (running the wrong upcasters)."""
    stream = session_stream(uuid4())
    record = NewRecord(uuid4(), "turn/start", b'{"turn": 1}',
                       b'{"schema_version": ' + version.encode() + b'}')
    store.append(stream, [record], StreamState.NO_STREAM)
    with pytest.raises(errors.CorruptRecord, match="schema_version is not a whole number"):
        decode(store.read_stream(stream)[0])


def test_an_upcaster_is_one_per_step_and_terret_s_own_stay() -> None:
    """An app's upcaster for ``step/end`` replaced Terret's own (usage then decoded as None);
    a second one for the same step replaced the first, silently."""
    with pytest.raises(errors.DuplicateEventType, match="Terret's own"):
        catalogue.upcaster("step/end", 1)
    local = EventCatalogue()

    def first(data: dict[str, Any]) -> dict[str, Any]:
        return data

    def second(data: dict[str, Any]) -> dict[str, Any]:
        return data

    local.upcaster("acme/thing", 1)(first)
    local.upcaster("acme/thing", 1)(first)  # the same function again (a re-import) is fine
    with pytest.raises(errors.DuplicateEventType, match="one per step"):
        local.upcaster("acme/thing", 1)(second)
    # Imported again (a module reloaded): the same code at the same line is the same one.
    source = "def up(data):\n    return data\n"
    again: list[Any] = []
    for _ in range(2):
        namespace: dict[str, Any] = {"__name__": "acme.upgrades"}
        exec(compile(source, "acme/upgrades.py", "exec"), namespace)
        again.append(namespace["up"])
    local.upcaster("acme/other", 1)(again[0])
    local.upcaster("acme/other", 1)(again[1])
    # Two different functions of one name in one module, or two lambdas, are not.
    def up(data: dict[str, Any]) -> dict[str, Any]:  # noqa: F811
        return {**data, "stars": 5}
    shadow = up

    def up(data: dict[str, Any]) -> dict[str, Any]:  # type: ignore[no-redef]  # noqa: F811
        return {**data, "stars": 0}
    local.upcaster("acme/named", 1)(shadow)
    with pytest.raises(errors.DuplicateEventType, match="one per step"):
        local.upcaster("acme/named", 1)(up)
    local.upcaster("acme/lambda", 1)(lambda d: d)
    with pytest.raises(errors.DuplicateEventType, match="one per step"):
        local.upcaster("acme/lambda", 1)(lambda d: {**d})
    with pytest.raises(errors.ConfigurationError, match="not a function"):
        local.upcaster("acme/thing", 2)(42)  # type: ignore[arg-type]


def test_an_upcaster_from_the_class_s_own_version_or_later_is_refused() -> None:
    """It would never run (an upcaster turns version N into N + 1): a forgotten version bump."""
    local = EventCatalogue()

    class Thing(EventPayload):
        wire_name, version = "acme/thing", 2
        text: str = ""

    local.register(Thing)
    local.upcaster("acme/thing", 1)(lambda d: d)  # 1 -> 2: fine
    for step in (2, 3):
        with pytest.raises(errors.ConfigurationError, match="is at version 2, so it would "
                                                              "never run"):
            local.upcaster("acme/thing", step)(lambda d: d)
    # The same mistake the other way round: the upcaster first, then the class.
    other = EventCatalogue()
    other.upcaster("acme/other", 1)(lambda d: d)

    class Other(EventPayload):
        wire_name, version = "acme/other", 1
        text: str = ""

    with pytest.raises(errors.ConfigurationError, match="an upcaster from version 1 is "
                                                          "registered for it: it would never run"):
        other.register(Other)


def test_a_session_id_as_text_loads_a_session_that_takes_commands() -> None:
    from terret.adapters.stores import MemoryStore
    from terret.domain.repository import SessionRepository
    from terret.domain.session import Session

    repository = SessionRepository(MemoryStore())
    made = Session.start(agent="demo")
    repository.save(made)
    for form in (str(made.id), f"session-{made.id}"):
        loaded = repository.get(form)
        assert loaded.id == made.id and repository.exists(form)
        loaded.start_turn(text="go")  # raised eventsourcing's TypeError with a text id


def test_nan_and_inf_are_refused_when_the_payload_is_made() -> None:
    """They were stored as null, and the session's stream could no longer be read."""
    class Measured(EventPayload):
        wire_name: ClassVar[str] = "acme/measured"
        value: float

    for bad in (float("nan"), float("inf"), float("-inf")):
        with pytest.raises(errors.InvalidPayload, match="value"):
            Measured(value=bad)
    assert Measured(value=1.5).value == 1.5


def test_a_value_json_cannot_hold_is_refused_when_the_payload_is_made() -> None:
    """Bytes, sets, NaN or an object under ``Any`` failed at ``encode`` with pydantic's raw
    error, or were written as text, a list or null and read back as something else."""
    class Noted(EventPayload):
        wire_name: ClassVar[str] = "acme/noted"
        data: dict[str, Any]

    for bad, where in [(b"x", "data.k"), (b"\xff", "data.k"), (object(), "data.k"),
                       ({1, 2}, "data.k"), (float("nan"), "data.k"),
                       ([1, float("inf")], "data.k.1"), ({"n": {"m": b"q"}}, "data.k.n.m")]:
        with pytest.raises(errors.InvalidPayload) as raised:
            Noted(data={"k": bad})
        assert raised.value.field == where, bad
    for good in (1, 1.5, None, "text", [1, "a", None, {"x": True}], (1, 2)):
        made = Noted(data={"k": good})
        assert made.model_validate_json(made.to_json()).data == {"k": list(good) if isinstance(
            good, tuple) else good}

    class Dated(EventPayload):  # a typed field JSON gives back as it was is fine
        wire_name: ClassVar[str] = "acme/dated"
        when: dict[str, datetime]

    Dated(when={"a": datetime(2026, 12, 5, tzinfo=UTC)})


def test_a_key_json_would_turn_into_text_is_refused() -> None:
    """JSON writes a key 1, None or (1, 2) as text: it read back as another key, and
    {1: "a", "1": "b"} as one entry. A typed key (``dict[int, str]``) reads back as written."""
    class Keyed(EventPayload):
        wire_name: ClassVar[str] = "acme/keyed"
        value: Any = None
        data: dict[str, Any] = {}
        counts: dict[int, str] = {}

    for made, where in [(dict(value={1: "one"}), "value.1"),
                        (dict(value={None: 2}), "value.None"),
                        (dict(value={(1, 2): "t"}), "value.(1, 2)"),
                        (dict(value={1: "x", "1": "y"}), "value.1"),
                        (dict(data={"k": {2.5: "x"}}), "data.k.2.5"),
                        (dict(value=[{"a": {True: 1}}]), "value.0.a.True")]:
        with pytest.raises(errors.InvalidPayload) as raised:
            Keyed(**made)
        assert raised.value.field == where, made
        assert "keys other than text" in str(raised.value)
    typed = Keyed(counts={1: "one"}, data={"k": {"n": 1}})
    assert Keyed.model_validate_json(typed.to_json()) == typed


def test_an_untyped_field_is_held_to_json_as_its_items_are() -> None:
    """A bare ``Any`` field (not inside a dict or list) wrote NaN as null, bytes as text, a set
    as a list, failed at encode on an object, and a value containing itself ended in
    ``RecursionError``."""
    class Loose(EventPayload):
        wire_name: ClassVar[str] = "acme/loose"
        value: Any = None
        thing: object = None
        when: datetime | None = None  # typed: its own JSON form, read back as it was

    itself: list[Any] = []
    itself.append(itself)
    deep: list[Any] = []
    for _ in range(50_000):
        deep = [deep]
    for bad in (float("nan"), float("-inf"), b"x", {1, 2}, object(), datetime.now(UTC),
                itself, deep):
        for name in ("value", "thing"):
            with pytest.raises(errors.InvalidPayload) as raised:
                Loose(**{name: bad})
            assert raised.value.field == name, bad
    assert "contains itself" in str(pytest.raises(errors.InvalidPayload, Loose, value=itself)
                                    .value)
    with pytest.raises(errors.InvalidPayload) as raised:
        Loose(value={"x": itself})
    assert raised.value.field == "value"  # the field, not "<payload>"
    for good in (1, 1.5, None, "text", [1, {"x": [True, None]}], {"k": "v"}, 10**40):
        made = Loose(value=good, thing=good, when=datetime(2026, 12, 5, tzinfo=UTC))
        back = made.model_validate_json(made.to_json())
        assert (back.value, back.thing, back.when) == (good, good, made.when)


def test_an_integer_no_reader_could_parse_is_refused_when_the_payload_is_made(
        store: EventStore) -> None:
    """Python reads no integer of more than 4300 digits from JSON (``sys.int_info``): one was
    written, and every later read of the session's stream failed with ``CorruptRecord``."""
    class Counted(EventPayload):
        wire_name: ClassVar[str] = "acme/counted"
        n: int = 0
        value: Any = None
        data: dict[str, Any] = {}

    too_long = 10**payloads.INT_DIGITS  # the first integer with one digit too many
    for made, where in [(dict(n=too_long), "n"), (dict(n=-too_long), "n"),
                        (dict(value=too_long), "value"),
                        (dict(data={"k": [1, {"m": too_long}]}), "data.k.1.m")]:
        with pytest.raises(errors.InvalidPayload, match="more than 4300 digits") as raised:
            Counted(**made)
        assert raised.value.field == where, made
    longest = Counted(n=too_long - 1, value=-(too_long - 1), data={"k": too_long - 1})
    terret.event_type(Counted)
    try:
        stream = f"session-{uuid4()}"
        store.append(stream, [encode(longest)], StreamState.NO_STREAM)
        (read,) = store.read_stream(stream)
        assert decode(read).payload == longest
    finally:
        catalogue.unregister(Counted.wire_name)


def test_a_model_where_the_type_says_any_is_refused_it_would_read_back_a_dict() -> None:
    """A pydantic model under ``Any`` (or in a ``dict[str, Any]``) was written as its fields
    and read back as a plain dict, not equal to what was written."""
    class Point(BaseModel):
        x: int

    class Marked(EventPayload):
        wire_name: ClassVar[str] = "acme/marked"
        value: Any = None
        data: dict[str, Any] = {}
        points: list[Point] = []  # typed: read back as Points

    for made, where in [(dict(value=Point(x=1)), "value"),
                        (dict(value={"p": Point(x=1)}), "value.p"),
                        (dict(data={"k": [Point(x=1)]}), "data.k.0")]:
        with pytest.raises(errors.InvalidPayload, match="reads back as a dict") as raised:
            Marked(**made)
        assert raised.value.field == where, made
    typed = Marked(points=[Point(x=1)], data={"p": {"x": 1}})
    assert Marked.model_validate_json(typed.to_json()) == typed


# --- validation --------------------------------------------------------------------------


@pytest.mark.parametrize(("build", "wire_name", "field"), [
    (lambda: TurnStarted(turn=0), "turn/start", "turn"),
    (lambda: TurnStarted(), "turn/start", "turn"),
    (lambda: TurnStarted(turn=1, colour="red"), "turn/start", "colour"),
    (lambda: ModelSet(role="main", spec="gpt-4o"), "model/set", "spec"),
    (lambda: AssistantMessage(tool_calls=[{"id": "", "name": "x"}]), "assistant/message",
     "tool_calls.0.id"),
    (lambda: StepEnded(turn=1, step=1, usage={"prompt_tokens": -1, "completion_tokens": 0}),
     "step/end", "usage.prompt_tokens"),
])
def test_invalid_payload_names_the_field(build: Any, wire_name: str, field: str) -> None:
    with pytest.raises(errors.InvalidPayload) as info:
        build()
    assert info.value.wire_name == wire_name
    assert info.value.field == field
    assert repr(field) in str(info.value)


def test_an_invalid_command_payload_appends_nothing(store: EventStore) -> None:
    repo = SessionRepository(store)
    session = Session.start()
    repo.save(session)
    with pytest.raises(errors.InvalidPayload) as info:
        session.set_model("main", "not a spec")
    assert info.value.field == "spec"
    assert repo.save(session) is None
    assert store.stream_version(session_stream(session.id)) == 1


def test_stored_data_that_fails_validation_is_a_corrupt_record(store: EventStore) -> None:
    stream = session_stream(uuid4())
    store.append(stream, [raw("turn/start", {"turn": "first"})], StreamState.NO_STREAM)
    stored = store.read_stream(stream)[0]
    with pytest.raises(errors.CorruptRecord) as info:
        decode(stored)
    assert info.value.position == stored.position
    assert "turn" in info.value.reason


# --- extension events --------------------------------------------------------------------


def test_extension_events_validate_like_builtin_ones(bookmark: type[Bookmark]) -> None:
    with pytest.raises(errors.InvalidPayload) as info:
        bookmark(url="ftp://example.org")
    assert (info.value.wire_name, info.value.field) == ("acme/bookmark", "url")
    assert "acme/bookmark" in catalogue
    assert not catalogue.is_builtin("acme/bookmark")


def test_extension_events_are_stored_read_filtered_and_subscribed(
    store: EventStore, bookmark: type[Bookmark]
) -> None:
    start = store.head_position()
    repo = SessionRepository(store)
    session = Session.start()
    session.start_turn(text="save this link")
    repo.save(session)
    stream = session_stream(session.id)
    mark = bookmark(url="https://example.org", note="later")
    store.append(stream, [encode(mark, correlation_id="req-1")], session.version)
    session.end_turn("completed")
    with pytest.raises(errors.WrongExpectedVersion):
        repo.save(session)  # the aggregate sees the extension event like any other
    session = repo.get(session.id)
    session.end_turn("completed")
    repo.save(session)

    events = [decode(r) for r in store.read_stream(stream)]
    assert [e.wire_name for e in events] == [
        "session/started", "turn/start", "user/message", "acme/bookmark", "turn/end",
    ]
    read_back = events[3]
    assert read_back.payload == mark and isinstance(read_back.payload, Bookmark)
    assert read_back.version == 1 and read_back.correlation_id == "req-1"
    assert read_back.session_id == session.id and not read_back.is_opaque
    assert session.state.last_visible_seq == 4  # model_visible extension events count too

    only = store.read_all(after=start, wire_names=["acme/bookmark"])
    assert [decode(r).payload for r in only] == [mark]
    delivered = subscribe_until_caught_up(store, start, ["acme/bookmark", "turn/end"])
    assert [r.wire_name for r in delivered] == ["acme/bookmark", "turn/end"]
    assert decode(delivered[0]).payload == mark


def test_an_extension_upcaster_chain(store: EventStore) -> None:
    class Rating(EventPayload):
        wire_name: ClassVar[str] = "acme/rating"
        version: ClassVar[int] = 3
        stars: int = Field(ge=1, le=5)
        by: str

    terret.event_type(Rating)

    @terret.upcaster("acme/rating", 1)
    def _v1(data: dict[str, Any]) -> dict[str, Any]:
        data["stars"] = data.pop("score")
        return data

    @terret.upcaster("acme/rating", 2)
    def _v2(data: dict[str, Any]) -> dict[str, Any]:
        return {**data, "by": data.get("by", "unknown")}

    try:
        stream = session_stream(uuid4())
        store.append(stream, [
            raw("acme/rating", {"score": 4}, 1),
            raw("acme/rating", {"stars": 2}, 2),
            raw("acme/rating", {"stars": 5, "by": "ana"}, 3),
        ], StreamState.NO_STREAM)
        got = [decode(r) for r in store.read_stream(stream)]
        assert [e.payload for e in got] == [
            Rating(stars=4, by="unknown"), Rating(stars=2, by="unknown"),
            Rating(stars=5, by="ana"),
        ]
        assert [e.version for e in got] == [1, 2, 3]  # the version it was stored with
    finally:
        catalogue.unregister("acme/rating")


# --- upcasting step/end v1 -> v2 -------------------------------------------------------------


def test_step_end_v1_is_upcast_on_read(store: EventStore) -> None:
    start = store.head_position()
    stream = session_stream(uuid4())
    store.append(stream, [
        raw("step/end", {"turn": 1, "step": 1, "prompt_tokens": 120, "completion_tokens": 30,
                         "cost": 0.25}, 1),
        raw("step/end", {"turn": 1, "step": 2, "prompt_tokens": 7}, 1),
        raw("step/end", {"turn": 1, "step": 3}, 1),  # a resumed step: no usage
        raw("step/end", {"turn": 1, "step": 4}, None),  # no schema version: version 1
        encode(StepEnded(turn=1, step=5, usage=UsageData(prompt_tokens=1, completion_tokens=2))),
    ], StreamState.NO_STREAM)
    payloads = [decode(r).payload for r in store.read_stream(stream)]
    assert all(isinstance(p, StepEnded) for p in payloads)
    assert [p.usage for p in payloads] == [  # type: ignore[union-attr]
        UsageData(prompt_tokens=120, completion_tokens=30, cost=0.25),
        UsageData(prompt_tokens=7, completion_tokens=0),
        None,
        None,
        UsageData(prompt_tokens=1, completion_tokens=2),
    ]
    delivered = subscribe_until_caught_up(store, start, ["step/end"])
    assert [decode(r).payload for r in delivered] == payloads


def test_a_version_without_an_upcaster_is_a_corrupt_record(store: EventStore) -> None:
    stream = session_stream(uuid4())
    store.append(stream, [raw("turn/start", {"turn": 1}, 0)], StreamState.NO_STREAM)
    with pytest.raises(errors.CorruptRecord) as info:
        decode(store.read_stream(stream)[0])
    assert "upcaster" in info.value.reason


# --- unknown wire names ----------------------------------------------------------------------


def test_an_unknown_wire_name_reads_as_an_opaque_event(store: EventStore) -> None:
    start = store.head_position()
    repo = SessionRepository(store)
    session = Session.start()
    repo.save(session)
    stream = session_stream(session.id)
    data = {"feature": "from the future", "nested": {"n": [1, 2]}}
    store.append(stream, [raw("future/event", data, 7)], 1)

    event = decode(store.read_stream(stream)[1])
    assert event.is_opaque
    assert event.payload == OpaquePayload("future/event", 7, data)
    assert event.version == 7
    assert json.loads(event.payload.to_json()) == data  # nothing lost
    delivered = subscribe_until_caught_up(store, start, None)
    assert decode(delivered[-1]).payload == event.payload
    # the aggregate loads past it and keeps working
    loaded = repo.get(session.id)
    assert loaded.version == 2
    loaded.start_turn(text="still fine")
    repo.save(loaded)
    assert store.stream_version(stream) == 4


def test_an_extension_missing_in_this_process_reads_as_opaque(
    store: EventStore, bookmark: type[Bookmark]
) -> None:
    stream = session_stream(uuid4())
    store.append(stream, [encode(bookmark(url="https://example.org"))], StreamState.NO_STREAM)
    catalogue.unregister("acme/bookmark")  # as in a process without the extension installed
    event = decode(store.read_stream(stream)[0])
    assert event.payload == OpaquePayload("acme/bookmark", 1, {"url": "https://example.org"})
