"""Custom projections registered in the process, as extension events are in the catalogue:
the module that defines one registers it (``@terret.register_projection``), and every process
that imports the module — a ``Runtime``, ``terret serve --app``, a CLI command given
``--extensions`` — maintains, checks, rebuilds and skips it beside Terret's own."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, TypeVar

from terret._sqlite_files import sql_statements
from terret.domain.errors import ConfigurationError, shown
from terret.projections._view_store import VIEW_SCHEMA, table_clash
from terret.projections.base import Projection

if TYPE_CHECKING:
    import sqlite3

P = TypeVar("P", bound=type[Projection])

_registered: dict[str, type[Projection]] = {}


def register_projection(cls: P) -> P:
    """Class decorator: maintain the projection ``cls`` in every runner of this process that
    serves the views (the runtime's, the CLI's) beside Terret's built-in ones.

    ``ConfigurationError`` when ``cls`` is not a ``Projection`` subclass that can be built
    with no arguments (``verify`` builds a fresh one), has no ``name``, takes a name already
    taken by a built-in projection or another class, or claims a table another projection
    (or the view store itself) has. Registering the same class again does
    nothing (a module imported twice); the class of a module reloaded replaces it."""
    if not isinstance(cls, type) or not issubclass(cls, Projection):
        raise ConfigurationError(f"register_projection takes a Projection subclass, not "
                                 f"{shown(cls)}")
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name.strip():
        raise ConfigurationError(f"projection {cls.__qualname__} has no name (a class "
                                 "attribute, unique among the runner's projections)")
    if name in _builtin_names():
        raise ConfigurationError(f"projection name {name!r} is a built-in projection's")
    taken = _registered.get(name)
    if taken is not None and taken is not cls and not _reloaded(taken, cls):
        raise ConfigurationError(f"projection name {name!r} is taken by "
                                 f"{taken.__module__}.{taken.__qualname__}")
    try:
        cls()
    except Exception as exc:
        raise ConfigurationError(f"projection {name!r} cannot be built with no arguments "
                                 f"(verify builds a fresh copy): {type(exc).__name__}: {exc}"
                                 ) from exc
    others = [c() for n, c in _registered.items() if n != name]
    clash = table_clash([*_builtin(), *others, cls()])
    if clash is not None:
        raise ConfigurationError(clash)
    _check_version_and_schema(cls, name, [*_builtin(), *others])
    _registered[name] = cls
    return cls


def _reloaded(taken: type, cls: type) -> bool:
    """Whether ``cls`` is ``taken`` defined again by its module reloaded (``importlib.reload``,
    a notebook cell run again): the same module and name, which the module holds — the class
    registered, until the reloaded statement binds the new one (the decorator runs first) —
    not a class made in a function or under a name the module does not hold."""
    if (taken.__module__, taken.__qualname__) != (cls.__module__, cls.__qualname__) \
            or "<locals>" in cls.__qualname__:
        return False
    module = sys.modules.get(cls.__module__)
    held: object = module
    for part in cls.__qualname__.split("."):
        held = getattr(held, part, None)
    return held is taken or held is cls


def _check_version_and_schema(cls: type[Projection], name: str,
                              others: Sequence[Projection]) -> None:
    """A version that is not a whole number from 1 broke every command later (a format error,
    a comparison with the stored one); a schema that does not run failed every command given
    the module, naming no projection; one that creates a table it does not declare in
    ``tables`` escaped the check of who owns which table, and one that dropped, altered or
    wrote ``others`` (the tables of the other projections and of the view store) broke their
    views unseen, as one that attached another file wrote outside the views. All of it is
    tried here, on a scratch database made as the views file is (``others``' schemas),
    watched by SQLite's authorizer."""
    version = getattr(cls, "version", None)
    if type(version) is not int or version < 1:
        raise ConfigurationError(f"projection {name!r}: version is a whole number from 1, not "
                                 f"{shown(version)}")
    schema, tables = getattr(cls, "schema", None), getattr(cls, "tables", None)
    if not isinstance(schema, str) or not isinstance(tables, tuple | list) or not all(
            isinstance(t, str) for t in tables):
        raise ConfigurationError(f"projection {name!r}: schema is a string of CREATE "
                                 "statements and tables a tuple of the table names it creates")
    made = _tried(schema, set(tables), others, name)
    undeclared = sorted(made - set(tables))
    if undeclared:
        raise ConfigurationError(f"projection {name!r}: its schema creates "
                                 f"{', '.join(map(repr, undeclared))}, which tables does not "
                                 "declare (each table a projection writes is declared: a "
                                 "rebuild drops them, no other projection may have them)")


def _tried(schema: str, tables: set[str], others: Sequence[Projection], name: str
           ) -> set[str]:
    """Run ``schema`` on a scratch database made as the views file is — the view store's own
    tables and ``others``' schemas — as it will run: statement by statement inside a
    transaction (a reset's), SQLite's authorizer refusing what touches anything but
    ``tables`` (and temporary tables of its own); then the triggers it made on its tables are
    compiled under the same watch (what their bodies write). The tables it made, or
    ``ConfigurationError``."""
    import sqlite3

    scratch = sqlite3.connect(":memory:")
    watch = _OwnTablesOnly(tables)
    try:
        for other in (VIEW_SCHEMA, *(p.schema for p in others)):
            for statement in sql_statements(other):
                scratch.execute(statement)
        before = {row[0] for row in scratch.execute("SELECT name FROM sqlite_master")}
        scratch.set_authorizer(watch)
        scratch.execute("BEGIN")
        for statement in sql_statements(schema):
            scratch.execute(statement)
            if not scratch.in_transaction:  # checked at each: COMMIT; BEGIN; … ends it too
                raise sqlite3.OperationalError("it ends the transaction it runs in (COMMIT, "
                                               "END or ROLLBACK)")
        _compile_triggers(scratch, tables, watch)
        scratch.set_authorizer(None)
        made = {row[0] for row in scratch.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'")} - before
    except sqlite3.Error as exc:
        if watch.refused:
            raise ConfigurationError(f"projection {name!r}: its schema {watch.refused[0]}: a "
                                     "projection's schema makes its own tables (their indexes, "
                                     "triggers and rows) only") from None
        raise ConfigurationError(f"projection {name!r}: its schema does not run: {exc}") from None
    finally:
        scratch.close()
    return {t for t in made if not t.startswith("sqlite_")}  # AUTOINCREMENT's sqlite_sequence


def _compile_triggers(db: sqlite3.Connection, tables: set[str], watch: _OwnTablesOnly
                      ) -> None:
    """Compile a write to each of ``tables`` that has a trigger (``EXPLAIN``: nothing runs)
    under ``watch``, so that it sees what the triggers' bodies would write."""
    db.set_authorizer(None)  # reading the catalogue and the columns is no schema's doing
    triggered = {row[0] for row in db.execute(
        "SELECT tbl_name FROM sqlite_master WHERE type = 'trigger'")} & tables
    writes = []
    for table in sorted(triggered):
        quoted = '"' + table.replace('"', '""') + '"'
        column = db.execute("SELECT name FROM pragma_table_info(?)", (table,)).fetchone()
        writes += [f"INSERT INTO {quoted} DEFAULT VALUES", f"DELETE FROM {quoted}"]
        if column is not None:
            name = '"' + str(column[0]).replace('"', '""') + '"'
            writes.append(f"UPDATE {quoted} SET {name} = {name}")
    db.set_authorizer(watch)
    for write in writes:
        db.execute(f"EXPLAIN {write}")


class _OwnTablesOnly:
    """SQLite's authorizer for a schema's trial: what the schema does to its own tables, to
    temporary tables it makes and to SQLite's catalogue (which every CREATE writes) is
    allowed; attaching a file, setting a pragma, and making or changing any other table is
    denied, and said in ``refused``."""

    def __init__(self, own: set[str]) -> None:
        self.own = own
        self.temps: set[str] = set()
        self.refused: list[str] = []

    def __call__(self, action: int, arg1: str | None, arg2: str | None,
                 database: str | None, trigger: str | None) -> int:
        import sqlite3

        if action in (sqlite3.SQLITE_ATTACH, sqlite3.SQLITE_DETACH) or (
                action == sqlite3.SQLITE_PRAGMA and arg2 is not None):
            self.refused.append(f"sets a pragma ({arg1})" if action == sqlite3.SQLITE_PRAGMA
                                else "attaches or detaches a database")
            return sqlite3.SQLITE_DENY
        if action == sqlite3.SQLITE_CREATE_TEMP_TABLE and arg1 is not None:
            self.temps.add(arg1)
            return sqlite3.SQLITE_OK
        table = _TABLE_ARG.get(action)
        if table is None:
            return sqlite3.SQLITE_OK
        name = arg1 if table == 1 else arg2
        if name is None or name in self.own or name in self.temps or name.startswith("sqlite_"):
            return sqlite3.SQLITE_OK
        self.refused.append(
            f"creates {name!r}, which tables does not declare (each table a projection writes "
            "is declared: a rebuild drops them, no other projection may have them)"
            if action == sqlite3.SQLITE_CREATE_TABLE
            else f"changes table {name!r}, which is not its own")
        return sqlite3.SQLITE_DENY


def _table_args() -> dict[int, int]:
    """Which argument of each authorizer action that makes or changes a table names it."""
    import sqlite3 as q

    return {q.SQLITE_CREATE_TABLE: 1, q.SQLITE_DROP_TABLE: 1, q.SQLITE_DROP_TEMP_TABLE: 1,
            q.SQLITE_INSERT: 1, q.SQLITE_UPDATE: 1, q.SQLITE_DELETE: 1,
            q.SQLITE_ALTER_TABLE: 2, q.SQLITE_CREATE_INDEX: 2, q.SQLITE_DROP_INDEX: 2,
            q.SQLITE_CREATE_TEMP_INDEX: 2, q.SQLITE_DROP_TEMP_INDEX: 2,
            q.SQLITE_CREATE_TRIGGER: 2, q.SQLITE_DROP_TRIGGER: 2,
            q.SQLITE_CREATE_TEMP_TRIGGER: 2, q.SQLITE_DROP_TEMP_TRIGGER: 2}


_TABLE_ARG = _table_args()


def unregister_projection(name: str) -> None:
    """Forget a registered projection (tests; a plugin unloaded). Its view stays in the views
    file until rebuilt; unknown names are ignored."""
    _registered.pop(name, None)


def registered_projections() -> list[Projection]:
    """A fresh instance of each registered projection, in the order they were registered."""
    return [cls() for cls in _registered.values()]


def serving_projections() -> list[Projection]:
    """What a runner serving the views maintains: Terret's projections, then the registered
    ones."""
    from terret.projections.views import default_projections

    return [*default_projections(), *registered_projections()]


def _builtin() -> list[Projection]:
    from terret.projections.views import default_projections

    return default_projections()


def _builtin_names() -> set[str]:
    return {p.name for p in _builtin()}
