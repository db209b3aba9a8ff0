"""docs/cli.md against the click command tree (``terret.cli.cli``): every command and group
has a section and every section a command; every option and argument of a command is named in
its section; the global options and environment variables are documented; and every
``--json`` example has the shape the command really prints."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any
from uuid import uuid4

import click
import pytest

from terret.cli import cli
from terret.domain.store import NewRecord, session_stream
from tests.cli.conftest import DEMO_APP, ROOT, Target

DOC = ROOT / "docs" / "cli.md"
HEADING = re.compile(r"^(#{2,4}) (.*)$", re.M)
COMMAND_HEADING = re.compile(r"^#{3,4} `terret ([a-z -]+)`$")
MARKER = re.compile(r"<!-- (json|jsonl): ([a-z -]+?) -->\n```json\n(.*?)\n```", re.S)


def text() -> str:
    return DOC.read_text()


def sections() -> dict[str, str]:
    """Heading text → the text up to the next heading of any level."""
    doc = text()
    heads = list(HEADING.finditer(doc))
    out: dict[str, str] = {}
    for i, head in enumerate(heads):
        end = heads[i + 1].start() if i + 1 < len(heads) else len(doc)
        out[head.group(2)] = doc[head.end():end]
    return out


def commands() -> dict[str, click.Command]:
    """Every command and group below the root, by path (``sessions list``)."""
    found: dict[str, click.Command] = {}

    def walk(group: click.Group, prefix: str) -> None:
        for name, command in group.commands.items():
            path = f"{prefix}{name}"
            found[path] = command
            if isinstance(command, click.Group):
                walk(command, path + " ")

    walk(cli, "")
    return found


def documented() -> dict[str, str]:
    out = {}
    for heading, body in sections().items():
        match = COMMAND_HEADING.match(f"### {heading}")
        if match:
            out[match.group(1)] = body
    return out


def test_every_command_has_a_section() -> None:
    missing = sorted(set(commands()) - set(documented()))
    assert not missing, f"commands without a section in docs/cli.md: {missing}"


def test_every_section_is_a_command() -> None:
    stale = sorted(set(documented()) - set(commands()))
    assert not stale, f"sections of docs/cli.md for no command: {stale}"


def test_sections_follow_the_tree() -> None:
    """Groups are ``###`` headings with their subcommands as ``####`` below them."""
    doc = text()
    for path in commands():
        level = "####" if " " in path else "###"
        assert f"\n{level} `terret {path}`\n" in doc, path


@pytest.mark.parametrize("path", sorted(commands()))
def test_every_option_and_argument_is_named(path: str) -> None:
    command = commands()[path]
    body = documented()[path]
    for param in command.params:
        if isinstance(param, click.Argument):
            name = param.human_readable_name
            assert name in body, f"terret {path}: argument {name} is not documented"
        elif isinstance(param, click.Option):
            longest = max(param.opts, key=len)
            assert f"`{longest}" in body or f"{longest} " in body or f"{longest}`" in body, (
                f"terret {path}: option {longest} is not documented")
    if not isinstance(command, click.Group):
        assert f"terret {path}" in body  # a usage line


def test_global_options_and_environment() -> None:
    parts = sections()
    options = parts["Global options"]
    env = parts["Environment variables"]
    for param in cli.params:
        if isinstance(param, click.Option):
            for opt in param.opts:
                assert f"`{opt}" in options or f"{opt}`" in options, opt
            if param.envvar:
                assert f"`{param.envvar}`" in env, param.envvar
    for command in commands().values():
        for param in command.params:
            envvar = getattr(param, "envvar", None)
            if envvar:
                assert f"`{envvar}`" in env, envvar
    for name in ("TERRET_STORE", "TERRET_VIEWS", "TERRET_APP", "TERRET_MAIN_MODEL",
                 "TERRET_COMPACTOR_MODEL", "TERRET_TITLER_MODEL", "TERRET_STORE_TIMEOUT",
                 "TERRET_COMPACTION_BUDGET", "TERRET_SUMMARIZER"):
        assert f"`{name}`" in env, name
    # Every TERRET_* variable named in the CLI's code is in the table (f-string names such
    # as TERRET_{ROLE}_MODEL are covered by the explicit list above).
    sources = "".join(path.read_text() for path in (ROOT / "terret" / "cli").glob("*.py"))
    named = {n for n in re.findall(r"TERRET_[A-Z_]+", sources) if not n.endswith("_")}
    missing = sorted(n for n in named if f"`{n}`" not in env)
    assert not missing, f"environment variables read by terret/cli but not documented: {missing}"
    codes = parts["Exit codes and errors"]
    assert "| 0 |" in codes and "| 1 |" in codes and "| 2 |" in codes


# --- the JSON shapes -------------------------------------------------------------------------


