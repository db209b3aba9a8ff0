"""Extending Terret: a custom event type and a custom projection over it run beside the default
projections, feed listeners with typed payloads, and replay from scratch like the built-in ones.
The example in docs/projections.md is executed here too, so it cannot rot."""

from __future__ import annotations

import json
import queue
import re
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import pytest

import terret
from terret import RecordedEvent
from terret.adapters.stores.memory import MemoryStore
from terret.domain import encode
from terret.domain.store import EventStore, NewRecord, session_stream
from terret.projections import Projection, ProjectionRunner, Views, ViewStore, default_projections
from tests.projections.logs import Writer

WIRE = "acme.note/added"
WAIT = 10.0
DOC = Path(__file__).resolve().parents[2] / "docs" / "projections.md"


@pytest.fixture
def note_type() -> Iterator[type[terret.EventPayload]]:
    @terret.event_type
    class NoteAdded(terret.EventPayload):
        """Version 2 carries a list of tags; version 1 carried a single optional tag."""

        wire_name = WIRE
        version = 2
        text: str
        tags: list[str] = []

    @terret.upcaster(WIRE, 1)
    def _v1(data: dict[str, Any]) -> dict[str, Any]:
        tag = data.pop("tag", None)
        data["tags"] = [tag] if tag else []
        return data

    yield NoteAdded
    terret.catalogue.unregister(WIRE)
    assert WIRE not in terret.catalogue


class NotesProjection(Projection):
    """Notes per session, numbered by the turn they were taken in (it also follows turn/start:
    a custom projection may combine Terret's events with its own)."""

    name = "acme.notes"
    handles = frozenset({WIRE, "turn/start"})
    tables = ("acme_notes", "acme_turns")
    schema = """
    CREATE TABLE IF NOT EXISTS acme_notes (
        session TEXT NOT NULL, seq INTEGER NOT NULL, turn INTEGER NOT NULL, text TEXT NOT NULL,
        tags TEXT NOT NULL, PRIMARY KEY (session, seq)) WITHOUT ROWID;
    CREATE TABLE IF NOT EXISTS acme_turns (session TEXT PRIMARY KEY, turn INTEGER NOT NULL);
    """

    def process(self, db: sqlite3.Connection, event: RecordedEvent) -> None:
        p: Any = event.payload
        if event.wire_name == "turn/start":
            db.execute("INSERT OR REPLACE INTO acme_turns VALUES (?, ?)", (event.stream, p.turn))
            return
        row = db.execute("SELECT turn FROM acme_turns WHERE session = ?",
                         (event.stream,)).fetchone()
        db.execute("INSERT INTO acme_notes VALUES (?, ?, ?, ?, ?)",
                   (event.stream, event.seq, row[0] if row else 0, p.text, json.dumps(p.tags)))


def read_notes(views: ViewStore, session: UUID) -> list[tuple[int, str, list[str]]]:
    with views.reading() as db:
        return [(turn, text, json.loads(tags)) for turn, text, tags in db.execute(
            "SELECT turn, text, tags FROM acme_notes WHERE session = ? ORDER BY seq",
            (session_stream(session),))]


def _append(store: EventStore, session: UUID, payload: terret.EventPayload) -> int:
    stream = session_stream(session)
    return store.append(stream, [encode(payload)], store.stream_version(stream)).position


def test_a_custom_event_and_projection_run_beside_the_defaults_and_replay(
    note_type: type[terret.EventPayload], writer: Writer, store: EventStore,
    view_store: ViewStore
) -> None:
    sid = writer.start()
    _append(store, sid, note_type(text="before any turn"))
    writer.turn(sid, "first")
    # An old (version 1) record, as an older release of the extension wrote it.
    stream = session_stream(sid)
    store.append(stream, [NewRecord(uuid4(), WIRE, b'{"text": "old", "tag": "legacy"}',
                                    b'{"schema_version": 1}')], store.stream_version(stream))

    runner = ProjectionRunner(store, view_store, [*default_projections(), NotesProjection()])
    got: queue.Queue[RecordedEvent] = queue.Queue()
    runner.add_listener(got.put, [WIRE])
    runner.start()
    try:
        writer.turn(sid, "second")
        last = _append(store, sid, note_type(text="during turn two", tags=["a", "b"]))
        event = got.get(timeout=WAIT)
        assert isinstance(event.payload, note_type)  # typed, not opaque
        assert event.position == last
        runner.wait_until(last, timeout=WAIT)
    finally:
        runner.stop()

    expected = [(0, "before any turn", []), (1, "old", ["legacy"]),
                (2, "during turn two", ["a", "b"])]
    assert read_notes(view_store, sid) == expected
    # Terret's views carry on beside it, and the session index counts the extension's events.
    views = Views(view_store)
    assert [m.text for m in views.messages(sid)] == ["first", "ok", "second", "ok"]
    summary = views.summary(sid)
    assert summary is not None and summary.events == store.stream_version(stream)
    assert all(s.fault is None for s in runner.states())

    # Replay from scratch.
    assert runner.verify("acme.notes") == []
    view_store.db.execute("UPDATE acme_notes SET text = 'edited' WHERE turn = 0")
    assert runner.verify("acme.notes") != []
    assert runner.rebuild("acme.notes") == store.head_position()
    assert read_notes(view_store, sid) == expected
    assert runner.verify("acme.notes") == []
    assert runner.verify("sessions") == []


