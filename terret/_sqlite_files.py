"""Looking into a SQLite file without changing it, before Terret writes to it: the store and the
views each refuse a file that holds something else, and must leave it exactly as it was."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path


def open_read_only(path: str, timeout: float = 30.0) -> sqlite3.Connection | None:
    """A read-only connection to the file at ``path`` (no table added, no journal mode
    changed, no ``-wal`` created); None when it is missing or empty, or cannot be opened (the
    caller's own open then tells what is wrong)."""
    try:
        if os.path.getsize(path) == 0:
            return None
    except OSError:
        return None
    try:
        return sqlite3.connect(f"{Path(path).as_uri()}?mode=ro", uri=True, timeout=timeout)
    except sqlite3.Error:
        return None


def file_identity(path: str) -> tuple[int, int] | None:
    """The file at ``path`` as the file system knows it (device, inode), or None when there is
    none: a file moved, deleted or replaced under an open connection is another (or none)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def table_names(conn: sqlite3.Connection) -> set[str]:
    """The file's own tables (SQLite's internal ``sqlite_*`` ones left out)."""
    return {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            if not name.startswith("sqlite_")}


def listed(names: set[str]) -> str:
    """A few of the tables, for a message."""
    return ", ".join(sorted(names)[:4]) + (", …" if len(names) > 4 else "")


def rollback(conn: sqlite3.Connection) -> None:
    """Roll back the open transaction, if SQLite has not already (it does on SQLITE_FULL, and
    a ROLLBACK then fails with "no transaction is active", hiding the cause)."""
    if conn.in_transaction:
        try:
            conn.execute("ROLLBACK")
        except sqlite3.Error:
            pass  # the original failure is the one to report


def sql_statements(script: str) -> list[str]:
    """The statements of ``script``, each whole (a trigger's body keeps its ``;``s), to run one
    by one inside a transaction: ``executescript`` commits whatever transaction is open first."""
    statements, pending = [], ""
    for part in script.split(";"):
        pending += part + ";"
        if sqlite3.complete_statement(pending):
            if pending.strip(" \t\r\n;"):
                statements.append(pending)
            pending = ""
    if pending.strip(" \t\r\n;"):
        statements.append(pending)  # incomplete: executing it says what is wrong
    return statements
