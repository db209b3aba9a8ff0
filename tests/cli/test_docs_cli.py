"""docs/cli.md against the click command tree (``terret.cli.cli``): every command and group
has a section and every section a command; every option and argument of a command is named in
its section; the global options and environment variables are documented; and every
``--json`` example has the shape the command really prints."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any
from uuid import uuid4

import click
import pytest

from terret.adapters.stores.uri import open_store
from terret.cli import cli
from terret.domain.events import UsageData
from terret.domain.store import NewRecord, session_stream
from terret.runtime.ownership import WorkerLease
from tests.cli.conftest import DEMO_APP, MISSING, ROOT, Target, invoke_cli, one_line_error

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

    cli.load_all()  # the root imports a command's module when it is first used
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
        return _conforms_object(doc, actual, where)
    if isinstance(doc, list):
        return _conforms_list(doc, actual, where)
    kinds = {bool: "boolean", int: "number", float: "number", str: "string"}
    if kinds[type(doc)] != kinds.get(type(actual)):
        return [f"{where}: documented {kinds[type(doc)]}, got {type(actual).__name__}"]
    return []


def _conforms_object(doc: dict[str, Any], actual: Any, where: str) -> list[str]:
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


def _conforms_list(doc: list[Any], actual: Any, where: str) -> list[str]:
    if not isinstance(actual, list):
        return [f"{where}: documented a list, got {type(actual).__name__}"]
    if doc and not actual:
        return [f"{where}: empty list; the example is not checked"]
    return [d for i, item in enumerate(actual) for d in conforms(doc[0], item, f"{where}[{i}]")]


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


def sorted_json(text: str, *, indent: int | None) -> bool:
    """``text`` is JSON written with its keys sorted at every level (and the given indent)."""
    return text == json.dumps(json.loads(text), indent=indent, sort_keys=True)


def test_sorted_json_catches_unsorted_keys() -> None:
    assert sorted_json('{"a": {"b": 1, "c": 2}}', indent=None)
    assert not sorted_json('{"a": {"c": 2, "b": 1}}', indent=None)
    assert not sorted_json('{"b": 1, "a": 2}', indent=None)


def test_json_examples_have_the_real_shapes(target: Target) -> None:
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
        "usage --by purpose": ["usage", "--by", "purpose"],
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
        "policy reset": ["policy", "reset", f, "--app", DEMO_APP],
        "workers": ["workers"],
        "model set": ["model", "set", f, "titler", "scripted:titles"],
        "compact": ["compact", str(compacted), "--app", DEMO_APP],
    }
    from tests.cli.waits import in_doubt, parked_on_budget

    on_budget, doubted, doubted_too = parked_on_budget(target), in_doubt(target), \
        in_doubt(target)
    runs.update({
        "budget show": ["budget", "show", str(on_budget)],
        "budget set": ["budget", "set", f, "5.00"],
        "budget clear": ["budget", "clear", f],
        "budget list": ["budget", "list"],
        "in-doubt rerun": ["in-doubt", "rerun", str(doubted), "call-deploy"],
        "in-doubt skip": ["in-doubt", "skip", str(doubted_too), "call-deploy", "--reason",
                          "deployed already"],
    })
    documented_examples = examples()
    assert set(documented_examples) == set(runs) | {"projections skip"}
    problems: list[str] = []
    # `workers` lists the live ones: one beats while the commands run.
    lease = WorkerLease(target.store().workers(), ttl=15.0,
                        sessions=lambda: [str(finished)])
    lease.upkeep = lambda: ("title", "compaction")  # as a started runtime's with a budget
    lease.ensure_beating()
    for name, args in runs.items():
        result = target.invoke("--json", *args)
        assert result.exit_code == 0, (name, result.stderr)
        kind, example = documented_examples[name]
        # "keys sorted": the page's examples, and what the command prints.
        if json.dumps(example, sort_keys=True) != json.dumps(example):
            problems.append(f"{name}: the example's keys are not sorted")
        if kind == "jsonl":
            problems += [f"{name}: keys not sorted in {line}"
                         for line in result.stdout.splitlines()
                         if not sorted_json(line, indent=None)]
            # One example per event type: compared with the lines of that type.
            actual = [json.loads(line) for line in result.stdout.splitlines()]
            same = [item for item in actual if item["type"] == example["type"]]
            assert same, f"{name}: no {example['type']} line to compare"
            problems += [f"{name}: {d}" for item in same for d in conforms(example, item)]
        else:
            if not sorted_json(result.stdout.removesuffix("\n"), indent=2):
                problems.append(f"{name}: keys not sorted (or not indented)")
            problems += [f"{name}: {d}" for d in conforms(example, json.loads(result.stdout))]

    lease.stop()

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
    assert not problems, "\n".join(problems)


# --- command lines on every page -------------------------------------------------------------

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```([a-z]*)\n(.*?)^```", re.S | re.M)
SPAN = re.compile(r"`(terret [^`]+)`")
PLACEHOLDERS = {
    "SESSION_ID": MISSING, "SESSION": MISSING, "<id>": MISSING, "CALL_ID": "call-1",
    "CALL": "call-1", "ROLE": "main", "SPEC": "a:b", "TEXT": "hi", "NEW_TITLE": "a title",
    "PATTERNS": "fs.*", "NAME": "usage", "COMMAND": "sessions", "MODULE:FUNC": "m:f",
    "SEQ": "1", "N": "1", "SECONDS": "1", "FILE": "x.db", "WIRE_NAME": "turn/start",
    "STATUS": "idle", "WHEN": "2h", "JSON": "{}",
}
"""What a placeholder of a usage line stands for, in a value the option's type takes."""


