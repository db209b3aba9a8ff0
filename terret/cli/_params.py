"""Parameter types for the command line's text: the domain's rules, checked while the command
line is parsed, so a bad value is a usage error (exit 2) before the store is even opened.

Bytes that are not UTF-8 in an argument reach Python as lone surrogates (``surrogateescape``);
stored text is UTF-8, so they are refused here as the domain refuses them (``InvalidPayload``).
Values quoted in messages are cut short (``terret.domain.errors.shown``). The domain's rules are
imported when a value needs them, so parsing a command line loads nothing heavy.
"""

from __future__ import annotations

import math
from typing import Any

import click
from click.types import StringParamType

from terret.domain.errors import shown


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


class SecondsType(click.ParamType):
    """A duration in seconds: a finite number above 0 (``nan`` and ``inf`` are not)."""

    name = "SECONDS"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> float:
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            self.fail(f"{shown(value)} is not a number of seconds", param, ctx)
        if not math.isfinite(seconds) or seconds <= 0:
            self.fail(f"{shown(value)} is not a finite number of seconds above 0", param, ctx)
        return seconds


TEXT = TextType()
AGENT_NAME = AgentNameType()
PATTERN = PatternType()
SECONDS = SecondsType()
