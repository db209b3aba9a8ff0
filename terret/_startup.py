"""The ``terret`` console script (and ``python -m terret``), and the garbage collector while it
starts.

A command's start-up makes objects, not garbage: ``terret approve`` makes some 50,000 container
objects loading its modules and the session, and with the interpreter's default threshold (a
collection every 700 more objects made than freed) it ran some 65 collections that found next
to nothing. So the first collection waits for ``START_UP_OBJECTS`` (it then puts the
interpreter's own thresholds back: a long-running command, ``serve`` or ``chat``, collects as
any Python process does), and at exit what the process made is frozen (``gc.freeze``), so the
interpreter's last collection does not walk the objects of the modules it is about to tear
down anyway. The command's resources are closed before that (its context closes the store and
the views); only objects unreachable in reference cycles are left to the end of the process
instead of that last collection, as Python leaves any object still alive at exit.
``bench/cli.py`` measures the start-up; ``tests/cli/test_startup.py`` holds this.

This module imports nothing but ``gc``: the console script imports it before click, pydantic
or any of Terret's modules.
"""

from __future__ import annotations

import gc

START_UP_OBJECTS = 100_000
"""The collector's first threshold while a ``terret`` process starts."""


def collect_after_start_up() -> None:
    """No garbage collection until ``START_UP_OBJECTS`` more container objects were made than
    freed; the interpreter's thresholds (as they were) from the first collection on."""
    default = gc.get_threshold()
    restored = False

    def restore(phase: str, info: dict[str, int]) -> None:
        nonlocal restored
        if phase == "stop" and not restored:
            restored = True
            gc.set_threshold(*default)

    gc.callbacks.append(restore)
    gc.set_threshold(max(START_UP_OBJECTS, default[0]), *default[1:])


def main() -> None:
    """The ``terret`` command: the collector set first, then ``terret.cli.main``; at exit
    (``SystemExit`` included), the process's objects frozen."""
    collect_after_start_up()
    try:
        from terret.cli import main as run

        run()
    finally:
        gc.freeze()