def command_lines(page: Path) -> list[str]:
    """Every ``terret …`` command line of a page: the lines of its ``sh`` blocks and its
    inline code spans (usage lines included), whitespace collapsed."""
    text = page.read_text()
    found = [line.strip() for lang, body in FENCE.findall(text) if lang in ("sh", "")
             for line in body.splitlines() if line.strip().startswith("terret ")]
    prose = FENCE.sub("", text)
    found += [" ".join(span.split()) for span in SPAN.findall(prose)]
    return found


def error_examples() -> list[tuple[str, str]]:
    """The commands the page shows failing, with the line each prints."""
    found = re.search(r"\n\n((?:(?!\n\n).)+)\n\n<!-- errors -->\n```\n(.*?)\n```", text(), re.S)
    assert found, "docs/cli.md has no `<!-- errors -->` example"
    commands = [" ".join(span.split()) for span in SPAN.findall(found.group(1))]
    lines = found.group(2).splitlines()
    assert len(commands) == len(lines), (commands, lines)
    return list(zip(commands, lines, strict=True))


def tokens(line: str) -> list[str]:
    """A documented line as a command line: a usage line's brackets dropped, its first
    alternative taken (``model|turn``), its placeholders replaced by values."""
    line = line.replace("]…", "]").replace("[", "").replace("]", "")
    out = []
    for token in shlex.split(line, comments=True)[1:]:
        token = token.split("|")[0]
        if "…" in token:  # an abbreviated session id: 6f5d…b558
            token = MISSING
        elif re.fullmatch(r"[0-9a-f]{4,31}", token):  # a session id's prefix: needs a store
            token = MISSING
        elif re.fullmatch(r"[A-Z][A-Z_:]*|<[a-z]+>", token):
            assert token in PLACEHOLDERS, f"add the placeholder {token} to PLACEHOLDERS"
            token = PLACEHOLDERS[token]
        out.append(token)
    return out


def parse(args: list[str]) -> None:
    """Parse ``terret ARGS`` as click would run it, without running it: every option must
    belong to the command it follows and every value must convert."""
    try:
        ctx = cli.make_context("terret", list(args))
        command: click.Command = cli
        while isinstance(command, click.Group):
            rest = [*ctx._protected_args, *ctx.args]
            if not rest:
                return  # a group named alone: `terret sessions`
            name, found, rest = command.resolve_command(ctx, rest)
            assert found is not None and name is not None
            command = found
            if not rest:
                return  # named in prose: `terret approve`, `terret sessions`
            ctx = command.make_context(name, rest, parent=ctx)
    except click.exceptions.Exit:
        return  # --help, --version


def test_every_command_line_in_the_docs_parses() -> None:
    failing = {command for command, _ in error_examples()}
    problems = []
    checked = 0
    for page in PAGES:
        for line in command_lines(page):
            if line in failing:
                continue
            try:
                parse(tokens(line))
                checked += 1
            except click.ClickException as exc:
                problems.append(f"{page.name}: `{line}`: {type(exc).__name__}: "
                                f"{exc.format_message()}")
    assert checked > 60, checked
    assert not problems, "\n".join(problems)


def test_the_parser_catches_a_misplaced_option() -> None:
    with pytest.raises(click.NoSuchOption):
        parse(tokens("terret --app myapp:app serve"))
    with pytest.raises(click.BadParameter):
        parse(tokens("terret log SESSION_ID --from 0"))
    parse(tokens("terret usage [SESSION_ID] [--by model|turn]"))


# --- errors ----------------------------------------------------------------------------------

TYPED_ERROR = re.compile(r"^Error: ([A-Z][A-Za-z]+): \S")


