"""Modules the command line imports before it reads a log: an application's extension events
(``@event_type`` classes and their upcasters) register when their module is imported, and a
command that loads no app (``log``, ``events``, ``projections``, ``doctor``) imports them only
when told to (``--extensions`` / ``TERRET_EXTENSIONS``)."""

from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType

import click

from terret.domain.errors import shown


class ModuleExited(Exception):
    """A user's module called ``sys.exit`` while it was imported (or its app built): a module
    that cannot be loaded, not the end of the command (which would exit as if it had run)."""


def import_from_cwd(name: str) -> ModuleType:
    """Import ``name`` as Python would from the working directory. The ``terret`` entry point's
    ``sys.path[0]`` is its bin directory, not the working directory: put the latter first, so
    a module next to where the command runs is found."""
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        return importlib.import_module(name)
    except SystemExit as exc:
        raise ModuleExited(f"it called sys.exit({exc.code!r})") from None


def import_extensions(modules: str | None) -> list[str]:
    """Import each module of the comma-separated ``modules`` (a usage error if one fails);
    returns their names."""
    names = [name.strip() for name in (modules or "").split(",") if name.strip()]
    for name in names:
        try:
            import_from_cwd(name)
        except Exception as exc:  # noqa: BLE001 - whatever the module raised, said in one line
            raise click.BadParameter(f"cannot import {shown(name)}: {type(exc).__name__}: "
                                     f"{exc}", param_hint="'--extensions'") from None
    return names
