"""A rolling deploy seen from the old release's CLI: release 2 of an extension moved its
projection's view up a version in the shared views file. The old release's `projections
status` says the view is another release's, its `verify` checks every other view and says which
one it did not, and its `doctor` checks the rest and names that view as the one thing to fix —
they refused everything with ViewsMismatch, Terret's own eight views included."""

from __future__ import annotations

import json

from tests.cli.conftest import Target

RELEASE = '''
from terret.projections import Projection, register_projection


@register_projection
class TicketsProjection(Projection):
    name = "acme.tickets"
    version = {version}
    handles = frozenset({{"turn/start"}})
    tables = ("acme_tickets",)
    schema = "CREATE TABLE IF NOT EXISTS acme_tickets (session TEXT, seq INTEGER)"

    def process(self, db, event):
        db.execute("INSERT INTO acme_tickets VALUES (?, ?)", (event.stream, event.seq))
'''

MOVED = "another release's: the views file holds version 2 of acme.tickets, this process has " \
        "version 1"


def test_the_old_release_checks_every_view_but_the_one_the_new_release_moved_up(
        target: Target) -> None:
    for release in (1, 2):
        (target.cwd / f"tickets_r{release}.py").write_text(RELEASE.format(version=release))
    target.new_session()
    old, new = ("--extensions", "tickets_r1"), ("--extensions", "tickets_r2")
    assert target.run(*old, "projections", "status").returncode == 0
    assert target.run(*new, "projections", "status").returncode == 0  # moved up to version 2

    status = target.run(*old, "--json", "projections", "status")
    assert status.returncode == 0, status.stderr
    rows = {row["name"]: row for row in json.loads(status.stdout)}
    assert rows["acme.tickets"]["other_version"] == 2
    assert all(row["other_version"] is None for name, row in rows.items()
               if name != "acme.tickets")
    assert MOVED in target.run(*old, "projections", "status").stdout

    verify = target.run(*old, "--json", "projections", "verify")
    assert verify.returncode == 0, verify.stderr
    report = json.loads(verify.stdout)
    assert "acme.tickets" not in report and len(report) == 8 and not any(report.values())
    assert f"acme.tickets: not verified — {MOVED}" in verify.stderr
    one = target.run(*old, "projections", "verify", "acme.tickets")
    assert one.returncode == 1 and "ViewsMismatch" in one.stderr  # asked by name: refused

    doctor = target.run(*old, "--json", "doctor")
    assert doctor.returncode == 1, doctor.stdout
    found = json.loads(doctor.stdout)
    (problem,) = found["problems"]
    assert problem.startswith(f"projection acme.tickets: {MOVED}"), problem
    assert "every projection of this release's versions equals a rebuild from the log" \
        in found["checks"]

    again = target.run(*new, "--json", "doctor")  # the new release: all of it checked, ok
    assert again.returncode == 0, again.stdout
    assert "every projection equals a rebuild from the log" in json.loads(again.stdout)["checks"]


HALTING = RELEASE.replace(
    "    def process(self, db, event):\n",
    "    def process(self, db, event):\n"
    "        if {version} == 2:\n"
    "            raise ValueError('release 2 cannot read this one')\n")


def test_the_old_release_cannot_skip_an_event_of_the_new_releases_view(target: Target) -> None:
    """Release 2's view halted; the old release's `projections skip` of it was accepted
    (exit 0, "skipped"): it cleared the halt and recorded a skip in a view it neither
    maintains nor checks, replayed nothing into it, and so passed the event over for good.
    Refused now, as its rebuild and verify are, with the views unchanged; release 2 skips it."""
    for release in (1, 2):
        (target.cwd / f"tickets_r{release}.py").write_text(HALTING.format(version=release))
    old, new = ("--extensions", "tickets_r1"), ("--extensions", "tickets_r2")
    assert target.run(*new, "projections", "status").returncode == 0  # version 2, empty
    target.finished()
    assert target.run(*new, "sessions", "list").returncode == 0  # catches up: it halts
    halted = target.run(*new, "--json", "projections", "status")
    (row,) = [r for r in json.loads(halted.stdout) if r["name"] == "acme.tickets"]
    assert row["halted"] is not None, row

    refused = target.run(*old, "projections", "skip", "acme.tickets")
    assert refused.returncode == 1 and "ViewsMismatch" in refused.stderr, refused.stderr
    assert "holds version 2 of it, this process has version 1" in refused.stderr
    after = target.run(*new, "--json", "projections", "status")
    (row_after,) = [r for r in json.loads(after.stdout) if r["name"] == "acme.tickets"]
    assert row_after["halted"] == row["halted"]  # still halted, nothing skipped

    skipped = target.run(*new, "--json", "projections", "skip", "acme.tickets")
    assert '"skipped"' in skipped.stdout, (skipped.stdout, skipped.stderr)
