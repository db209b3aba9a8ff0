"""``terret serve``: run agents for the store's sessions until SIGTERM."""

from __future__ import annotations

import logging
import os
import signal
import threading

import click

from terret.cli._context import CliContext, note
from terret.cli.admin import APP_OPTION, app_for, runtime_for

log = logging.getLogger("terret.serve")


@click.command("serve")
@APP_OPTION
@click.option("--grace", type=click.FloatRange(min=0), default=10.0, show_default=True,
              help="Seconds running turns get to reach a step boundary on SIGTERM.")
@click.pass_obj
def serve(obj: CliContext, app_spec: str | None, grace: float) -> None:
    """Serve the store's sessions: at start resume the open turns no live worker owns (others
    are left to their owner: the rolling-deploy case), wake sessions on `inject --wake`, resume
    parked turns when verdicts arrive, take over sessions whose owner's lease expired. SIGTERM
    stops gracefully: running turns stop at a step boundary, stay resumable, and are released
    to another live worker."""
    logging.getLogger("terret").setLevel(logging.INFO)
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    logging.getLogger("terret").addHandler(handler)
    logging.getLogger("terret").propagate = False
    app = app_for(app_spec)  # before the store: a refused app leaves no new store file behind
    obj.store(create=True)
    runtime = runtime_for(obj, app_spec, app)
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        log.info("received %s; stopping at the next step boundary",
                 signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    # The serving line is said when ready: the open turns are claimed, none has run yet, so
    # every transition is logged after it.
    runtime.serve_start(on_ready=lambda resumed: note(
        f"serving {obj.masked_uri}; resumed {len(resumed)} open turn(s); pid {os.getpid()}"))
    while not stop.wait(0.5):
        pass
    runtime.close(grace=grace)
    log.info("stopped")


def register(cli: click.Group) -> None:
    cli.add_command(serve)
