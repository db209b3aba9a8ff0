"""Start-up (issue 15): the entry point loads a command's module only when that command runs,
``--help`` lists the commands without importing any, and the everyday commands stay clear of
what they do not use — ``--version``/``--help`` of the domain, ``sessions list`` on views that
are up to date of the payload classes, the aggregate and the projection runner, ``approve`` of
the runtime and the runner. (``bench/cli.py`` measures the time.)"""

from __future__ import annotations

import json
import subprocess
import sys

import click
from click.testing import CliRunner

from terret.cli import COMMANDS, cli
from tests.cli.conftest import Target, subprocess_env

HEAVY = ("pydantic", "terret.domain.events", "terret.domain.session",
         "terret.projections.runner", "terret.runtime.runtime", "terret.runtime.agent",
         "httpx", "esdbclient", "grpc")

PROBE = """
import json, sys
args, wanted = json.loads(sys.argv[1]), json.loads(sys.argv[2])
from terret.cli import main
sys.argv = ["terret", *args]
try:
    main()
except SystemExit:
    pass
heavy = [m for m in wanted if m in sys.modules]
sys.stderr.write("\\nLOADED " + json.dumps(heavy) + "\\n")
"""


def loaded(*args: str, cwd: str | None = None) -> list[str]:
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(list(args)),
                           json.dumps(HEAVY)], capture_output=True, text=True, timeout=120,
                          env=subprocess_env(), cwd=cwd)
    line = [x for x in done.stderr.splitlines() if x.startswith("LOADED ")]
    assert line, done.stderr
    return list(json.loads(line[-1].removeprefix("LOADED ")))


def test_the_command_table_is_in_step_with_the_commands() -> None:
    commands = cli.load_all()
    assert set(commands) == set(COMMANDS), "add new commands to terret.cli.COMMANDS"
    ctx = click.Context(cli)
    for name, command in commands.items():
        module, short = COMMANDS[name]
        assert command.callback is not None
        assert command.callback.__module__ == f"terret.cli.{module}", name
        assert command.get_short_help_str(45) == short, (name, command.get_short_help_str(45))
    assert cli.list_commands(ctx) == sorted(COMMANDS)


def test_help_and_version_load_nothing_heavy() -> None:
    assert loaded("--version") == []
    assert loaded("--help") == []
    assert loaded("sessions", "--help") == []


def test_sessions_list_on_fresh_views_loads_nothing_heavy(target: Target) -> None:
    if target.kind != "sqlite":  # the EventStoreDB client is what that store is
        return
    sid = target.finished()
    assert target.invoke("sessions", "list").exit_code == 0  # the views catch up
    assert loaded(*target.args("sessions", "list"), cwd=str(target.cwd)) == []
    # Behind the log, it catches up first (the runner and the payload classes, then).
    target.writer().execute(sid, lambda s: s.title("renamed"))
    assert "terret.projections.runner" in loaded(*target.args("sessions", "list"),
                                                 cwd=str(target.cwd))
    rows = target.json("sessions", "list")
    assert next(s for s in rows if s["id"] == str(sid))["title"] == "renamed"


def test_approve_loads_the_domain_only(target: Target) -> None:
    if target.kind != "sqlite":
        return
    sid = target.parked()
    heavy = loaded(*target.args("approve", str(sid), "call-deploy"), cwd=str(target.cwd))
    assert "terret.runtime.runtime" not in heavy and "terret.projections.runner" not in heavy
    assert "httpx" not in heavy
    assert target.types(sid)[-1] == "approval/resolved"


GC_PROBE = """
import gc, json, sys
default = gc.get_threshold()
collections = []  # those run while the start-up threshold is set
gc.callbacks.append(lambda phase, info: phase == "start" and gc.get_threshold() != default
                    and collections.append(info))
from terret._startup import main  # the console script's
sys.argv = ["terret", *json.loads(sys.argv[1])]
try:
    main()
except SystemExit:
    pass
during, frozen = len(collections), gc.get_freeze_count()
gc.collect()
sys.stderr.write("\\nGC " + json.dumps([during, frozen, gc.get_threshold() == default]) + "\\n")
"""


def collector(*args: str, cwd: str | None = None) -> tuple[int, int, bool]:
    """Run ``terret args`` in a process of its own: how many garbage collections it ran, how
    many objects were frozen at its end, and whether the collector's thresholds were the
    interpreter's own after the next collection."""
    done = subprocess.run([sys.executable, "-c", GC_PROBE, json.dumps(list(args))],
                          capture_output=True, text=True, timeout=120, env=subprocess_env(),
                          cwd=cwd)
    line = [x for x in done.stderr.splitlines() if x.startswith("GC ")]
    assert line, done.stderr
    during, frozen, restored = json.loads(line[-1].removeprefix("GC "))
    return during, frozen, restored


def test_the_entry_point_collects_no_garbage_while_starting(target: Target) -> None:
    """The ``terret`` command runs no garbage collection during start-up
    (``terret._startup``) and freezes what it made at exit; the first collection puts the
    interpreter's thresholds back, so a long-running command collects as any process does."""
    during, frozen, restored = collector("--version")
    assert (during, restored) == (0, True) and frozen > 0
    if target.kind != "sqlite":
        return
    sid = target.parked()
    during, frozen, restored = collector(*target.args("approve", str(sid), "call-deploy"),
                                         cwd=str(target.cwd))
    assert (during, restored) == (0, True) and frozen > 0
    assert target.types(sid)[-1] == "approval/resolved"


def test_version_is_the_packages_own() -> None:
    from importlib.metadata import version

    import terret

    result = CliRunner().invoke(cli, ["--version"], prog_name="terret")
    assert result.output.strip() == f"terret, version {terret.__version__}"
    assert version("terret") == terret.__version__


def test_pydantic_plugins_are_left_on_for_the_commands_that_run_an_app() -> None:
    from terret.cli import _runs_app_code

    for argv in (["serve"], ["--store", "x.db", "resume", "S"], ["compact", "S", "--app", "m"],
                 ["chat"], ["demo"], ["model", "set", "S", "main", "a:b", "--app=m:app"]):
        assert _runs_app_code(argv), argv
    for argv in (["approve", "S", "C"], ["sessions", "list"], ["--version"], ["log", "S"]):
        assert not _runs_app_code(argv), argv
