"""The ``terret`` command line: administer sessions, serve agents, chat, and the demo.

Exit codes: 0 ok, 1 a domain error (not found, conflict, refused by a rule, unreachable store),
2 a usage error. Messages go to stderr; credentials in store URIs are masked.

The entry point is light (``bench/cli.py`` measures it): a command's module is imported only
when that command runs (``COMMANDS``; ``terret --help`` lists them from there), and the command
modules import the runtime, the aggregate and the projection runner only inside the commands
that use them.
"""

from __future__ import annotations

import errno
import json
import os
import re
import sys
from collections.abc import MutableMapping
from typing import TYPE_CHECKING, Any, NoReturn

import click

from terret import __version__
from terret.cli._context import DEFAULT_STORE, CliContext, WarningLines, resolve_prefixes
from terret.cli._format import printable
from terret.cli._params import JSON_LINES, MAX_SECONDS, FloatRange
from terret.domain.errors import SHOWN_MAX, InvalidPayload, InvalidStoreURI, TerretError

if TYPE_CHECKING:
    from terret.cli._app import App, default_app, load_app

__all__ = ["App", "cli", "default_app", "load_app", "main"]


def __getattr__(name: str) -> Any:
    if name in ("App", "default_app", "load_app"):  # the app loads the runtime: on first use
        from terret.cli import _app

        return getattr(_app, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


COMMANDS: dict[str, tuple[str, str]] = {
    "sessions": ("sessions", "List, inspect, create, close and purge..."),
    "approvals": ("approvals", "Pending approvals of open turns."),
    "approve": ("approvals", "Approve a parked tool call of the..."),
    "deny": ("approvals", "Deny a parked tool call; the model sees..."),
    "budget": ("budget", "The spend budget of sessions: what a..."),
    "in-doubt": ("budget", "Tool calls in doubt: a tool that may not..."),
    "log": ("logcmd", "A session's events, one line each: seq,..."),
    "inject": ("admin", "Queue TEXT in the session's durable inbox;..."),
    "cancel": ("admin", "Cancel the open turn: recorded first; its..."),
    "resume": ("admin", "Resume the session's open turn in this..."),
    "policy": ("admin", "The session's tool allow-list (glob..."),
    "model": ("admin", "Model roles of a session (main, compactor,..."),
    "compact": ("admin", "Compact the session's history now (between..."),
    "title": ("admin", "Show the session's title, or set it to..."),
    "usage": ("admin", "Tokens and cost of the steps' model calls,..."),
    "events": ("admin", "The event catalogue: Terret's events and..."),
    "projections": ("projections", "Read models: their position and lag;..."),
    "doctor": ("projections", "Check that the store and views are..."),
    "serve": ("serve", "Serve the store's sessions: at start..."),
    "chat": ("chat", "Chat with an agent in the terminal; a new..."),
    "demo": ("demo", "Walk through a session's lifecycle on the..."),
    "workers": ("workers", "The live workers (`terret serve`..."),
}
"""Each command: the module of ``terret.cli`` that defines it (its ``register`` adds it), and
its short help for ``terret --help`` (``tests/cli/test_startup.py`` keeps them in step)."""

TYPED = re.compile(r"^[A-Z][A-Za-z0-9]*: ")
"""A message that already names its type (``StoreUnavailable: …``)."""


def _hoist_json(args: list[str]) -> list[str]:
    """``--json`` is a global option, also accepted after the command (``terret sessions list
    --json``): moved before it. Nothing after a ``--`` is touched."""
    end = args.index("--") if "--" in args else len(args)
    if "--json" not in args[1:end]:
        return args
    rest = [a for a in args[:end] if a != "--json"]
    return ["--json", *rest, *args[end:]]


def _wants_json(args: list[str]) -> bool:
    end = args.index("--") if "--" in args else len(args)
    return "--json" in args[:end]


class CommandContext(click.Context):
    """The context every ``terret`` command runs in: a value the domain refuses to record
    (``InvalidPayload``, say an app's malformed allow-list floor) is a usage error of the
    command that was given it, shown with that command's usage hint, as click's own are.

    A session-id prefix is looked up when the command runs, after its command line is parsed
    and every value on it checked (``SessionIdType``): a bad value is refused before the store
    is opened, whether the session was given by its whole id or a prefix."""

    resolves_prefixes = True

    def invoke(self, callback: Any, /, *args: Any, **kwargs: Any) -> Any:
        try:
            # A command's own checks of its values (``checked_first``) come before the lookup.
            with click.core.augment_usage_errors(self):  # (its usage hint, as click's own)
                for check in getattr(self.command, "prechecks", ()):
                    check(kwargs)
            kwargs = resolve_prefixes(self, kwargs)
            self.params.update({k: v for k, v in kwargs.items() if k in self.params})
            return super().invoke(callback, *args, **kwargs)
        except InvalidPayload as exc:
            raise click.UsageError(f"{type(exc).__name__}: {_one_line(self, exc)}",
                                   ctx=self) from None


def _in_command_contexts(command: click.Command) -> click.Command:
    """``command`` (and each subcommand of a group) run in a :class:`CommandContext`."""
    command.context_class = CommandContext
    for sub in getattr(command, "commands", {}).values():
        _in_command_contexts(sub)
    return command


class TerretGroup(click.Group):
    """Every error is one line on stderr, ``Error: <Type>: <message>``: Terret's typed errors
    (exit 1), click's usage errors (exit 2, with click's usage hint above the line), an unknown
    projection (``KeyError``, exit 1), a declined confirmation (``Aborted``, exit 1) and any
    other exception of the code the command ran — an app's summarizer, titler, provider or tool
    (exit 1; its traceback is logged with ``-v``). A message over several lines is joined into
    one; control characters in it are shown escaped. With ``--json`` the error is also printed
    on stdout as ``{"error": {"type", "message", "exit_code"}}``. ``KeyboardInterrupt`` and
    ``SystemExit`` are not errors of the command: they go through as they are."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if ctx.parent is None:
            args = _hoist_json(list(args))
        return super().parse_args(ctx, args)

    # --- commands, imported when used ---------------------------------------------------------

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(COMMANDS) | set(self.commands))

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        super().add_command(_in_command_contexts(cmd), name)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            self.load(COMMANDS[cmd_name][0])
        return self.commands.get(cmd_name)

    def load(self, module: str) -> None:
        import importlib

        importlib.import_module(f"terret.cli.{module}").register(self)

    def load_all(self) -> MutableMapping[str, click.Command]:
        """Every command, its module imported (the docs tests walk them all)."""
        for module in sorted({m for m, _ in COMMANDS.values()}):
            self.load(module)
        return self.commands

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """``terret --help``'s list, from ``COMMANDS``: no command module is imported."""
        rows = [(name, self.commands[name].get_short_help_str(45) if name in self.commands
                 else COMMANDS[name][1]) for name in self.list_commands(ctx)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except InvalidStoreURI as exc:
            raise click.BadParameter(_one_line(ctx, exc), ctx=ctx,
                                     param_hint="'--store'") from None
        except InvalidPayload as exc:  # outside a command (CommandContext): still usage
            raise click.UsageError(f"{type(exc).__name__}: {_one_line(ctx, exc)}") from None
        except TerretError as exc:
            raise DomainFailure(f"{type(exc).__name__}: {_one_line(ctx, exc)}",
                                json_lines=ctx.invoked_subcommand in JSON_LINES) from None
        except KeyError as exc:
            raise click.ClickException(
                f"KeyError: {exc.args[0] if exc.args else exc}") from None
        except Exception as exc:  # the code the command ran: an app's summarizer, a provider
            if isinstance(exc, OSError) and exc.errno == errno.EPIPE and _stdout_gone():
                _reader_left()
            if _click_handles(exc):
                raise
            _log_traceback(ctx, exc)
            raise DomainFailure(f"{type(exc).__name__}: {_one_line(ctx, exc)}",
                                json_lines=ctx.invoked_subcommand in JSON_LINES) from None

    def main(self, args: Any = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True,
             **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, **extra)
        argv = list(sys.argv[1:] if args is None else args)
        try:
            code = super().main(args, prog_name, complete_var, False, **extra)
        except click.exceptions.NoArgsIsHelpError as exc:  # a group without its command
            exc.show()  # its help: what the group's commands are
            typed = "UsageError: Missing command."
            click.echo(f"Error: {typed}", err=True)
            _json_error(argv, typed, exc.exit_code)
            sys.exit(exc.exit_code)
        except click.ClickException as exc:
            typed = printable(" ".join(cut_quotes(exc.format_message()).split()))
            if not TYPED.match(typed):
                typed = f"{type(exc).__name__}: {typed}"
            if isinstance(exc, click.UsageError):
                click.UsageError(typed, ctx=exc.ctx).show()  # click's usage hint, then the line
            else:
                click.ClickException(typed).show()
            _json_error(argv, typed, exc.exit_code,
                        one_line=(isinstance(exc, DomainFailure) and exc.json_lines)
                        or _json_lines_command(exc))
            sys.exit(exc.exit_code)
        except click.Abort:
            typed = "Aborted: not confirmed, or interrupted"
            click.echo(f"Error: {typed}", err=True)
            _json_error(argv, typed, 1)
            sys.exit(1)
        try:
            sys.stdout.flush()  # the reader may have left while the last lines waited here
        except BrokenPipeError:
            _reader_left()
        sys.exit(code if isinstance(code, int) else 0)


QUOTED = re.compile(rf"""(?<!\w)(['"])([^'"\n]{{{SHOWN_MAX + 1},}})\1(?!\w)""")


def cut_quotes(message: str) -> str:
    """Every quoted value in an error message cut as ``shown`` cuts it — also those quoted by
    a library underneath (a module name, a URI, a spec inside the resolver's refusal)."""
    def cut(found: re.Match[str]) -> str:
        quote, text = found.group(1), found.group(2)
        return f"{quote}{text[:SHOWN_MAX - 2]}… ({len(text)} characters)"

    return LONG_WORD.sub(_cut_word, QUOTED.sub(cut, message))


LONG_WORD = re.compile(r"\S{201,}")
"""A word no message needs whole — a path or a store address, given unquoted, of hundreds or
thousands of characters: it keeps its start and its end (a file's name), and says its length."""


def _cut_word(found: re.Match[str]) -> str:
    word = found.group()
    return f"{word[:120]}…{word[-60:]} ({len(word)} characters)"


class DomainFailure(click.ClickException):
    """A Terret error ending a command (exit 1); ``json_lines`` when the command's ``--json``
    output was JSON Lines, so that its error document is one more line."""

    def __init__(self, message: str, *, json_lines: bool = False) -> None:
        super().__init__(message)
        self.json_lines = json_lines


def _json_error(argv: list[str], typed: str, code: int, *, one_line: bool = False) -> None:
    """With ``--json``, the error as a JSON document on stdout too (scripts read one place);
    on one line after JSON Lines — unless stdout's reader has left (the exit code says it)."""
    if _wants_json(argv):
        kind, _, message = typed.partition(": ")
        try:
            click.echo(json.dumps({"error": {"exit_code": code, "message": message,
                                             "type": kind}},
                                  indent=None if one_line else 2, sort_keys=True))
        except BrokenPipeError:
            _stdout_to_nowhere()


def _json_lines_command(exc: click.ClickException) -> bool:
    """A usage error of a command whose ``--json`` output is JSON Lines: one line too."""
    ctx = getattr(exc, "ctx", None)
    return ctx is not None and ctx.command.name in JSON_LINES


def _click_handles(exc: Exception) -> bool:
    """What click's ``main`` says itself: its exceptions (``Abort`` and ``Exit`` are
    runtime errors) and the end of the input (``Aborted``)."""
    return isinstance(exc, click.ClickException | click.Abort | click.exceptions.Exit
                      | EOFError)


def _reader_left() -> NoReturn:
    """stdout's reader closed the pipe (``terret log | head``, ``log --follow | grep -m1``):
    it read what it wanted, so the command ends quietly with exit 0 — whether its output
    outgrew the pipe's buffer before the reader left (click's own exit 1, without a word, came
    or not by that chance)."""
    _stdout_to_nowhere()
    sys.exit(0)


def _stdout_to_nowhere() -> None:
    """What is left unwritten on a closed stdout goes nowhere: Python's flush at exit would
    meet the closed pipe again (and print a traceback)."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # no file descriptor (a test's stream)
        pass


def _stdout_gone() -> bool:
    """Whether stdout is a pipe its reader has closed: an EPIPE from anything else — an
    app's socket, a child process's stdin — is the command's error, said as any other."""
    import select

    try:
        fd = sys.stdout.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (OSError, ValueError, AttributeError):  # no file descriptor (a test's stream)
        return False


def _log_traceback(ctx: click.Context, exc: Exception) -> None:
    """With ``-v``, the traceback of an error that is not Terret's (an app's code raised it),
    logged above its one line: where it was raised is what the app's author needs."""
    if isinstance(ctx.obj, CliContext) and ctx.obj.log is None:  # no WarningLines: -v
        import logging
        import traceback

        # Formatted here, not by the handler, so that the store URI's credentials are masked
        # in it as in the one line (the app's error may quote the URI it was given).
        text = "".join(traceback.format_exception(exc)).rstrip()
        logging.getLogger("terret.cli").info("the error below was raised here:\n%s",
                                             _masked(ctx, text))


def _one_line(ctx: click.Context, exc: Exception) -> str:
    """The error's message on one line (gRPC errors span several), credentials masked."""
    return _masked(ctx, " ".join(str(exc).split()))


def _masked(ctx: click.Context, text: str) -> str:
    """``text`` with the store URI's credentials masked wherever it quotes the URI."""
    uri = ctx.obj.store_uri if isinstance(ctx.obj, CliContext) else ""
    if not uri:
        return text
    from terret.adapters.stores.uri import mask_credentials

    return text.replace(uri, mask_credentials(uri))


def _not_empty(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """An empty ``--store``/``--views`` is a usage error, not the default in disguise."""
    if value is not None and not value.strip():
        raise click.BadParameter("an empty value; leave the option out for the default")
    return value


@click.group(cls=TerretGroup)
@click.option("--store", "store_uri", envvar="TERRET_STORE", default=DEFAULT_STORE,
              show_default=True, metavar="URI", callback=_not_empty,
              help="Event store: a SQLite file path, sqlite:///path, memory:, or "
                   "esdb://host:port?… / esdb+discover://… (env TERRET_STORE).")
@click.option("--views", "views_path", envvar="TERRET_VIEWS", default=None, metavar="PATH",
              callback=_not_empty,
              help="SQLite file for the projections' views (default: beside the store, "
                   "x.views.db for x.db; terret-views.db here for EventStoreDB; env "
                   "TERRET_VIEWS).")
@click.option("--store-timeout", "store_timeout", envvar="TERRET_STORE_TIMEOUT",
              type=FloatRange(min=0.1, max=MAX_SECONDS), default=None, metavar="SECONDS",
              help="How long an unreachable EventStoreDB is retried before the command fails "
                   "(default 10, at least 0.1; env TERRET_STORE_TIMEOUT).")
@click.option("--json", "json_output", is_flag=True, help="Machine-readable JSON output.")
@click.option("--extensions", "extensions", envvar="TERRET_EXTENSIONS", default=None,
              metavar="MODULES",
              help="Comma-separated modules to import first: your extension events register "
                   "there (env TERRET_EXTENSIONS).")
@click.option("-v", "--verbose", is_flag=True,
              help="Log lifecycle transitions to stderr, and every log record as it is (time, "
                   "logger, message); without it, warnings are `warning:` lines.")
@click.version_option(__version__, package_name="terret")  # no metadata lookup
@click.pass_context
def cli(ctx: click.Context, store_uri: str, views_path: str | None,
        store_timeout: float | None, json_output: bool, extensions: str | None,
        verbose: bool) -> None:
    """Terret: long-lived LLM agent sessions on an event store.

    Every step, tool call, approval, compaction, title and cost figure is an event in a
    durable per-session log; the store is the bus, so a command here acts on a session served
    by another process. Start with `terret demo`.
    """
    log = _logging(verbose)
    if extensions:
        from terret.cli._extensions import import_extensions

        import_extensions(extensions)
    if os.environ.get("NO_COLOR"):  # https://no-color.org: off even on a terminal
        ctx.color = False
    ctx.obj = CliContext(store_uri, views_path, json_output, store_timeout=store_timeout,
                         log=log)
    if log is not None:
        ctx.call_on_close(log.remove)  # last: what closing logs is said too
    ctx.call_on_close(ctx.obj.close)


def _logging(verbose: bool) -> WarningLines | None:
    """With ``-v``, log records (INFO and above) as they are, with their time and logger; else
    WARNING and above as ``warning: …`` lines, as the command's other notes."""
    if verbose:
        import logging

        from terret.cli._format import PrintableFormatter

        logging.basicConfig(level=logging.INFO)
        for handler in logging.getLogger().handlers:
            handler.setFormatter(PrintableFormatter("%(asctime)s %(name)s %(message)s"))
        return None
    log = WarningLines()
    log.install()
    return log


def main() -> None:
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    # gRPC's core logs to stderr on its own (a failed TLS handshake, a server's GOAWAY): the
    # command says what failed in its one `Error:` line. Set it yourself to see them.
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    if not _runs_app_code(sys.argv[1:]):
        # Pydantic's plugin discovery scans every installed package's entry points when the
        # first payload validator is built (~15 ms of an everyday command's start-up). The
        # plugins instrument an application's validation: commands that run none of its code
        # (no app) skip them. Set it yourself to have them.
        os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    cli(prog_name="terret")


APP_COMMANDS = frozenset({"serve", "resume", "compact", "chat", "demo"})
"""The commands that run an application's code (``--app``, or the demo's)."""


def _runs_app_code(argv: list[str]) -> bool:
    return bool(APP_COMMANDS.intersection(argv)) or any(
        a == "--app" or a.startswith("--app=") for a in argv) or bool(os.environ.get("TERRET_APP"))
