"""Wire names are referenced through the event classes (``TurnEnded.wire_name``), never as
string literals outside the catalogue: a literal is a rename waiting to be missed."""

from __future__ import annotations

import ast
from pathlib import Path

from terret.domain.catalogue import catalogue

ROOT = Path(__file__).resolve().parents[2] / "terret"

EXCLUDED = (
    "domain/events.py",     # the catalogue: where the wire names are declared
    "domain/catalogue.py",  # the catalogue's entry point
    "domain/payloads.py",   # the catalogue's machinery
    # The store contract suite, owned with the store adapters: to be converted there.
    "testing/",
)


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def literals() -> list[str]:
    names = catalogue.wire_names()
    out = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(EXCLUDED):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docs = _docstrings(tree)
        out.extend(f"terret/{rel}:{node.lineno}: {node.value!r}" for node in ast.walk(tree)
                   if isinstance(node, ast.Constant) and isinstance(node.value, str)
                   and node.value in names and id(node) not in docs)
    return out


def test_no_wire_name_literal_outside_the_catalogue() -> None:
    found = literals()
    assert not found, "use the event class's wire_name:\n" + "\n".join(found)


def test_the_scan_sees_a_literal() -> None:
    tree = ast.parse('x = "turn/end"')
    assert any(isinstance(n, ast.Constant) and n.value in catalogue.wire_names()
               for n in ast.walk(tree))
