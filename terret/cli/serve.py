"""``terret serve``: run agents for the store's sessions until SIGTERM."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from typing import TYPE_CHECKING

import click

from terret.cli._context import CliContext, note
from terret.cli._format import PrintableFormatter
from terret.cli._params import FloatRange
from terret.cli.admin import APP_OPTION, app_for, runtime_for
from terret.domain.errors import RuntimeFault, TerretError
from terret.runtime.stops import MOST_GRACE

if TYPE_CHECKING:
    from terret.runtime.runtime import Runtime

log = logging.getLogger("terret.serve")

DEFAULT_GROUP = "terret-serve"


@click.command("serve")
@APP_OPTION
@click.option("--grace", type=FloatRange(min=0, max=MOST_GRACE), default=10.0, show_default=True,
              help="Seconds running turns get to reach a step boundary on SIGTERM.")
@click.option("--group", default=DEFAULT_GROUP, show_default=True, metavar="NAME",
              help="On EventStoreDB, the pool this worker joins (a persistent subscription "
                   "group): its members share the sessions, and each reads only its own. "
                   "Workers of different apps use different groups. Ignored on SQLite.")
@click.option("--no-group", is_flag=True,
              help="Join no pool: this worker reads every session's events (on EventStoreDB "
                   "too) and finds its work in its views.")
@click.pass_obj
def serve(obj: CliContext, app_spec: str | None, grace: float, group: str,
          no_group: bool) -> None:
    """Serve the store's sessions: at start resume the open turns no live worker owns (others
    are left to their owner: the rolling-deploy case; one waiting on a person's verdict waits
    for it), wake sessions on `inject --wake`, resume parked turns when verdicts arrive, take
    over sessions whose owner's lease expired. SIGTERM
    stops gracefully: running turns stop at a step boundary, stay resumable, and are released
    to another live worker. If its views stop following the log (another store's process
    rebuilt a shared views file), it stops the same way and exits 1."""
    if not group.strip():
        raise click.BadParameter("the group name cannot be empty", param_hint="'--group'")
    logging.getLogger("terret").setLevel(logging.INFO)
    handler = logging.StreamHandler()
    handler.setFormatter(PrintableFormatter("%(asctime)s %(levelname)s %(message)s"))
    logging.getLogger("terret").addHandler(handler)
    logging.getLogger("terret").propagate = False
    app = app_for(app_spec)  # before the store: a refused app leaves no new store file behind
    pooled = not no_group and obj.store(create=True).consumer_groups
    runtime = runtime_for(obj, app_spec, app, own_views=pooled)
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        log.info("received %s; stopping at the next step boundary",
                 signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    # The serving line is said when ready: the open turns are claimed, none has run yet, so
    # every transition is logged after it.
    pool = f"; pool {group}" if pooled else ""
    runtime.serve_start(group=group if pooled else None, on_ready=lambda resumed: note(
        f"serving {obj.masked_uri}; resumed {len(resumed)} open turn(s); pid {os.getpid()}"
        f"{pool}"))
    _serve_until_stopped(runtime, stop, grace)


def _serve_until_stopped(runtime: Runtime, stop: threading.Event, grace: float) -> None:
    """Until SIGTERM or Ctrl-C — or the views stop following the log for good: a worker
    serving nothing must not stay up as a live one. Then stop gracefully."""
    while not stop.wait(0.5) and runtime.runner.failure is None:
        runtime.runner.check_views_kept()
    failure = runtime.runner.failure
    if failure is not None:
        log.error("the views stopped following the log; stopping so that another live worker "
                  "serves these sessions")
    runtime.close(grace=grace)
    if runtime.stop_overran and failure is None:
        # A last write still runs (a store that does not answer), on an upkeep thread the
        # interpreter's exit would wait for — the store's timeout, past what a supervisor
        # waits: end here, as after a crash (the lease expires; nothing written is lost).
        log.info("stopped (what did not finish is left to the lease, as after a crash)")
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    log.info("stopped")
    if failure is not None:  # said as every error is, exit 1: a supervisor restarts it
        raise failure if isinstance(failure, TerretError) else RuntimeFault(
            f"the projection runner stopped: {failure}")


def register(cli: click.Group) -> None:
    cli.add_command(serve)