def test_without_the_extension_installed_its_events_are_opaque_and_ignored(
    note_type: type[terret.EventPayload], writer: Writer, store: EventStore,
    view_store: ViewStore
) -> None:
    sid = writer.start()
    _append(store, sid, note_type(text="kept"))
    terret.catalogue.unregister(WIRE)  # a process that lacks the extension
    runner = ProjectionRunner(store, view_store, default_projections())
    runner.catch_up()
    assert all(s.fault is None and s.lag == 0 for s in runner.states())
    summary = Views(view_store).summary(sid)
    # Opaque here, the note is still an event of the session's log: the index counts it (as
    # `terret log` shows it), and nothing else reads it.
    assert summary is not None and summary.events == 2


def _doc_example() -> str:
    text = DOC.read_text()
    blocks = re.findall(r"<!-- tested example -->\s*```python\n(.*?)```", text, re.S)
    assert len(blocks) == 1, "docs/projections.md should mark exactly one tested example"
    return blocks[0]


def test_the_custom_projection_example_in_the_docs_runs() -> None:
    namespace: dict[str, Any] = {"__name__": "docs_example"}
    try:
        exec(compile(_doc_example(), str(DOC), "exec"), namespace)  # noqa: S102
    finally:
        for cls in list(terret.catalogue):
            if cls.__module__ == "docs_example":
                terret.catalogue.unregister(cls.wire_name)
    assert namespace["checked"] is True


NOTE_WRITER = """
import sys
from uuid import UUID
from terret import open_store
from terret.domain import NewRecord, session_stream
from uuid import uuid4

store = open_store(sys.argv[1])
stream = session_stream(UUID(sys.argv[2]))
record = NewRecord(uuid4(), "acme.note/added", b'{"text": "from another process"}',
                   b'{"schema_version": 2}')
print(store.append(stream, [record], store.stream_version(stream)).position)
store.close()
"""


