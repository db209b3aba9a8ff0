"""A purge whose process stopped between its two writes — ``session/purged`` recorded in the
retention stream, the session's log not yet deleted (a kill, an outage). The views forgot the
session, so every reader showed it empty (`usage` $0, `title` "(untitled)"), `sessions show`
said ViewsBehind and `doctor` said all was well, with every event still in the store. Now the
readers say ``PurgeUnfinished`` and how to finish it, doctor names it, running the purge again
finishes it without recording it twice, and a serving process finishes one it hears of — on
SQLite and the EventStoreDB emulator, each step a process of its own."""

from __future__ import annotations

import json
from uuid import UUID

import pytest

from terret.domain.codec import encode
from terret.domain.events import Actor, SessionPurged
from terret.domain.store import RETENTION_STREAM, StreamState, session_stream
from tests.cli.conftest import DEMO_APP, Target
from tests.cli.docs_app import serving, wait


def _purge_cut_short(target: Target, sid: UUID, max_age: int | None = None) -> None:
    """What a purge killed after its first write leaves: the record, and the whole log (with
    ``max_age``: the log without its expiry)."""
    record = encode(SessionPurged(session_id=str(sid), by=Actor(actor="operator", id="ops"),
                                  reason="erasure request", max_age_seconds=max_age))
    target.store().append(RETENTION_STREAM, [record], StreamState.ANY)


def test_a_purge_cut_short_is_said_by_every_reader_and_doctor_and_finished_by_running_it_again(
        target: Target) -> None:
    sid = target.finished()
    assert target.run("sessions", "close", str(sid)).returncode == 0
    _purge_cut_short(target, sid)

    for command in (("sessions", "show"), ("usage",), ("title",), ("policy", "show"),
                    ("log",), ("budget", "show"), ("approvals", "list")):
        done = target.run(*command, str(sid))
        assert done.returncode == 1, (command, done.stdout)
        (line,) = done.stderr.strip().splitlines()
        assert line.startswith("Error: PurgeUnfinished: ") and "operator (ops)" in line, line
        assert f"terret sessions purge {sid} --yes" in line
    doctor = target.run("--json", "doctor")
    assert doctor.returncode == 1
    (problem,) = json.loads(doctor.stdout)["problems"]
    assert str(sid) in problem and "purge is recorded but its log is still" in problem

    # An embedding application's reads say so too (they showed zeros and no title).
    from terret import Runtime, StaticResolver
    from terret.domain.errors import InvalidPayload, PurgeUnfinished

    runtime = Runtime(target.store(), resolver=StaticResolver())
    try:
        for read in (runtime.usage, runtime.title, runtime.upkeep_usage):
            with pytest.raises(PurgeUnfinished, match="runtime.purge"):
                read(sid)
        # Its id is a purged session's: refused as one (it was WrongExpectedVersion, the
        # error a caller retries).
        with pytest.raises(InvalidPayload, match="was purged"):
            runtime.create_session(session_id=sid)
    finally:
        runtime.close()

    again = target.run("sessions", "purge", str(sid), "--yes")
    assert again.returncode == 0, again.stderr
    assert target.store().stream_version(session_stream(sid)) == 0
    purges = [r for r in target.store().read_stream(RETENTION_STREAM)
              if r.wire_name == SessionPurged.wire_name]
    assert len(purges) == 1  # not recorded twice
    shown = target.run("sessions", "show", str(sid))
    assert shown.returncode == 1 and "Error: SessionNotFound" in shown.stderr
    healthy = target.run("--json", "doctor")
    assert healthy.returncode == 0, healthy.stdout
    assert "every purge recorded is done" in json.loads(healthy.stdout)["checks"]


def test_a_serving_process_finishes_a_purge_it_hears_of(target: Target) -> None:
    sid = target.closed()
    with serving(target, app=DEMO_APP):
        _purge_cut_short(target, sid)
        wait("the purge finished by serve",
             lambda: target.store().stream_version(session_stream(sid)) == 0, 20)
    assert target.run("--json", "doctor").returncode == 0


def test_serve_started_after_a_purge_was_cut_short_finishes_it(target: Target) -> None:
    """The purge's record read before serve began — by a command on the shared views file —
    never reached its listener: a serve started after a kill left the purge unfinished for
    good. It looks for those at its start now."""
    sid = target.closed()
    _purge_cut_short(target, sid)
    assert target.run("sessions", "list").returncode == 0  # the views read the record
    with serving(target, app=DEMO_APP):
        wait("the purge finished by serve",
             lambda: target.store().stream_version(session_stream(sid)) == 0, 20)
    assert target.run("--json", "doctor").returncode == 0


