"""Parameter types for the command line's text: the domain's rules, checked while the command
line is parsed, so a bad value is a usage error (exit 2) before the store is even opened.

Bytes that are not UTF-8 in an argument reach Python as lone surrogates (``surrogateescape``);
stored text is UTF-8, so they are refused here as the domain refuses them (``InvalidPayload``).
Values quoted in messages are cut short (``terret.domain.errors.shown``). The domain's rules are
imported when a value needs them, so parsing a command line loads nothing heavy.
"""

from __future__ import annotations

import json
import math
import re
import threading
from collections.abc import Callable
from typing import Any

import click
from click.types import StringParamType

from terret.domain.errors import SHOWN_MAX, shown


def text_problem(text: str) -> str | None:
    """Why ``text`` cannot be stored (``terret.domain.catalogue.text_problem``); ASCII always
    can, without loading the catalogue."""
    if text.isascii():
        return None
    from terret.domain.catalogue import text_problem as problem

    return problem(text)


class TextType(StringParamType):
    """Text that can be stored: valid Unicode (no lone surrogate)."""

    name = "text"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        text = super().convert(value, param, ctx)
        problem = text_problem(text) if isinstance(text, str) else None
        if problem is not None:
            self.fail(problem, param, ctx)
        return text


class SearchTextType(TextType):
    """Text to search for: not empty (an empty part would pass every titled session and
    drop every untitled one, which no one asks for)."""

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        text = super().convert(value, param, ctx)
        if isinstance(text, str) and not text.strip():
            self.fail("empty; leave the option out to list every session", param, ctx)
        return text