def documented_error_types() -> set[str]:
    return set(re.findall(r"`([A-Z][A-Za-z]+)`", sections()["Exit codes and errors"]))


def test_the_error_examples_are_what_the_commands_print(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in ("TERRET_STORE", "TERRET_VIEWS", "TERRET_APP"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.chdir(tmp_path)
    open_store("terret.db").close()  # the default store, as the examples name it
    for command, printed in error_examples():
        result = invoke_cli(*shlex.split(command)[1:])
        assert result.exit_code in (1, 2), (command, result.stderr)
        assert result.stdout == "", command
        assert one_line_error(result.stderr) == printed, (command, result.stderr)


def test_every_error_is_one_typed_line(target: Target, tmp_path: Path) -> None:
    """A sample of every kind of failure prints ``Error: <Type>: <message>``, with a type the
    page names, and the exit code of its kind; stdout stays empty."""
    idle, parked, closed = target.finished(), target.parked(), target.closed()
    i, p, c = str(idle), str(parked), str(closed)
    cases: list[tuple[list[str], int, str, str | None]] = [
        (["sessions", "show", MISSING], 1, "SessionNotFound", None),
        (["approve", p, "call-nope"], 1, "ApprovalNotPending", None),
        (["cancel", i], 1, "NoOpenTurn", None),
        (["sessions", "close", p], 1, "TurnAlreadyRunning", None),
        (["inject", c, "hi"], 1, "SessionClosed", None),
        (["sessions", "purge", i, "--yes"], 1, "RuleViolation", None),
        (["compact", p, "--app", DEMO_APP], 1, "CompactionDeclined", None),
        (["projections", "rebuild", "nope"], 1, "KeyError", None),
        (["sessions", "purge", c], 1, "Aborted", "n\n"),
        (["sessions", "show", "x"], 2, "BadParameter", None),
        (["deny", i, "call-deploy", "--reason", " "], 2, "BadParameter", None),
        (["resume", p, "--app", "no.such.module:app"], 2, "BadParameter", None),
        (["approve", i], 2, "MissingParameter", None),
        (["sessions", "list", "--bogus"], 2, "NoSuchOption", None),
        (["frobnicate"], 2, "NoSuchCommand", None),
        (["usage", "--by", "turn"], 2, "UsageError", None),
    ]
    named = documented_error_types()
    problems = []
    for args, code, kind, answer in cases:
        result = target.invoke(*args, input=answer)
        stderr = result.stderr
        if answer is not None:  # the confirmation prompt went to stderr too
            stderr = "\n".join(stderr.splitlines()[1:])
        line = one_line_error(stderr)
        found = TYPED_ERROR.match(line)
        if result.exit_code != code or found is None or found.group(1) != kind:
            problems.append(f"{args}: exit {result.exit_code}, {line!r}; expected exit {code}, "
                            f"Error: {kind}: …")
        if kind not in named:
            problems.append(f"{kind} is not named in 'Exit codes and errors'")
        if result.stdout.strip() and answer is None:
            problems.append(f"{args}: wrote to stdout: {result.stdout!r}")
    # The store itself: a URI no store takes, a SQLite file that is not there.
    for args, code, kind in ((["--store", "esdb+bogus://x", "sessions", "list"], 2,
                              "BadParameter"),
                             (["--store", str(tmp_path / "none.db"), "sessions", "list"], 1,
                              "StoreUnavailable")):
        result = invoke_cli(*args)
        line = one_line_error(result.stderr)
        if result.exit_code != code or not line.startswith(f"Error: {kind}: "):
            problems.append(f"{args}: exit {result.exit_code}, {line!r}")
    assert not problems, "\n".join(problems)


# --- text and JSON output as the page describes it -------------------------------------------


def test_log_json_is_the_data_as_stored(target: Target) -> None:
    """`data` is the stored data itself: no nulls added, nothing dropped, an older schema
    version not upcast; `version` the one it was written with; keys sorted."""
    finished = target.finished()
    other = target.new_session()
    stream = session_stream(other)
    target.store().append(stream, [
        NewRecord(uuid4(), "step/end", b'{"turn":1,"step":1,"prompt_tokens":5,'
                  b'"completion_tokens":1,"cost":null}', b'{"schema_version":1}'),
        NewRecord(uuid4(), "acme.review/verdict", b'{"score":5,"note":null}',
                  b'{"schema_version":3}'),
    ], target.store().stream_version(stream))
    for sid in (finished, other):
        result = target.invoke("--json", "log", str(sid))
        assert result.exit_code == 0, result.stderr
        records = target.store().read_stream(session_stream(sid))
        lines = result.stdout.splitlines()
        assert len(lines) == len(records)
        for line, record in zip(lines, records, strict=True):
            assert sorted_json(line, indent=None), line
            shown = json.loads(line)
            assert shown["data"] == json.loads(record.data), (shown, record.data)
            assert shown["version"] == json.loads(record.metadata).get("schema_version", 1)
            assert (shown["seq"], shown["type"]) == (record.seq, record.wire_name)
    shown = [json.loads(line) for line in
             target.invoke("--json", "log", str(other)).stdout.splitlines()]
    assert shown[-2]["version"] == 1 and "prompt_tokens" in shown[-2]["data"]
    assert shown[-1]["data"] == {"note": None, "score": 5} and shown[-1]["version"] == 3


def test_events_text_shows_commutativity() -> None:
    from terret.domain.catalogue import catalogue

    lines = invoke_cli("events").stdout.splitlines()
    header = lines[0]
    assert "COMMUTATIVE" in header, header
    start = header.index("COMMUTATIVE")
    shown = {}
    for row in lines[1:]:
        shown[row.split()[0]] = row[start:start + len("COMMUTATIVE")].strip()
    for event_class in catalogue:
        assert shown[event_class.wire_name] == ("yes" if event_class.commutative else ""), (
            event_class.wire_name, shown[event_class.wire_name])


def test_sessions_show_text_shows_what_the_page_lists(target: Target) -> None:
    """Owed calls, usage per model, inbox, approvals, a requested cancel, resumability: the
    labelled lines of the page's text example, in its order."""
    sid = target.finished()
    # Turn 2 failed (the page's example shows a failed last turn and its error), turn 3 parks.
    target.writer().execute(sid, lambda s: s.start_turn(trigger="user", text="again"))
    target.writer().execute(sid, lambda s: s.end_turn(
        "failed", error="ProviderError: openrouter: HTTP 503\nretry later"))
    target.parked(sid)
    target.writer().execute(sid, lambda s: s.record_usage(  # the titler's request, say
        "title", "demo:ops-model-1", UsageData(prompt_tokens=40, completion_tokens=6,
                                               cost=0.0004)))
    assert target.invoke("inject", str(sid), "also check payments").exit_code == 0
    assert target.invoke("cancel", str(sid)).exit_code == 0
    data = target.json("sessions", "show", str(sid))
    text_out = target.invoke("sessions", "show", str(sid)).stdout.splitlines()
    for spec, used in data["usage_by_model"].items():
        assert any(line.startswith(f"  {spec}: {used['prompt_tokens']} prompt + ")
                   for line in text_out), (spec, text_out)
    assert len(data["usage_by_model"]) == 2
    assert data["upkeep_usage"] == {"title": {"prompt_tokens": 40, "completion_tokens": 6,
                                              "cost": 0.0004, "steps": 1}}
    assert ("upkeep    title: 40 prompt + 6 completion tokens, $0.000400, 1 call"
            in text_out), text_out
    for owed in data["owed_calls"]:
        assert (f"owed      {owed['id']}: {owed['name']} {json.dumps(owed['args'])}"
                in text_out), text_out
    body = documented()["sessions show"]
    example = re.search(r"```\n(session .*?)\n```", body, re.S)
    assert example, "the text example of `sessions show`"
    labels = [line.split()[0] for line in example.group(1).splitlines()
              if not line.startswith(" ")]
    assert [line.split()[0] for line in text_out if not line.startswith(" ")] == labels
    def per_model(lines: list[str]) -> list[str]:  # "  spec: …" (an error's lines go deeper)
        return [line for line in lines if line.startswith("  ") and line[2] != " "]

    assert len(per_model(example.group(1).splitlines())) == len(per_model(text_out))
    # Why the last turn stopped, in full (every line of its error), and who owns the session.
    assert "last turn 2 failed " in text_out[4], text_out
    assert text_out[5:7] == ["error     ProviderError: openrouter: HTTP 503",
                             "          retry later"], text_out
    assert data["last_turn"]["error"] == "ProviderError: openrouter: HTTP 503\nretry later"
    assert text_out[7] == "owner     none (no worker owns it)" and data["owner"] is None
    assert data["cancel"]["by"]["actor"] == "operator"


# --- README ----------------------------------------------------------------------------------


def test_the_readme_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    readme = (ROOT / "README.md").read_text()
    blocks = [body for lang, body in FENCE.findall(readme) if lang == "python"]
    assert len(blocks) == 1
    monkeypatch.chdir(tmp_path)
    exec(compile(blocks[0], "README.md", "exec"), {"__name__": "readme"})
    printed = capsys.readouterr().out.split()
    documented_output = re.search(r"\)\.status\)\s+# (\w+)", blocks[0])
    assert documented_output and printed == [documented_output.group(1)]