def test_a_prefix_is_looked_up_among_the_sessions_a_purge_left_in_the_store_too(
        target: Target) -> None:
    """Running a purge cut short again by the prefix given the first time deleted another
    session that shared it: the view had forgotten the first one, so the prefix named the
    other alone. The prefix is ambiguous now, and one only the unfinished session has names
    it (PurgeUnfinished, not SessionNotFound)."""
    from terret import Actor, Runtime, StaticResolver

    runtime = Runtime(target.store(), resolver=StaticResolver())
    try:
        first = UUID("beef0000-0000-4000-8000-00000000000a")
        second = UUID("beef1111-0000-4000-8000-00000000000b")
        for sid in (first, second):
            runtime.create_session(session_id=sid)
        # Purges done under the same prefix, sorted ahead of the unfinished one: more than a
        # lookup lists (the unfinished one fell past them, and the prefix named `second`).
        for n in range(1, 8):
            done_sid = runtime.create_session(session_id=f"beef0000-0000-4000-8000-00000000000{n}")
            runtime.close_session(done_sid, by=Actor(actor="operator"))
            runtime.purge(done_sid, by=Actor(actor="operator"))
    finally:
        runtime.close()
    for sid in (first, second):
        assert target.run("sessions", "close", str(sid)).returncode == 0
    _purge_cut_short(target, first)
    again = target.run("sessions", "purge", "beef", "--yes")
    assert again.returncode == 2 and "ambiguous" in again.stderr, again.stderr
    assert target.store().stream_version(session_stream(second)) > 0  # not deleted
    shown = target.run("sessions", "show", "beef0")  # the unfinished one's alone
    assert shown.returncode == 1 and "Error: PurgeUnfinished: " in shown.stderr, shown.stderr
    done = target.run("sessions", "purge", str(first), "--yes")
    assert done.returncode == 0, done.stderr
    assert target.store().stream_version(session_stream(second)) > 0


def test_an_expiry_cut_short_is_unfinished_not_expiring(target: Target) -> None:
    """``--max-age`` killed between the record and the expiry: readers said ``SessionExpiring``
    (\"the views have forgotten it\") while nothing would ever expire the log. They say
    ``PurgeUnfinished`` and the command that finishes it."""
    if not target.store().native_expiry:
        pytest.skip("a store that cannot expire streams refuses --max-age before recording")
    sid = target.closed()
    _purge_cut_short(target, sid, max_age=3600)
    shown = target.run("sessions", "show", str(sid))
    assert shown.returncode == 1 and "Error: PurgeUnfinished: " in shown.stderr, shown.stderr
    assert f"terret sessions purge {sid} --max-age 3600 --yes" in shown.stderr
    again = target.run("sessions", "purge", str(sid), "--max-age", "3600", "--yes")
    assert again.returncode == 0, again.stderr
    expiring = target.run("sessions", "show", str(sid))
    assert "Error: SessionExpiring: " in expiring.stderr, expiring.stderr


def test_a_reason_the_purge_cannot_record_is_refused_before_the_question(
        target: Target) -> None:
    sid = target.closed()
    done = target.run("sessions", "purge", str(sid), "--reason", "x" * 2001)
    assert done.returncode == 2 and "at most 2000 characters" in done.stderr, done.stderr
    assert "Delete every event" not in done.stdout + done.stderr
    assert target.store().stream_version(session_stream(sid)) > 0


def test_a_purge_cut_short_long_ago_is_said_by_the_readers_of_the_log(target: Target) -> None:
    """``log`` and ``budget show`` read the log, not the views: they looked for the purge
    among the retention stream's latest records only, and a bulk retention run killed part
    way pushed it out of them — the whole log was shown while ``sessions show`` said
    ``PurgeUnfinished``. The views' record of it counts too."""
    from uuid import uuid4

    sid = target.closed()
    _purge_cut_short(target, sid)
    later = [encode(SessionPurged(session_id=str(uuid4()), by=Actor(actor="operator")))
             for _ in range(250)]  # the purges recorded since (sessions long gone)
    target.store().append(RETENTION_STREAM, later, StreamState.ANY)
    assert target.run("sessions", "list").returncode == 0  # the views read the records
    for command in (("log",), ("budget", "show"), ("sessions", "show")):
        done = target.run(*command, str(sid))
        assert done.returncode == 1 and "Error: PurgeUnfinished: " in done.stderr, (
            command, done.stdout, done.stderr)