class AgentNameType(click.ParamType):
    """An agent definition's name, checked as ``session/started`` checks it."""

    name = "NAME"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> str:
        from terret.domain.events import validate_agent_name

        try:
            return validate_agent_name(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class PatternType(click.ParamType):
    """An allow-list pattern, checked as ``policy/updated`` checks it."""

    name = "PATTERN"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> str:
        from terret.domain.events import validate_pattern

        try:
            return validate_pattern(str(value))
        except ValueError as exc:
            problem = text_problem(str(value))
            self.fail(f"invalid pattern {shown(value)}: {problem}" if problem else str(exc),
                      param, ctx)


JSON_LINES = frozenset({"log"})
"""The commands whose ``--json`` output is JSON Lines: an error they end with — before their
first line or after some, a usage error too — is printed as one more line."""

MAX_SECONDS = threading.TIMEOUT_MAX
"""The longest wait the platform can time (about 292 years here): a longer one overflows."""

MAX_INT = 2**63 - 2
"""The largest count or position an option takes: SQLite's integers and Python's sequence
indexes hold it (and one more, for the look-ahead of a page)."""


class SecondsType(click.ParamType):
    """A duration in seconds: a finite number above 0 (``nan`` and ``inf`` are not), at most
    :data:`MAX_SECONDS`."""

    name = "SECONDS"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> float:
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            self.fail(f"{shown(value)} is not a number of seconds", param, ctx)
        if not math.isfinite(seconds) or seconds <= 0:
            self.fail(f"{shown(value)} is not a finite number of seconds above 0", param, ctx)
        if seconds > MAX_SECONDS:
            self.fail(f"{shown(value)} is more seconds than can be waited "
                      f"(at most {MAX_SECONDS:.0f})", param, ctx)
        return seconds


class CutQuotes(click.ParamType):
    """Mixed into click's own types, whose refusals quote the value whole (``repr``): the quote
    is cut as Terret's own messages cut it (``shown``)."""

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        try:
            return super().convert(value, param, ctx)
        except click.BadParameter as exc:
            if not isinstance(value, str) or len(repr(value)) <= SHOWN_MAX:
                raise
            self.fail(exc.message.replace(repr(value), shown(value)), param, ctx)


class IntRange(CutQuotes, click.IntRange):
    """click's, bounded by :data:`MAX_INT` unless a lower ``max`` is given."""

    def __init__(self, min: int | None = None, max: int | None = MAX_INT, **kw: Any) -> None:
        super().__init__(min=min, max=max, **kw)


class FloatRange(CutQuotes, click.FloatRange):
    """click's, refusing what is not a finite number (click's lets ``nan`` through: it
    compares false with every bound)."""

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{shown(value)} is not a finite number", param, ctx)
        return number


class Choice(CutQuotes, click.Choice):  # type: ignore[type-arg]
    pass


class JsonObjectType(TextType):
    """A JSON object given on the command line (``--args '{"env": "prod"}'``)."""

    name = "json"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        if isinstance(value, dict):
            return value
        text = super().convert(value, param, ctx)
        try:
            parsed = json.loads(text, parse_constant=_not_json)
        except ValueError as exc:
            self.fail(f"not JSON: {exc}", param, ctx)
        except RecursionError:
            self.fail("nested too deeply to be a call's arguments", param, ctx)
        if not isinstance(parsed, dict):
            self.fail("a JSON object ({...}), as `approvals list --json` shows a call's args",
                      param, ctx)
        return parsed


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")  # Python's decoder would take NaN and Infinity


TEXT = TextType()
JSON_OBJECT = JsonObjectType()
SEARCH_TEXT = SearchTextType()
AGENT_NAME = AgentNameType()
PATTERN = PatternType()
SECONDS = SecondsType()


NEGATIVE_NUMBER = re.compile(r"-\$?(?:\d|\.\d|inf|nan)", re.IGNORECASE)
"""An argument that is a negative number (``-1``, ``-.5``, ``-$5``, ``-inf``), not an option."""


class NegativeNumbers(click.Command):
    """A command whose arguments may be negative numbers, so that their type refuses them with
    its own reason (``budget set SID -1``: a budget is 0 or more), not ``No such option '-1'``.

    click's documented way to let an argument look like an option is
    ``ignore_unknown_options``; alone, it would also take a misspelt option (``--reasn``) for an
    argument. So the command line is first parsed with its negative numbers masked: an unknown
    option is refused exactly as click refuses it (``NoSuchOption``, with its suggestion), and
    only then is it parsed with ``ignore_unknown_options``, where what is left are the numbers.
    Nothing after ``--`` is looked at (it is arguments anyway)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        end = args.index("--") if "--" in args else len(args)
        masked = ["0" if NEGATIVE_NUMBER.match(a) else a for a in args[:end]] + args[end:]
        parser = self.make_parser(ctx)
        parser.ignore_unknown_options = False
        parser.parse_args(args=masked)  # NoSuchOption for an unknown option; nothing else
        ctx.ignore_unknown_options = True
        return super().parse_args(ctx, args)


Precheck = Callable[[dict[str, Any]], None]


def checked_first(*checks: Precheck) -> Callable[[click.Command], click.Command]:
    """A command whose ``checks`` — of values a parameter type cannot check alone (one that
    must not be blank, an option that needs another, a reason the log cannot hold) — run on
    its parsed values before a session-id prefix is looked up: a bad command line is a usage
    error (exit 2) whether or not the prefix names a session (cli.md, exit codes)."""
    def decorate(command: click.Command) -> click.Command:
        command.prechecks = (*getattr(command, "prechecks", ()), *checks)  # type: ignore[attr-defined]
        return command

    return decorate


def not_blank(name: str, hint: str, message: str) -> Precheck:
    """``name``'s value, when given, is not blank."""
    def check(values: dict[str, Any]) -> None:
        value = values.get(name)
        if value is not None and not value.strip():
            raise click.BadParameter(message, param_hint=hint)

    return check


def recordable_reason(event: str, name: str = "reason") -> Precheck:
    """``name``'s value, when given, is a reason the log can hold in ``event`` (the payload
    class's name: its module is imported only to check one), refused as the domain refuses it
    (``InvalidPayload``: a usage error of the command)."""
    def check(values: dict[str, Any]) -> None:
        from terret.domain import events
        from terret.domain.errors import InvalidPayload

        problem = events.reason_problem(values.get(name))
        if problem is not None:
            raise InvalidPayload(getattr(events, event).wire_name, "reason", problem)

    return check
