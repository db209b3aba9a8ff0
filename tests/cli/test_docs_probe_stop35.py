"""What a docs probe found against docs/cli.md, each held to what the page says: a budget's
figure in ``--json`` is the rounded one the log records; a budget is written in ASCII digits
as typed; ``terret log`` tells an escape character from the text ``\\x1b``; a path or a store
address of thousands of characters is cut in an error line. On SQLite and the EventStoreDB
emulator (``target``); the budget is set by a real second process where it matters."""

from __future__ import annotations

import json

import pytest

from terret.domain.events import Actor
from tests.cli.conftest import Target, invoke_cli, one_line_error


def test_a_budget_is_recorded_and_reported_as_the_one_rounded_figure(target: Target) -> None:
    """docs/cli.md: a cost in --json is rounded to 10 decimal places, the same figure wherever
    the same spend is reported — a budget recorded as 5.123456789012345 was printed so."""
    sid = target.new_session()
    done = target.run("--json", "budget", "set", str(sid), "5.123456789012345")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["budget"] == 5.123456789
    (recorded,) = [e for e in target.events(sid) if e.wire_name == "budget/set"]
    assert recorded.payload.limit == 5.123456789  # type: ignore[union-attr]
    assert target.json("budget", "show", str(sid))["budget"] == 5.123456789
    assert target.json("sessions", "show", str(sid))["budget"]["limit"] == 5.123456789
    # The domain rounds it too: a runtime's set_budget records the same figure.
    target.writer().execute(sid, lambda s: s.set_budget(0.1 + 0.2, by=Actor(actor="operator")))
    assert target.json("budget", "show", str(sid))["budget"] == 0.3


@pytest.mark.parametrize("amount", ["٥", "$٥٠", "５.５０", " 5 ", "5\n", "5 "])
def test_a_budget_in_other_digits_or_with_spaces_is_a_usage_error(target: Target,
                                                                  amount: str) -> None:
    """docs/cli.md: digits, at most 12 before the point; anything else is a usage error.
    Arabic-Indic and full-width digits were read as 5 and 5.5 (``float`` reads them)."""
    sid = target.new_session()
    before = target.snapshot()
    result = target.invoke("budget", "set", str(sid), amount)
    assert result.exit_code == 2, (amount, result.stdout)
    assert "is not an amount" in one_line_error(result.stderr)
    assert target.snapshot() == before


def test_log_tells_an_escape_character_from_the_text_backslash_x1b(target: Target) -> None:
    """docs/cli.md: control characters are shown escaped. An injected text's summary escaped
    them twice, so a real ESC read exactly as a typed ``\\x1b``."""
    sid = target.new_session()
    for text in ("real:\x1b[31m", "typed:\\x1b[31m", "it's 'quoted'"):
        assert target.invoke("inject", str(sid), text).exit_code == 0
    log = target.invoke("log", str(sid)).stdout
    queued = [line for line in log.splitlines() if "inbox/queued" in line]
    assert len(queued) == 3, log
    assert queued[0].endswith(" 'real:\\x1b[31m'"), log
    assert queued[1].endswith(" 'typed:\\\\x1b[31m'"), log
    assert queued[2].endswith(" 'it\\'s \\'quoted\\''"), log
    assert "\x1b" not in log


def test_a_summary_is_cut_on_what_is_shown_never_inside_an_escape() -> None:
    from terret.cli.logcmd import _quoted

    shown = _quoted("\x01" * 300)
    assert len(shown) <= 72 and shown.startswith("'\\x01\\x01") and shown.endswith("…'")
    assert shown.count("\\x01") * 4 + 3 == len(shown)  # whole escapes, then the ellipsis
    assert _quoted("short") == "'short'"


def test_a_path_of_thousands_of_characters_is_cut_in_the_error_line(tmp_path) -> None:
    """docs/cli.md: a value in an error message is cut; a store path of 5,000 characters made
    a 5,120-character error line (an EventStoreDB address, twice that)."""
    long = "c" * 5000
    for args in (["--store", f"/tmp/{long}.db", "sessions", "list"],
                 ["--json", "--store", f"/tmp/{long}.db", "sessions", "list"]):
        result = invoke_cli(*args)
        assert result.exit_code == 1
        line = one_line_error(result.stderr)
        assert len(line) < 400, line
        assert line.startswith("Error: StoreUnavailable: no store at /tmp/ccc")
        assert "cc.db (5008 characters)" in line
    error = json.loads(invoke_cli("--json", "--store", f"/tmp/{long}.db", "sessions",
                                  "list").stdout)["error"]
    assert len(error["message"]) < 400 and "(5008 characters)" in error["message"]
    # A path of ordinary length is shown whole.
    ordinary = str(tmp_path / ("d" * 80) / "events.db")
    line = one_line_error(invoke_cli("--store", ordinary, "sessions", "list").stderr)
    assert ordinary in line


def test_log_json_is_standard_json_even_for_a_foreign_record_holding_nan(
        target: Target) -> None:
    """docs/cli.md: ``--json`` prints JSON Lines. A record another client appended with
    ``NaN`` in its data (Python's decoder reads it) was printed with the bare token, which
    strict JSON parsers refuse."""
    from uuid import uuid4

    from terret.domain import NewRecord, session_stream

    sid = target.new_session()
    stream = session_stream(sid)
    store = target.store()
    deep = b"[" * 500 + b"NaN" + b"]" * 500  # renamed without recursion (it overflowed)
    store.append(stream, [NewRecord(uuid4(), "acme.unknown/odd",
                                    b'{"a": NaN, "b": [Infinity, -Infinity, 1.5]}', b"{}"),
                          NewRecord(uuid4(), "acme.unknown/deep", b'{"a": ' + deep + b"}",
                                    b"{}")],
                 store.stream_version(stream))

    def refuse(token: str) -> None:
        raise ValueError(f"not JSON: {token}")

    done = target.run("--json", "log", str(sid))
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line, parse_constant=refuse) for line in done.stdout.splitlines()]
    assert lines[-2]["data"] == {"a": "NaN", "b": ["Infinity", "-Infinity", 1.5]}
    nested = lines[-1]["data"]["a"]
    for _ in range(500):
        (nested,) = nested
    assert nested == "NaN"
    shown = target.run("log", str(sid), "--full")  # the text shows it as stored
    assert '"a": NaN' in shown.stdout


def test_log_escapes_bidirectional_overrides_in_a_reason(target: Target) -> None:
    """A right-to-left override in a reason reordered the rest of its log line on a terminal
    (a reason that reads as another); it is shown escaped, as control characters are."""
    sid = target.parked()
    reason = "no \u202eyolpeD"
    assert target.invoke("deny", str(sid), "call-deploy", "--reason", reason).exit_code == 0
    log = target.invoke("log", str(sid)).stdout
    assert "no \\u202eyolpeD" in log and "\u202e" not in log, log