def test_a_registered_projection_is_maintained_by_the_runtime(
    note_type: type[terret.EventPayload], opened_store: Any, tmp_path: Path
) -> None:
    """``@terret.register_projection``: a Runtime (and so ``terret serve``) maintains the
    projection beside Terret's, here fed by a turn of its own and by another process's
    append; bad registrations are configuration errors."""
    if opened_store.uri is None:
        pytest.skip("another process needs a store it can open")
    terret.register_projection(NotesProjection)
    try:
        rt = terret.Runtime(opened_store.store, views=str(tmp_path / "views.db"),
                            resolver=terret.StaticResolver(
                                {"scripted": terret.ScriptedProvider([terret.Reply(text="hi")])}))
        assert "acme.notes" in [p.name for p in rt.runner.projections]
        session = rt.create_session()
        rt.run_turn(session, "hello")
        script = tmp_path / "note_writer.py"
        script.write_text(NOTE_WRITER)
        done = subprocess.run([sys.executable, str(script), opened_store.uri, str(session)],
                              capture_output=True, text=True, timeout=60,
                              cwd=Path(__file__).resolve().parents[2])
        assert done.returncode == 0, done.stderr
        rt.catch_up_views(session)
        assert read_notes(rt.view_store, session) == [(1, "from another process", [])]
        rt.close()
    finally:
        terret.projections.unregister_projection("acme.notes")

    class Unnamed(NotesProjection):
        name = ""

    class NeedsArgs(NotesProjection):
        name = "acme.needs"

        def __init__(self, x: int) -> None:
            self.x = x

    class Sessions(NotesProjection):
        name = "sessions"

    class Titles(NotesProjection):  # a rebuild of it emptied Terret's title view
        name, tables = "acme.titles", ("titles",)

    class Bookkeeping(NotesProjection):
        name, tables = "acme.tracking", ("tracking",)

    class Untabled(NotesProjection):
        name, tables = "acme.untabled", "acme_notes"  # a string, not a tuple

    class Versioned(NotesProjection):  # a text version broke status and every log line
        name, version = "acme.versioned", "2"

    class Unversioned(NotesProjection):
        name, version = "acme.unversioned", 0

    class Unschemed(NotesProjection):  # failed every command given the module, unnamed
        name, tables, schema = "acme.unschemed", ("acme_x",), "CREATE TABLEX nonsense"

    class Committing(NotesProjection):  # it would end the transaction of a views reset
        name, tables = "acme.committing", ("acme_z",)
        schema = "BEGIN; CREATE TABLE acme_z (a); COMMIT"

    class Reopening(NotesProjection):  # it ends the transaction, then opens another
        name, tables = "acme.reopening", ("acme_r",)
        schema = "COMMIT; BEGIN; CREATE TABLE acme_r (a)"

    class Sneaky(NotesProjection):  # a table it does not declare escaped the ownership check
        name, tables = "acme.sneaky", ("acme_y",)
        schema = "CREATE TABLE acme_y (a); CREATE TABLE titles2 (b)"

    class Dropping(NotesProjection):  # it dropped the title view's table, halting nothing
        name, tables = "acme.dropping", ("acme_d",)
        schema = "DROP TABLE IF EXISTS titles; CREATE TABLE IF NOT EXISTS acme_d (a)"

    class Attaching(NotesProjection):  # its trial created the attached file on disk
        name, tables = "acme.attaching", ("acme_a",)
        schema = f"ATTACH DATABASE '{tmp_path / 'attached.db'}' AS x; CREATE TABLE acme_a (a)"

    class Indexing(NotesProjection):  # an index on another's table changes that table
        name, tables = "acme.indexing", ("acme_i",)
        schema = "CREATE TABLE acme_i (a); CREATE INDEX acme_on_titles ON titles (title)"

    class Tracking(NotesProjection):  # it moved a tracked position
        name, tables = "acme.tracking2", ("acme_t",)
        schema = "CREATE TABLE acme_t (a); INSERT INTO tracking VALUES ('title', 99)"

    class Pragmatic(NotesProjection):  # a pragma changes the views file for every projection
        name, tables = "acme.pragmatic", ("acme_p",)
        schema = "PRAGMA journal_mode=DELETE; CREATE TABLE acme_p (a)"

    class Squatting(NotesProjection):  # on a fresh views file it made 'titles' its way
        name, tables = "acme.squatting", ("acme_s",)
        schema = "CREATE TABLE IF NOT EXISTS titles (foo); CREATE TABLE acme_s (a)"

    class Triggering(NotesProjection):  # a trigger on its own table that empties another's
        name, tables = "acme.triggering", ("acme_g",)
        schema = ("CREATE TABLE acme_g (a); CREATE TRIGGER acme_g_t AFTER INSERT ON acme_g "
                  "BEGIN DELETE FROM titles; END")

    for bad, says in ((Dropping, "changes table 'titles', which is not its own"),
                      (Attaching, "attaches or detaches a database"),
                      (Indexing, "changes table 'titles', which is not its own"),
                      (Tracking, "changes table 'tracking', which is not its own"),
                      (Pragmatic, "sets a pragma"),
                      (Squatting, "creates 'titles', which tables does not declare"),
                      (Triggering, "changes table 'titles', which is not its own")):
        with pytest.raises(terret.errors.ConfigurationError, match=says):
            terret.register_projection(bad)
    assert not (tmp_path / "attached.db").exists()

    class Rich(NotesProjection):  # what a schema may do with its own tables
        name, tables = "acme.rich", ("acme_rich", "acme_rich_log")
        schema = ("CREATE TABLE IF NOT EXISTS acme_rich (id INTEGER PRIMARY KEY AUTOINCREMENT, "
                  "note TEXT); CREATE TABLE IF NOT EXISTS acme_rich_log (k PRIMARY KEY, n) "
                  "WITHOUT ROWID; CREATE INDEX IF NOT EXISTS acme_rich_i ON acme_rich (note); "
                  "CREATE TRIGGER IF NOT EXISTS acme_rich_t AFTER INSERT ON acme_rich BEGIN "
                  "INSERT OR REPLACE INTO acme_rich_log VALUES (NEW.id, NEW.note); END; "
                  "CREATE VIEW IF NOT EXISTS acme_rich_v AS SELECT * FROM titles; "
                  "CREATE TEMP TABLE IF NOT EXISTS acme_tmp (a); INSERT INTO acme_tmp VALUES (1)")

    terret.register_projection(Rich)
    terret.projections.unregister_projection("acme.rich")
    for bad, says in ((Versioned, "version is a whole number from 1, not '2'"),
                      (Unversioned, "version is a whole number from 1, not 0"),
                      (Unschemed, "'acme.unschemed': its schema does not run: "),
                      (Committing, "'acme.committing': its schema does not run: "),
                      (Reopening, "'acme.reopening': its schema does not run: it ends"),
                      (Sneaky, "its schema creates 'titles2', which tables does not declare")):
        with pytest.raises(terret.errors.ConfigurationError, match=says):
            terret.register_projection(bad)
    for bad, says in ((Unnamed, "has no name"), (NeedsArgs, "no arguments"),
                      (Sessions, "built-in"), (object, "Projection subclass"),
                      (Titles, "claims table 'titles', which is projection 'title'"),
                      (Bookkeeping, "which is the view store's own"),
                      (Untabled, "tuple of table names")):
        with pytest.raises(terret.errors.ConfigurationError, match=says):
            terret.register_projection(bad)  # type: ignore[arg-type]

    class Copy(NotesProjection):  # another projection's tables
        name = "acme.copy"

    terret.register_projection(NotesProjection)
    try:
        with pytest.raises(terret.errors.ConfigurationError, match="'acme.notes'"):
            terret.register_projection(Copy)
        terret.register_projection(NotesProjection)  # the same class again: fine
    finally:
        terret.projections.unregister_projection("acme.notes")
    with pytest.raises(terret.errors.ConfigurationError, match="claims table"):
        ProjectionRunner(MemoryStore(), ViewStore(":memory:"), [NotesProjection(), Copy()])


