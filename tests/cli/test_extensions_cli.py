"""docs/extending.md: an extension event registers in a module every process reading the
events imports — the CLI too. ``--extensions`` / ``TERRET_EXTENSIONS`` make a command that
loads no app (``log``, ``events``, ``projections``) import it; without it the events are read
as opaque ones. The events are written by another process, on both stores."""

from __future__ import annotations

import json
import subprocess
import sys
from uuid import UUID

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
