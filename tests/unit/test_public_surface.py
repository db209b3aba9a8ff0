"""The package root's public names: every one in ``__all__`` imports, and the names the docs
use at the root or in ``terret.adapters.stores`` are there (a probe found
``EventStoreDBStore``, ``Refusal`` and ``StepClaim`` documented but not exported)."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys

import terret
from tests.runtime.kit import REPO


def test_every_public_name_imports() -> None:
    for name in terret.__all__:
        assert getattr(terret, name) is not None, name
    stores = importlib.import_module("terret.adapters.stores")
    for name in stores.__all__:
        assert getattr(stores, name) is not None, name


def test_root_names_the_docs_use_exist() -> None:
    used: set[str] = set()
    for doc in (REPO / "docs").glob("*.md"):
        used |= set(re.findall(r"\bterret\.([A-Z][A-Za-z]+)\b", doc.read_text()))
    used |= set(re.findall(r"\bterret\.([A-Z][A-Za-z]+)\b", (REPO / "README.md").read_text()))
    missing = sorted(name for name in used if not hasattr(terret, name))
    assert not missing, missing


def test_the_stores_package_loads_grpc_only_for_eventstoredb() -> None:
    code = ("import sys, terret; terret.SQLiteStore; terret.open_store; "
            "assert 'grpc' not in sys.modules; terret.EventStoreDBStore; "
            "assert 'grpc' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
