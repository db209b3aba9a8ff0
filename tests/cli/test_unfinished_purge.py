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


def _purge_cut_short(target: Target, sid: UUID) -> None:
    """What a purge killed after its first write leaves: the record, and the whole log."""
    record = encode(SessionPurged(session_id=str(sid), by=Actor(actor="operator", id="ops"),
                                  reason="erasure request"))
    target.store().append(RETENTION_STREAM, [record], StreamState.ANY)


def test_a_purge_cut_short_is_said_by_every_reader_and_doctor_and_finished_by_running_it_again(
        target: Target) -> None:
    sid = target.finished()
    assert target.run("sessions", "close", str(sid)).returncode == 0
    _purge_cut_short(target, sid)

    for command in (("sessions", "show"), ("usage",), ("title",), ("policy", "show")):
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
    from terret.domain.errors import PurgeUnfinished

    runtime = Runtime(target.store(), resolver=StaticResolver())
    try:
        for read in (runtime.usage, runtime.title, runtime.upkeep_usage):
            with pytest.raises(PurgeUnfinished, match="runtime.purge"):
                read(sid)
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