def conforms(doc: Any, actual: Any, where: str = "$") -> list[str]:
    """Differences between a documented example and real output, by shape: the same keys,
    the same JSON types; ``<key>`` stands for any keys; ``null`` on either side matches."""
    if doc is None or actual is None:
        return []
    if isinstance(doc, dict):
        if not isinstance(actual, dict):
            return [f"{where}: documented an object, got {type(actual).__name__}"]
        dynamic = [k for k in doc if k.startswith("<")]
        if dynamic:
            assert len(doc) == 1, f"{where}: a <key> stands alone"
            if not actual:
                return [f"{where}: empty object; the example is not checked"]
            return [d for k, v in actual.items()
                    for d in conforms(doc[dynamic[0]], v, f"{where}.{k}")]
        if set(doc) != set(actual):
            return [f"{where}: documented keys {sorted(doc)}, got {sorted(actual)}"]
        return [d for k in doc for d in conforms(doc[k], actual[k], f"{where}.{k}")]
    if isinstance(doc, list):
        if not isinstance(actual, list):
            return [f"{where}: documented a list, got {type(actual).__name__}"]
        if doc and not actual:
            return [f"{where}: empty list; the example is not checked"]
        return [d for i, item in enumerate(actual) for d in conforms(doc[0], item, f"{where}[{i}]")]
    kinds = {bool: "boolean", int: "number", float: "number", str: "string"}
    if kinds[type(doc)] != kinds.get(type(actual)):
        return [f"{where}: documented {kinds[type(doc)]}, got {type(actual).__name__}"]
    return []


def examples() -> dict[str, tuple[str, Any]]:
    out: dict[str, tuple[str, Any]] = {}
    for match in MARKER.finditer(text()):
        kind, name, body = match.groups()
        out[name] = (kind, json.loads(body))
    return out


def test_conforms_catches_differences() -> None:
    assert conforms({"a": 1, "b": [{"c": "x"}]}, {"a": 2.5, "b": [{"c": "y"}]}) == []
    assert conforms({"a": 1}, {"a": 1, "b": 2})
    assert conforms({"a": 1}, {"a": "1"})
    assert conforms({"a": True}, {"a": 1})
    assert conforms({"<k>": {"n": 1}}, {"x": {"n": 1}, "y": {"m": 1}})
    assert conforms([{"a": 1}], [])


def test_json_examples_have_the_real_shapes(tmp_path: Path) -> None:
    target = Target("sqlite", str(tmp_path / "t.db"), str(tmp_path / "v.db"), tmp_path)
    target.store()
    listed, finished, compacted = target.parked(target.finished()), target.finished(), \
        target.finished()
    to_approve, to_deny, to_cancel = target.parked(), target.parked(), target.parked()
    to_close, to_purge = target.new_session(), target.closed()
    target.invoke("policy", "set", str(finished), "service_*", "fs.read")
    f, ra = str(finished), str(to_approve)
    runs: dict[str, list[str]] = {
        "sessions list": ["sessions", "list"],
        "sessions show": ["sessions", "show", str(listed)],
        "approvals list": ["approvals", "list"],
        "policy show": ["policy", "show", f],
        "usage": ["usage"],
        "usage --by model": ["usage", "--by", "model"],
        "usage --by turn": ["usage", f, "--by", "turn"],
        "title": ["title", f],
        "log": ["log", f],
        "events": ["events"],
        "projections status": ["projections", "status"],
        "projections verify": ["projections", "verify"],
        "projections rebuild": ["projections", "rebuild"],
        "doctor": ["doctor"],
        "sessions new": ["sessions", "new"],
        "sessions close": ["sessions", "close", str(to_close)],
        "sessions purge": ["sessions", "purge", str(to_purge), "--yes"],
        "approve": ["approve", ra, "call-deploy"],
        "resume": ["resume", ra, "--app", DEMO_APP],
        "deny": ["deny", str(to_deny), "call-deploy", "--reason", "no"],
        "inject": ["inject", f, "more"],
        "cancel": ["cancel", str(to_cancel)],
        "policy set": ["policy", "set", f, "a*"],
        "model set": ["model", "set", f, "titler", "x:y"],
        "compact": ["compact", str(compacted), "--app", DEMO_APP],
    }
    documented_examples = examples()
    assert set(documented_examples) == set(runs) | {"projections skip"}
    problems: list[str] = []
    for name, args in runs.items():
        result = target.invoke("--json", *args)
        assert result.exit_code == 0, (name, result.stderr)
        kind, example = documented_examples[name]
        if kind == "jsonl":
            # One example per event type: compared with the lines of that type.
            actual = [json.loads(line) for line in result.stdout.splitlines()]
            same = [item for item in actual if item["type"] == example["type"]]
            assert same, f"{name}: no {example['type']} line to compare"
            problems += [f"{name}: {d}" for item in same for d in conforms(example, item)]
        else:
            problems += [f"{name}: {d}" for d in conforms(example, json.loads(result.stdout))]

    # `projections skip` needs a halted projection: an event no projection can decode.
    session = target.new_session()
    stream = session_stream(session)
    target.store().append(stream, [NewRecord(uuid4(), "turn/start", b"{not json")],
                          target.store().stream_version(stream))
    target.invoke("sessions", "list")  # catching up halts the projections on it
    status = target.json("projections", "status")
    halted = [s for s in status if s["halted"]]
    assert halted, status
    problems += [f"projections status (halted): {d}"
                 for d in conforms({"position": 1, "error": "x"}, halted[0]["halted"])]
    skipped = target.invoke("--json", "projections", "skip", halted[0]["name"])
    assert skipped.exit_code == 0, skipped.stderr
    problems += [f"projections skip: {d}" for d in
                 conforms(documented_examples["projections skip"][1], json.loads(skipped.stdout))]
    target.close()
    assert not problems, "\n".join(problems)
