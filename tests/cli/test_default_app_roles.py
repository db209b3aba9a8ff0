"""The default app (no ``--app``) uses the runtime's defaults for compaction and titles (R19,
R20): the role summarizer on the session's own ``compactor`` role, so a ``model set`` on the
session is honoured, and a manual ``compact`` without any compactor role fails, typed."""

from __future__ import annotations

import pytest

from tests.cli.conftest import Target, one_line_error


@pytest.fixture(autouse=True)
def _no_roles_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("TERRET_COMPACTOR_MODEL", "TERRET_TITLER_MODEL", "TERRET_SUMMARIZER"):
        monkeypatch.delenv(name, raising=False)


def test_compact_without_a_compactor_role_is_a_configuration_error(target: Target) -> None:
    sid = target.finished()
    before = target.types(sid)
    result = target.invoke("compact", str(sid))
    assert result.exit_code == 1, result.stderr
    line = one_line_error(result.stderr)
    assert line.startswith("Error: ConfigurationError:") and "compactor" in line, line
    assert target.types(sid) == before  # nothing written


def test_compact_asks_the_compactor_role_the_session_records(target: Target) -> None:
    sid = target.finished()
    target.json("model", "set", str(sid), "compactor", "scripted:echo")
    data = target.json("compact", str(sid))
    (compacted,) = [e for e in target.events(sid) if e.wire_name == "session/compacted"]
    assert data["upto_seq"] == compacted.payload.upto_seq  # type: ignore[union-attr]
    # The scripted echo model answered the utility request: its summary holds the history.
    assert "status please" in compacted.payload.summary  # type: ignore[union-attr]
