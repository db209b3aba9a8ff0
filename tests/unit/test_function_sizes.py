"""No function in ``terret/`` is longer than 40 lines, or more complex than ruff's C901 allows
(mccabe 10), without saying why (docs/architecture.md §5, "Function size").

- Length, from the ``def`` line to the last line of the body: a longer function carries a
  comment ``# Long because <why splitting would not help>`` in its header, between the ``def``
  line and its first statement after the docstring.
- Complexity is ruff's to check (C901); a ``# noqa: C901`` is followed on its line by
  `` — <why>`` (or `` - <why>``, as the other noqa comments here).
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "terret"
MAX_LINES = 40
WHY = re.compile(r"#\s*Long because\s+\S+(\s+\S+){2,}")
"""The why-comment: ``# Long because`` and at least three words of reason."""
NOQA = re.compile(r"#\s*noqa:[^#\n]*\bC901\b(?P<rest>.*)")
NOQA_WHY = re.compile(r"\s+[—-]\s+\S+(\s+\S+)+")
"""After ``# noqa: C901``: a dash and at least two words of reason."""
Function = ast.FunctionDef | ast.AsyncFunctionDef


def _sources() -> Iterator[tuple[str, str]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path.relative_to(ROOT).as_posix(), path.read_text(encoding="utf-8")


def _comments(source: str) -> dict[int, str]:
    """Each line's comment, by line number."""
    found: dict[int, str] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            found[token.start[0]] = token.string
    return found


def _functions(tree: ast.AST, prefix: str = "") -> Iterator[tuple[str, Function]]:
    """Every function and method, nested ones included, with its qualified name."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            name = prefix + node.name
            yield name, node
            yield from _functions(node, name + ".")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, prefix + node.name + ".")
        else:
            yield from _functions(node, prefix)


def _header(node: Function) -> range:
    """The lines from ``def`` to the first statement after the docstring (excluded)."""
    body = node.body
    first = body[0]
    if (len(body) > 1 and isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
            and isinstance(first.value.value, str)):
        first = body[1]
    return range(node.lineno, first.lineno)


def _long_functions() -> Iterator[tuple[str, str, int, int, bool]]:
    """``(path, qualified name, def line, lines, has a why-comment)`` of each function over
    the limit."""
    for path, source in _sources():
        comments = _comments(source)
        for name, node in _functions(ast.parse(source, path)):
            assert node.end_lineno is not None
            lines = node.end_lineno - node.lineno + 1
            if lines > MAX_LINES:
                why = any(WHY.match(comments.get(n, "")) for n in _header(node))
                yield path, name, node.lineno, lines, why


def test_long_functions_say_why() -> None:
    unexplained = [
        f"{path}:{line} {name} ({lines} lines)"
        for path, name, line, lines, why in _long_functions()
        if not why
    ]
    assert not unexplained, (
        f"functions over {MAX_LINES} lines without a `# Long because <why>` comment in their "
        "header (split them, or say why they are better whole):\n  " + "\n  ".join(unexplained)
    )


def test_every_noqa_c901_says_why() -> None:
    bare = []
    for path, source in _sources():
        for line, comment in _comments(source).items():
            match = NOQA.search(comment)
            if match and not NOQA_WHY.match(match["rest"]):
                bare.append(f"{path}:{line} {comment}")
    assert not bare, (
        "a `# noqa: C901` is followed by ` — <why>` on its line (two words at least):\n  "
        + "\n  ".join(bare)
    )


def test_the_checks_see_what_they_look_for() -> None:
    """The checks themselves: a long function with and without its comment, a bare and an
    explained noqa."""
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    source = (f'def bare():\n    """Doc."""\n{body}\n\n'
              f"def kept():\n    # Long because a table reads best in one piece\n{body}\n\n"
              f"def nested():\n    def inner():\n{body.replace('    ', '        ')}\n"
              f"    return inner\n")
    comments = _comments(source)
    found = {name: any(WHY.match(comments.get(n, "")) for n in _header(node))
             for name, node in _functions(ast.parse(source))
             if (node.end_lineno or 0) - node.lineno + 1 > MAX_LINES}
    assert found == {"bare": False, "kept": True, "nested": False, "nested.inner": False}
    explained = NOQA.search("# noqa: C901 — one branch per wire state")
    assert explained and NOQA_WHY.match(explained["rest"])
    bare = NOQA.search("# noqa: C901")
    assert bare and not NOQA_WHY.match(bare["rest"])
    terse = NOQA.search("# noqa: C901 - ok")
    assert terse and not NOQA_WHY.match(terse["rest"])
    assert NOQA.search("# noqa: E501, C901") and not NOQA.search("# noqa: C9010")
