"""docs/extending.md is executed: its ``python`` code blocks run in order, in one namespace, in
a scratch directory, so the page cannot drift from the code. The namespace is a module of its
own (``docs_extending``), importable while the page runs, so that the ``eventsourcing``
library can resolve the topics of the classes the page defines; its EventStoreDB section runs
against the emulator (or the real server named by ``TERRET_ESDB_URI``)."""

from __future__ import annotations

import re
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from terret.domain.catalogue import catalogue

DOC = Path(__file__).resolve().parents[2] / "docs" / "extending.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.M | re.S)


def blocks() -> list[str]:
    return BLOCK.findall(DOC.read_text(encoding="utf-8"))


@pytest.fixture
def clean_catalogue() -> Iterator[None]:
    """Whatever the page registers is removed afterwards."""
    before = catalogue.wire_names()
    try:
        yield
    finally:
        for wire_name in catalogue.wire_names() - before:
            catalogue.unregister(wire_name)


def test_the_page_has_examples() -> None:
    assert len(blocks()) >= 6


def test_the_examples_run(
    clean_catalogue: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, esdb_uri: str
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ESDB_URI", esdb_uri)
    module = types.ModuleType("docs_extending")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    namespace = module.__dict__
    for number, source in enumerate(blocks(), start=1):
        code = compile(source, f"{DOC.name} (block {number})", "exec")
        exec(code, namespace)
    assert (tmp_path / "example.db").exists()
    assert (tmp_path / "school.db").exists() and (tmp_path / "school-views.db").exists()
    assert "acme.bookmark/saved" in catalogue
