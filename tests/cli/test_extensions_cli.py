"""docs/extending.md: an extension event registers in a module every process reading the
events imports — the CLI too. ``--extensions`` / ``TERRET_EXTENSIONS`` make a command that
loads no app (``log``, ``events``, ``projections``) import it; without it the events are read
as opaque ones. The events are written by another process, on both stores."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from uuid import UUID

import pytest

from tests.cli.conftest import Target, one_line_error, subprocess_env

MODULE = '''
from pydantic import Field
import terret


@terret.event_type
class BookmarkSaved(terret.EventPayload):
    wire_name = "acme.bookmark/saved"
    version = 1
    commutative = True
    url: str = Field(pattern=r"^https?://")
'''

WRITER = '''
import sys
from uuid import UUID
from terret import open_store
from terret.domain import encode, session_stream
from acme_bookmarks import BookmarkSaved

store = open_store(sys.argv[1])
stream = session_stream(UUID(sys.argv[2]))
head = store.stream_version(stream)
store.append(stream, [encode(BookmarkSaved(url="https://example.org/paper.pdf"))], head)
'''


def _bookmarked(target: Target) -> UUID:
    (target.cwd / "acme_bookmarks.py").write_text(MODULE)
    (target.cwd / "write_bookmark.py").write_text(WRITER)
    sid = target.new_session()
    done = subprocess.run([sys.executable, "write_bookmark.py", target.uri, str(sid)],
                          cwd=target.cwd, env=subprocess_env(), capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return sid


def test_log_events_and_projections_read_extension_events_they_are_told_to_import(
        target: Target) -> None:
    sid = _bookmarked(target)
    plain = target.run("log", str(sid))
    assert plain.returncode == 0, plain.stderr
    assert "(unknown to this version)" in plain.stdout

    told = target.run("--extensions", "acme_bookmarks", "log", str(sid), "--type",
                      "acme.bookmark/saved")
    assert told.returncode == 0, told.stderr
    assert "acme.bookmark/saved" in told.stdout and "unknown" not in told.stdout
    assert "https://example.org/paper.pdf" in told.stdout

    env = {**subprocess_env(), "TERRET_EXTENSIONS": "acme_bookmarks"}
    listed = subprocess.run([sys.executable, "-m", "terret", "--json", "events"],
                            cwd=target.cwd, env=env, capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    (ours,) = [e for e in json.loads(listed.stdout) if e["wire_name"] == "acme.bookmark/saved"]
    assert ours["builtin"] is False and ours["fields"] == ["url"]

    for command in (["projections", "rebuild"], ["projections", "verify"]):
        done = target.run("--extensions", "acme_bookmarks", *command)
        assert done.returncode == 0, (command, done.stderr)


def test_an_extension_module_that_cannot_be_imported_is_a_usage_error(target: Target) -> None:
    before = target.snapshot()
    done = target.run("--extensions", "acme_bookmarks_missing", "sessions", "list")
    assert done.returncode == 2, done.stderr
    line = one_line_error(done.stderr)
    assert line.startswith("Error: BadParameter: Invalid value for '--extensions': cannot "
                           "import 'acme_bookmarks_missing': ModuleNotFoundError"), line
    assert target.snapshot() == before


def test_a_module_that_exits_while_imported_is_a_usage_error_not_an_empty_success(
        target: Target) -> None:
    """``sys.exit(0)`` in an extension module (or an app's module, or its factory) is a module
    that cannot be loaded: before, the command printed nothing and exited 0 as if it had run."""
    (target.cwd / "acme_exits.py").write_text("import sys\nsys.exit(0)\n")
    (target.cwd / "exiting_app.py").write_text("def app():\n    raise SystemExit('bye')\n")
    sid = str(target.finished())
    before = target.snapshot()
    done = target.run("--extensions", "acme_exits", "sessions", "list")
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert one_line_error(done.stderr) == (
        "Error: BadParameter: Invalid value for '--extensions': cannot import 'acme_exits': "
        "ModuleExited: it called sys.exit(0)")
    for spec, said in (("acme_exits:app", "it called sys.exit(0)"),
                       ("exiting_app:app", "it called sys.exit('bye')")):
        done = target.run("compact", sid, "--app", spec)
        assert done.returncode == 2, done.stderr
        line = one_line_error(done.stderr)
        assert line.startswith("Error: BadParameter: Invalid value for '--app': cannot load "
                               f"app '{spec}': "), line
        assert line.endswith(said), line
    assert target.snapshot() == before


UPCASTING = '''
import terret


@terret.event_type
class NoteAdded(terret.EventPayload):
    wire_name = "acme.note/added"
    version = 2
    commutative = True
    text: str
    body: str


@terret.upcaster("acme.note/added", 1)
def _v1(data):
    data["body"] = data.pop("body_v1")  # a KeyError on a v1 record written without it
    return data
'''

EXITING = UPCASTING.replace(
    'data["body"] = data.pop("body_v1")',
    'if "body_v1" not in data:\n        raise SystemExit(3)  # its author\'s "cannot happen"\n'
    '    data["body"] = data.pop("body_v1")')

OLD_WRITER = '''
import sys
from uuid import UUID, uuid4
from terret import open_store
from terret.domain import NewRecord, session_stream

store = open_store(sys.argv[1])
stream = session_stream(UUID(sys.argv[2]))
head = store.stream_version(stream)
record = NewRecord(uuid4(), "acme.note/added", b'{"text": "hi"}', b'{"schema_version": 1}')
print(store.append(stream, [record], head).position)
store.close()
'''


@pytest.mark.parametrize(("module", "failure"), [(UPCASTING, "KeyError"),
                                                  (EXITING, "SystemExit")])
def test_an_upcaster_that_raises_makes_that_record_unreadable_but_halts_no_count(
        target: Target, module: str, failure: str) -> None:
    """An upcaster is application code run on whatever the log holds. One that raises on an
    old record makes that record unreadable (a CorruptRecord naming its position, for whoever
    reads its fields: ``log``, a projection of it, which halts there). It used to be an unnamed
    KeyError from every command; then it halted the session index, which reads no field of it,
    so that ``sessions list`` stopped at that record for every session after it. One that
    calls ``sys.exit`` stopped every reader of the log — serve, rebuild, sessions list — with
    no word said."""
    (target.cwd / "acme_notes.py").write_text(module)
    (target.cwd / "write_old_note.py").write_text(OLD_WRITER)
    sid = target.new_session()
    done = subprocess.run([sys.executable, "write_old_note.py", target.uri, str(sid)],
                          cwd=target.cwd, env=subprocess_env(), capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    position = int(done.stdout)
    other = target.finished()

    for rebuilt in (False, True):  # caught up, then rebuilt from scratch: the same
        listed = target.run("--extensions", "acme_notes", "--json", "sessions", "list")
        assert listed.returncode == 0 and listed.stderr == "", listed.stderr
        rows = {row["id"]: row for row in json.loads(listed.stdout)}
        assert set(rows) == {str(sid), str(other)}
        assert rows[str(sid)]["events"] == len(target.events(sid)) == 2  # the unreadable too
        status = json.loads(target.run("--extensions", "acme_notes", "--json", "projections",
                                       "status").stdout)
        assert [p for p in status if p["halted"]] == [], status
        doctor = target.run("--extensions", "acme_notes", "doctor")
        assert doctor.returncode == 0, doctor.stdout + doctor.stderr
        if not rebuilt:
            again = target.run("--extensions", "acme_notes", "projections", "rebuild")
            assert again.returncode == 0, again.stdout + again.stderr

    shown = target.run("--extensions", "acme_notes", "log", str(sid))
    assert shown.returncode == 1
    assert one_line_error(shown.stderr).startswith(
        f"Error: CorruptRecord: record at position {position} cannot be decoded"), shown.stderr
    assert f"the upcaster from version 1 failed: {failure}" in shown.stderr


MARKS = '''
import terret
from terret.projections import Projection


@terret.event_type
class Marked(terret.EventPayload):
    wire_name = "acme.mark/added"
    commutative = True
    url: str


@terret.register_projection
class MarksProjection(Projection):
    name = "acme.marks"
    handles = frozenset({"acme.mark/added"})
    tables = ("acme_marks",)
    schema = "CREATE TABLE IF NOT EXISTS acme_marks (session TEXT, seq INTEGER, url TEXT)"

    def process(self, db, event):
        if "bad" in event.payload.url:
            raise ValueError("a bad mark")
        db.execute("INSERT INTO acme_marks VALUES (?, ?, ?)",
                   (event.stream, event.seq, event.payload.url))
'''

MARK_WRITER = '''
import sys
from uuid import UUID
from terret import open_store
from terret.domain import encode, session_stream
from acme_marks import Marked

store = open_store(sys.argv[1])
stream = session_stream(UUID(sys.argv[2]))
written = store.append(stream, [encode(Marked(url=u)) for u in sys.argv[3:]],
                       store.stream_version(stream))
print(written.position)
store.close()
'''


def _marked(target: Target, sid: UUID, *urls: str) -> int:
    done = subprocess.run([sys.executable, "write_mark.py", target.uri, str(sid), *urls],
                          cwd=target.cwd, env=subprocess_env(), capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return int(done.stdout)


def test_a_registered_projection_is_maintained_checked_and_skipped_by_the_cli(
        target: Target) -> None:
    """A custom projection registered by its module (``@terret.register_projection``) is one
    of the CLI's once ``--extensions`` imports it: status, rebuild, verify, skip and doctor
    include it. A process that does not load it still reports it when the views file tracks
    it, and a halted one is a problem for doctor there too."""
    (target.cwd / "acme_marks.py").write_text(MARKS)
    (target.cwd / "write_mark.py").write_text(MARK_WRITER)
    sid = target.new_session()
    _marked(target, sid, "https://example.org/a")
    ext = ("--extensions", "acme_marks")

    assert target.run(*ext, "sessions", "list").returncode == 0  # catches the views up
    status = json.loads(target.run(*ext, "--json", "projections", "status").stdout)
    (marks,) = [p for p in status if p["name"] == "acme.marks"]
    assert marks["loaded"] is True and marks["lag"] == 0 and marks["halted"] is None
    assert target.run(*ext, "projections", "rebuild", "acme.marks").returncode == 0
    assert target.run(*ext, "projections", "verify", "acme.marks").returncode == 0

    bad = _marked(target, sid, "https://example.org/bad")
    _marked(target, sid, "https://example.org/c")
    doctor = target.run(*ext, "--json", "doctor")
    assert doctor.returncode == 1, doctor.stdout
    (problem,) = json.loads(doctor.stdout)["problems"]
    assert problem.startswith(f"projection acme.marks halted at {bad}: ValueError: a bad mark")

    # A process that does not import the module: the halt is still a problem, named.
    plain = target.run("--json", "doctor")
    assert plain.returncode == 1, plain.stdout
    (problem,) = json.loads(plain.stdout)["problems"]
    assert problem.startswith(f"projection acme.marks halted at {bad}") and \
        "not loaded in this process" in problem and "--extensions" in problem
    listed = json.loads(target.run("--json", "projections", "status").stdout)
    (marks,) = [p for p in listed if p["name"] == "acme.marks"]
    assert marks["loaded"] is False and marks["halted"]["position"] == bad
    refused = target.run("projections", "skip", "acme.marks")
    assert refused.returncode == 1 and "--extensions" in refused.stderr, refused.stderr

    skipped = target.run(*ext, "projections", "skip", "acme.marks")
    assert skipped.returncode == 0, skipped.stderr
    assert target.run(*ext, "doctor").returncode == 0
    quiet = target.run("--json", "doctor")
    assert quiet.returncode == 0, quiet.stdout
    assert any("acme.marks" in c and "not checked" in c
               for c in json.loads(quiet.stdout)["checks"])
    with sqlite3.connect(target.views) as db:
        rows = db.execute("SELECT url FROM acme_marks ORDER BY seq").fetchall()
    assert rows == [("https://example.org/a",), ("https://example.org/c",)]


def test_a_skip_whose_replay_halts_again_says_so_and_exits_1(target: Target) -> None:
    """Two events in a row the projection cannot process: the first skip's replay halts at
    the second — it exits 1 and names the new halt (text and ``--json``), as ``rebuild`` does;
    it used to exit 0 with ``{"projection", "skipped"}`` only. A second skip, from another
    process, lets it follow the log."""
    (target.cwd / "acme_marks.py").write_text(MARKS)
    (target.cwd / "write_mark.py").write_text(MARK_WRITER)
    sid = target.new_session()
    ext = ("--extensions", "acme_marks")
    first = _marked(target, sid, "https://example.org/bad")
    second = _marked(target, sid, "https://example.org/bad")
    _marked(target, sid, "https://example.org/c")
    assert target.run(*ext, "sessions", "list").returncode == 0  # halts at the first

    again = target.run(*ext, "--json", "projections", "skip", "acme.marks")
    assert again.returncode == 1, again.stderr
    shown = json.loads(again.stdout)
    assert shown["projection"] == "acme.marks" and shown["skipped"] == first, shown
    assert shown["halted"]["position"] == second, shown
    assert shown["halted"]["error"].startswith("ValueError: a bad mark"), shown
    text = target.run(*ext, "projections", "status")
    assert f"HALTED at {second}: ValueError: a bad mark" in text.stdout, text.stdout

    done = target.run(*ext, "projections", "skip", "acme.marks")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"acme.marks: skipped position {second}", done.stdout
    assert target.run(*ext, "doctor").returncode == 0
    with sqlite3.connect(target.views) as db:
        rows = db.execute("SELECT url FROM acme_marks ORDER BY seq").fetchall()
    assert rows == [("https://example.org/c",)]


def test_log_quotes_a_wire_name_no_class_could_have(target: Target) -> None:
    """Any client may append a record; a wire name holding a newline printed a forged line
    (`99  turn/end  turn 1 completed`) in `terret log`. Classes may not take such names."""
    from uuid import uuid4

    from terret.domain.store import NewRecord, session_stream

    sid = target.new_session()
    stream = session_stream(sid)
    forged = "acme.nl/ev\n    99  turn/end               turn 1 completed"
    target.store().append(stream, [NewRecord(uuid4(), forged, b'{"x": 1}',
                                             b'{"schema_version": 1}')],
                          target.store().stream_version(stream))
    result = target.invoke("log", str(sid))
    assert result.exit_code == 0, result.stderr
    assert not any(line.lstrip().startswith("99") for line in result.stdout.splitlines())
    assert json.dumps(forged) in result.stdout


def test_skip_catches_the_views_up_to_find_the_halt(target: Target) -> None:
    """A bad event written while no process followed the log: `projections skip` said
    `ProjectionNotHalted` ("nothing to skip") until some other command caught the views up."""
    (target.cwd / "acme_marks.py").write_text(MARKS)
    (target.cwd / "write_mark.py").write_text(MARK_WRITER)
    sid = target.new_session()
    ext = ("--extensions", "acme_marks")
    assert target.run(*ext, "sessions", "list").returncode == 0
    bad = _marked(target, sid, "https://example.org/bad")  # nobody catches up after it

    skipped = target.run(*ext, "--json", "projections", "skip", "acme.marks")
    assert skipped.returncode == 0, skipped.stderr
    assert json.loads(skipped.stdout)["skipped"] == bad


def test_verify_says_its_replay_halts_where_the_live_view_went_on(target: Target) -> None:
    """The live view was built by a release that reads an event this one cannot: `verify`
    listed the rows after it as differences without saying its own replay halted there, and
    doctor advised a rebuild — which halts the live view too."""
    lenient = MARKS.replace('if "bad" in event.payload.url:',
                            'if "bad" in event.payload.url and __import__("os").environ.get('
                            '"ACME_STRICT"):')
    (target.cwd / "acme_marks.py").write_text(lenient)
    (target.cwd / "write_mark.py").write_text(MARK_WRITER)
    sid = target.new_session()
    bad = _marked(target, sid, "https://example.org/bad")
    _marked(target, sid, "https://example.org/c")
    ext = ("--extensions", "acme_marks")
    assert target.run(*ext, "sessions", "list").returncode == 0  # built past it

    strict = {**subprocess_env(), "ACME_STRICT": "1"}
    verify = subprocess.run([sys.executable, "-m", "terret", *target.args(
        *ext, "--json", "projections", "verify", "acme.marks")], capture_output=True,
        text=True, timeout=60, cwd=target.cwd, env=strict)
    assert verify.returncode == 1, verify.stderr
    diffs = json.loads(verify.stdout)["acme.marks"]
    assert diffs[0].startswith(f"the replay halts at {bad}: ValueError: a bad mark"), diffs
    doctor = subprocess.run([sys.executable, "-m", "terret", *target.args(
        *ext, "--json", "doctor")], capture_output=True, text=True, timeout=60,
        cwd=target.cwd, env=strict)
    assert doctor.returncode == 1
    (problem,) = [p for p in json.loads(doctor.stdout)["problems"] if "acme.marks" in p]
    assert f"replay halts at {bad}" in problem and "fix the event's reader" in problem
