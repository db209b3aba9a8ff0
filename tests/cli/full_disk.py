"""Run ``terret`` as if the disk holding the store were full: every SQLite connection to the file
named by ``TERRET_TEST_FULL_DB`` is capped at the file's current size (``PRAGMA
max_page_count``), so a write that needs a new page fails with SQLITE_FULL, the error a full
disk gives. ``python -m tests.cli.full_disk --store … COMMAND …``."""

from __future__ import annotations

import os
import sqlite3
import sys
from typing import Any
from urllib.parse import unquote, urlsplit

TARGET = os.path.realpath(os.environ["TERRET_TEST_FULL_DB"])
_connect = sqlite3.connect


def _path(database: Any) -> str | None:
    """The file a connection opens: a path, or a ``file:`` URI's (the store opens its file so)."""
    if not isinstance(database, str):
        return None
    if database.startswith("file:"):
        return os.path.realpath(unquote(urlsplit(database).path))
    return os.path.realpath(database)


def _capped(database: Any, *args: Any, **kwargs: Any) -> sqlite3.Connection:
    conn = _connect(database, *args, **kwargs)
    if _path(database) == TARGET:
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        conn.execute(f"PRAGMA max_page_count = {pages}")
    return conn


sqlite3.connect = _capped  # type: ignore[assignment]

if __name__ == "__main__":
    from terret.cli import main

    sys.argv[0] = "terret"
    main()
