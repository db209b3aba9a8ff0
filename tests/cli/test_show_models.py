"""``sessions show`` of a session that recorded no model roles (created without ``--model``:
the serving app's defaults run it) says so on its ``models`` line instead of leaving it empty;
``--json`` keeps ``"models": {}`` (docs/cli.md, ``sessions show``). On SQLite and on the
EventStoreDB emulator."""

from __future__ import annotations

from uuid import UUID

from tests.cli.conftest import Target


def _models_line(target: Target, sid: UUID) -> str:
    out = target.invoke("sessions", "show", str(sid)).stdout.splitlines()
    return next(line for line in out if line.startswith("models "))


def test_a_session_without_recorded_roles_says_the_apps_defaults_apply(target: Target) -> None:
    plain = UUID(target.invoke("sessions", "new").stdout.strip())
    assert target.json("sessions", "show", str(plain))["models"] == {}
    assert _models_line(target, plain) == \
        "models    (none recorded: the serving app's defaults apply)"

    # A role of its own, but not main: main is still the app's.
    assert target.invoke("model", "set", str(plain), "titler", "scripted:titles").exit_code == 0
    assert target.json("sessions", "show", str(plain))["models"] == {"titler": "scripted:titles"}
    assert _models_line(target, plain) == ("models    titler=scripted:titles (main and any other "
                                           "role: the serving app's defaults)")

    chosen = UUID(target.invoke("sessions", "new", "--model", "scripted:ops").stdout.strip())
    assert _models_line(target, chosen) == "models    main=scripted:ops"
