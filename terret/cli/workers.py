"""``terret workers``: the workers serving the store's sessions, from its worker registry."""

from __future__ import annotations

import time

import click

from terret.cli._context import CliContext
from terret.cli._format import ago, table


@click.command("workers")
@click.option("--all", "show_all", is_flag=True,
              help="Also list workers whose lease expired (killed, frozen or cut off) and are "
                   "still in the registry.")
@click.pass_obj
def workers(obj: CliContext, show_all: bool) -> None:
    """The live workers (`terret serve` processes, runtimes) and the sessions each one serves."""
    from terret.cli._owners import Liveness

    live = Liveness(obj.store())
    found = sorted((live.beat(b) for b in live.beats.values()),
                   key=lambda w: (not w["live"], w["host"], w["pid"], w["worker"]))
    if not show_all:
        found = [w for w in found if w["live"]]
    if obj.json_output:
        obj.emit(found)
        return
    now = time.time()
    rows = [[w["worker"], w["host"], str(w["pid"]),
             "live" if w["live"] else ("gone" if w["process"] == "gone" else "expired"),
             ago(w["started"], now), ago(w["last_beat"], now), str(len(w["sessions"])),
             " ".join(w["sessions"][:3]) + (" …" if len(w["sessions"]) > 3 else "")]
            for w in found]
    obj.emit(None, table(rows, ["WORKER", "HOST", "PID", "LEASE", "STARTED", "LAST BEAT",
                                "SESSIONS", "SERVING"])
             if rows else ("no live workers" if not show_all else "no workers"))


def register(cli: click.Group) -> None:
    cli.add_command(workers)