RELOADABLE = '''
import terret
from terret.projections import Projection


@terret.register_projection
class Reloadable(Projection):
    name = "acme.reloadable"
    handles = frozenset({"session/titled"})
    tables = ("acme_reloadable",)
    schema = "CREATE TABLE IF NOT EXISTS acme_reloadable (session TEXT)"

    def process(self, db, event):
        db.execute("INSERT INTO acme_reloadable VALUES (?)", (event.stream,))
'''


def test_a_module_registering_a_projection_can_be_reloaded(tmp_path, monkeypatch) -> None:
    """docs/projections.md: a reloaded module's class replaces the one registered (a dev
    server's or a notebook's reload raised "name 'acme.reloadable' is taken by" itself)."""
    import importlib
    import sys

    from terret.projections.registry import registered_projections

    (tmp_path / "acme_reloadable.py").write_text(RELOADABLE)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("acme_reloadable")
    try:
        first = module.Reloadable
        reloaded = importlib.reload(module).Reloadable
        assert reloaded is not first
        (ours,) = [p for p in registered_projections() if p.name == "acme.reloadable"]
        assert type(ours) is reloaded
    finally:
        terret.projections.unregister_projection("acme.reloadable")
        sys.modules.pop("acme_reloadable", None)


def test_another_class_of_a_registered_name_is_refused_even_from_the_same_module() -> None:
    """Only a reload replaces a registration: a class of the same name made in a function
    (here, this test's) is another projection, refused as before."""

    def make() -> type[Projection]:
        class Reloadable(Projection):
            name = "acme.reloadable2"
            handles = frozenset({"session/titled"})
            tables = ("acme_reloadable2",)
            schema = "CREATE TABLE IF NOT EXISTS acme_reloadable2 (session TEXT)"

            def process(self, db: Any, event: Any) -> None:
                pass

        return Reloadable

    first = make()
    terret.register_projection(first)
    try:
        with pytest.raises(terret.errors.ConfigurationError, match="is taken by"):
            terret.register_projection(make())
    finally:
        terret.projections.unregister_projection("acme.reloadable2")


def test_a_payload_made_without_validation_is_refused_before_anything_is_written(
        opened_store: Any, writer: Writer, note_type: type[terret.EventPayload]) -> None:
    """``model_construct`` skips pydantic's checks: a field not holding its type was written
    (pydantic only warned) and the record never read back — every reader halted on it."""
    store = opened_store.store
    sid = writer.start()
    stream = session_stream(sid)
    before = store.stream_version(stream)
    with pytest.raises(terret.errors.InvalidPayload, match="does not hold its type") as err:
        _append(store, sid, note_type.model_construct(text=123, tags=[]))
    assert (err.value.field, err.value.wire_name) == ("text", WIRE)
    with pytest.raises(terret.errors.InvalidPayload) as err:
        _append(store, sid, note_type.model_construct(text="fine", tags="not a list"))
    assert err.value.field == "tags"
    assert store.stream_version(stream) == before
    _append(store, sid, note_type.model_construct(text="constructed, but right", tags=["a"]))
    assert [r.wire_name for r in store.read_stream(stream)][-1] == WIRE
