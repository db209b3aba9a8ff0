"""Forward compatibility through the CLI (issue 11): Terret events of a newer schema version than
this release knows, with fields it has never seen, appended straight to the store. The
projections catch up without halting, `terret log` shows them as unknown to this version with
their data, `projections verify` and `doctor` are clean, and commands keep working on the
session. On SQLite and the EventStoreDB emulator."""

from __future__ import annotations

import json
from typing import Any
from uuid import uuid4

from terret.domain.catalogue import catalogue
from terret.domain.store import NewRecord, session_stream
from tests.cli.conftest import Target

NEWER: list[tuple[str, dict[str, Any]]] = [
    ("tool/result", {"call_id": "c7", "name": "deploy", "content": "ok", "mime": "text/plain"}),
    ("session/titled", {"title": "Newer", "by": {"actor": "agent"}, "source": "model"}),
    ("step/end", {"turn": 1, "step": 2, "usage": {"prompt_tokens": 9, "completion_tokens": 9},
                  "latency_ms": 3}),
]


def version_of(wire_name: str) -> int:
    cls = catalogue.payload_class(wire_name)
    assert cls is not None
    return cls.version


def test_newer_versions_are_shown_and_halt_nothing(target: Target) -> None:
    sid = target.finished()
    stream = session_stream(sid)
    store = target.store()
    first = store.stream_version(stream) + 1
    records = []
    for wire, data in NEWER:
        meta = json.dumps({"schema_version": version_of(wire) + 1}).encode()
        records.append(NewRecord(uuid4(), wire, json.dumps(data).encode(), meta))
    store.append(stream, records, store.stream_version(stream))

    target.json("sessions", "list")  # catches the views up (status only reports)
    status = target.json("projections", "status")
    assert all(p["halted"] is None and p["lag"] == 0 for p in status), status

    text = target.invoke("log", str(sid), "--from", str(first))
    assert text.exit_code == 0, text.stderr
    lines = text.stdout.splitlines()
    assert len(lines) == len(NEWER)
    for line, (wire, data) in zip(lines, NEWER, strict=True):
        assert wire in line and "(unknown to this version)" in line, line
        assert next(iter(data)) in line  # the data is shown
    jsonl = target.invoke("--json", "log", str(sid), "--from", str(first))
    rows = [json.loads(line) for line in jsonl.stdout.splitlines()]
    assert [(r["type"], r["data"]) for r in rows] == NEWER
    assert [r["version"] for r in rows] == [version_of(w) + 1 for w, _ in NEWER]

    verify = target.invoke("--json", "projections", "verify")
    assert verify.exit_code == 0, verify.stdout + verify.stderr
    assert not any(json.loads(verify.stdout).values())
    doctor = target.invoke("--json", "doctor")
    assert doctor.exit_code == 0, doctor.stdout + doctor.stderr
    assert json.loads(doctor.stdout)["ok"] is True

    # What the views say is what this release knows: the older title, the known usage.
    assert target.json("title", str(sid))["title"] == "Release checkout v2"
    show = target.json("sessions", "show", str(sid))
    assert show["usage"]["prompt_tokens"] == 300 and show["status"] == "idle"
    # And the session takes commands.
    assert target.invoke("title", str(sid), "After the newer events").exit_code == 0
    assert target.invoke("inject", str(sid), "still here").exit_code == 0
    assert target.json("title", str(sid))["title"] == "After the newer events"


def test_the_session_index_counts_every_event_of_the_log(target: Target) -> None:
    """`sessions list`/`show`'s event count is the log's length, events this release cannot
    read included: newer versions of its own events and wire names it has never heard of."""
    sid = target.finished()
    stream = session_stream(sid)
    store = target.store()
    records = [NewRecord(uuid4(), "acme/never-heard-of", b'{"x": 1}', b"{}")]
    for wire, data in NEWER:  # last: a newer version of a known event ends the log
        meta = json.dumps({"schema_version": version_of(wire) + 1}).encode()
        records.append(NewRecord(uuid4(), wire, json.dumps(data).encode(), meta))
    store.append(stream, records, store.stream_version(stream))

    logged = target.invoke("--json", "log", str(sid)).stdout.splitlines()
    listed = {s["id"]: s for s in target.json("sessions", "list")}
    assert listed[str(sid)]["events"] == len(logged)
    assert target.json("sessions", "show", str(sid))["events"] == len(logged)
