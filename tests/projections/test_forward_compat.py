"""Forward compatibility (issue 11): a Terret event written by a newer release — a schema version
above the one this process knows, with a field it has never seen — is read as an opaque event
(kept as written, shown as unknown to this version). No projection processes it, so none halts,
and the views are what they would be without it; a rebuild gives the same views; the session
aggregate loads past it. On every store of the projection suite."""

from __future__ import annotations

import json
from typing import Any
from uuid import UUID, uuid4

from terret import OpaquePayload
from terret.domain import SessionRepository, decode
from terret.domain.catalogue import catalogue
from terret.domain.events import UsageData
from terret.domain.store import EventStore, NewRecord, session_stream
from terret.projections import ProjectionRunner, Views, ViewStore, default_projections
from tests.projections.logs import Writer

# Built-in wire names at a version above their class's, each with a field this release lacks.
NEWER: list[tuple[str, dict[str, Any]]] = [
    ("user/message", {"text": "from the future", "lang": "en"}),
    ("step/end", {"turn": 1, "step": 1, "usage": {"prompt_tokens": 5, "completion_tokens": 1},
                  "latency_ms": 12}),
    ("session/titled", {"title": "A newer title", "source": "model"}),
    ("policy/updated", {"patterns": ["*"], "mode": "allow"}),
    ("model/set", {"role": "main", "spec": "x:y", "pinned": True}),
    ("approval/resolved", {"call_id": "c9", "verdict": "approved", "by": {"actor": "user"},
                           "ttl": 3}),
    ("turn/end", {"turn": 1, "status": "completed", "cost_cap": 1.0}),
    ("session/started", {"agent": "other", "flavour": "new"}),
]


def newer_record(wire_name: str, data: dict[str, Any]) -> NewRecord:
    cls = catalogue.payload_class(wire_name)
    assert cls is not None
    meta = json.dumps({"schema_version": cls.version + 1}).encode()
    return NewRecord(uuid4(), wire_name, json.dumps(data).encode(), meta)


def finished(writer: Writer) -> UUID:
    sid = writer.start()
    writer.turn(sid, "hello", "hi there", usage=UsageData(prompt_tokens=10, completion_tokens=2))
    writer.do(sid, lambda s: s.title("Greetings"), lambda s: s.update_policy(["fs.*"]))
    return sid


def dumps(view_store: ViewStore) -> dict[str, Any]:
    return {p.name: p.dump(view_store.db) for p in default_projections()}


def test_a_newer_version_of_a_builtin_event_halts_no_projection(
        writer: Writer, store: EventStore, runner: ProjectionRunner, view_store: ViewStore,
        views: Views) -> None:
    sid = finished(writer)
    runner.catch_up()
    before = dumps(view_store)
    stream = session_stream(sid)
    version = store.stream_version(stream)
    store.append(stream, [newer_record(w, d) for w, d in NEWER], version)

    runner.catch_up()
    assert all(s.fault is None and s.lag == 0 for s in runner.states()), runner.states()
    after = dumps(view_store)
    # Nothing the newer events say reached a view (sessions only counts events it reads).
    for name in ("messages", "usage", "title", "policy", "models", "approvals", "status"):
        assert after.get(name) == before.get(name), name
    assert [m.text for m in views.messages(sid)] == ["hello", "hi there"]
    assert views.title(sid) == "Greetings"
    assert views.policy(sid) == ["fs.*"]
    assert views.usage(sid).prompt_tokens == 10
    for projection in runner.projections:
        assert runner.verify(projection.name) == [], projection.name

    # Kept as written, recognisable as a newer version.
    stored = store.read_stream(stream)[version:]
    events = [decode(r) for r in stored]
    assert [e.wire_name for e in events] == [w for w, _ in NEWER]
    for event, (wire, data) in zip(events, NEWER, strict=True):
        cls = catalogue.payload_class(wire)
        assert cls is not None
        assert event.is_opaque and event.version == cls.version + 1
        assert event.payload == OpaquePayload(wire, cls.version + 1, data)

    # The aggregate loads past them, and Terret's own commands keep working on the stream.
    repo = SessionRepository(store)
    session = repo.get(sid)
    assert session.version == store.stream_version(stream)
    assert not session.turn_open and session.state.agent == "default"
    writer.do(sid, lambda s: s.start_turn(text="again"))
    runner.catch_up()
    assert all(s.fault is None for s in runner.states())
    assert [m.text for m in views.messages(sid)][-1] == "again"
    summary = views.summary(sid)
    assert summary is not None and summary.events == store.stream_version(stream)


def test_a_newer_version_next_to_a_damaged_record(
        writer: Writer, store: EventStore, runner: ProjectionRunner) -> None:
    """The careful path (taken when a batch holds a record that cannot be decoded) passes over
    the newer event too: only the damaged record halts the projections that want it."""
    sid = finished(writer)
    runner.catch_up()
    stream = session_stream(sid)
    damaged = NewRecord(uuid4(), "session/titled", b'{"title": 5}', b'{"schema_version":1}')
    store.append(stream, [newer_record("session/titled", {"title": "t", "x": 1}), damaged,
                          newer_record("user/message", {"text": "t", "x": 1})],
                 store.stream_version(stream))
    records = store.read_stream(stream)
    runner.catch_up()
    faults = {s.name: s.fault for s in runner.states() if s.fault}
    assert "title" in faults and "messages" not in faults, faults  # messages: newer ones only
    assert {fault[0] for fault in faults.values()} == {records[-2].position}, faults


def test_an_extension_event_at_a_newer_version_is_opaque_too(
        writer: Writer, store: EventStore, view_store: ViewStore) -> None:
    from terret import EventPayload, event_type

    @event_type
    class Pinned(EventPayload):
        wire_name = "test.compat/pinned"
        note: str

    try:
        sid = writer.start()
        stream = session_stream(sid)
        store.append(stream, [NewRecord(uuid4(), Pinned.wire_name, b'{"note": "a", "by": "b"}',
                                        b'{"schema_version": 2}')], 1)
        event = decode(store.read_stream(stream)[-1])
        assert event.payload == OpaquePayload(Pinned.wire_name, 2, {"note": "a", "by": "b"})
        runner = ProjectionRunner(store, view_store, default_projections())
        runner.catch_up()
        assert all(s.fault is None and s.lag == 0 for s in runner.states())
    finally:
        catalogue.unregister("test.compat/pinned")
