"""docs/events.md must describe ``terret.catalogue`` exactly: every builtin wire name once, its
version and flags, and each payload field's name, optionality and type. The nested parts too."""

from __future__ import annotations

import re
import types
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import pytest
from pydantic import BaseModel

from terret.domain.catalogue import EventPayload, catalogue

DOC = Path(__file__).resolve().parents[2] / "docs" / "events.md"
SPAN = re.compile(r"`([^`]+)`")


def render_type(annotation: Any) -> str:
    """The notation the doc uses (explained in its "Types used below" section)."""
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        return " or ".join(
            render_type(a) for a in get_args(annotation) if a is not type(None)
        )
    if origin is Literal:
        return "enum(" + ", ".join(str(a) for a in get_args(annotation)) + ")"
    if origin is list:
        return "[" + render_type(get_args(annotation)[0]) + "]"
    if origin is dict:
        key, value = get_args(annotation)
        return "{" + render_type(key) + ": " + render_type(value) + "}"
    if annotation is Any:
        return "any"
    if isinstance(annotation, type):
        return annotation.__name__
    raise TypeError(f"no doc notation for {annotation!r}")


def render_fields(model: type[BaseModel]) -> list[str]:
    return [
        f"{name}{'' if info.is_required() else '?'}: {render_type(info.annotation)}"
        for name, info in model.model_fields.items()
    ]


def nested_parts(model: type[BaseModel]) -> set[type[BaseModel]]:
    found: set[type[BaseModel]] = set()
    pending = [info.annotation for info in model.model_fields.values()]
    while pending:
        annotation = pending.pop()
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            if annotation not in found:
                found.add(annotation)
                pending.extend(i.annotation for i in annotation.model_fields.values())
        else:
            pending.extend(get_args(annotation))
    return found


def table(section: str) -> list[list[str]]:
    """The body rows of the first table under ``## <section>``, split into cells."""
    text = DOC.read_text(encoding="utf-8")
    match = re.search(rf"^## {re.escape(section)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"docs/events.md has no '## {section}' section"
    rows = [line for line in match.group(1).splitlines() if line.startswith("|")]
    assert len(rows) > 2, f"no table under '## {section}'"
    return [[cell.strip() for cell in row.strip().strip("|").split("|")] for row in rows[2:]]


def builtins() -> dict[str, type[EventPayload]]:
    return {cls.wire_name: cls for cls in catalogue if catalogue.is_builtin(cls.wire_name)}


def catalogue_rows() -> dict[str, list[str]]:
    rows: dict[str, list[str]] = {}
    for cells in table("Catalogue"):
        names = SPAN.findall(cells[0])
        assert len(names) == 1, f"one wire name per row: {cells[0]!r}"
        assert names[0] not in rows, f"{names[0]} is listed twice"
        rows[names[0]] = cells
    return rows


def test_every_builtin_event_is_listed_once_and_nothing_else() -> None:
    assert sorted(catalogue_rows()) == sorted(builtins())


@pytest.mark.parametrize("wire_name", sorted(builtins()))
def test_version_flags_and_fields_match(wire_name: str) -> None:
    cls = builtins()[wire_name]
    cells = catalogue_rows()[wire_name]
    assert len(cells) == 6, cells
    _, version, visible, commutative, fields, _notes = cells
    assert int(version) == cls.version, f"{wire_name}: version"
    assert visible == ("yes" if cls.model_visible else "no"), f"{wire_name}: model-visible"
    assert commutative == ("yes" if cls.commutative else "no"), f"{wire_name}: commutative"
    assert SPAN.findall(fields) == render_fields(cls), f"{wire_name}: payload fields"


def test_nested_parts_are_described() -> None:
    documented = {SPAN.findall(cells[0])[0]: SPAN.findall(cells[1]) for cells in table("Parts")}
    parts = set().union(*(nested_parts(cls) for cls in builtins().values()))
    assert sorted(documented) == sorted(p.__name__ for p in parts)
    for part in parts:
        assert documented[part.__name__] == render_fields(part), part.__name__


def test_the_checker_notices_a_wrong_doc() -> None:
    """The notation is strict enough to catch the usual slips."""
    from terret.domain.events import StepEnded, TurnEnded

    assert render_fields(StepEnded) == ["turn: int", "step: int", "usage?: UsageData",
                                        "resumed?: bool"]
    assert "status: enum(completed, cancelled, rejected, empty, failed)" in render_fields(
        TurnEnded
    )
    assert "usage: UsageData" not in render_fields(StepEnded)  # optionality is checked
