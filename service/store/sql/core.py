"""The core of the shared SQL: the ``Dialect``, the ``Conn`` a backend supplies, ``Query``,
migrations and the JSON text both backends agree on.

``Query`` is one connection inside an open transaction with the dialect applied; every operation
in the kind modules (``sessions``, ``tickets``, ``tasks``, ``audit``) runs its statements on one,
obtained from ``Unit._unit``. What a unit is decides atomicity: a ``SqlTx`` hands out its own
transaction's query, a ``SqlStore`` opens a fresh transaction per operation.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from importlib import resources
from types import TracebackType
from typing import Any, Protocol

from ... import jsontext, limits
from ..base import MAX_PAGE, CheckedEntry, StoreError

__all__ = [
    "MAX_LIST_LIMIT",
    "Conn",
    "Dialect",
    "Migration",
    "Query",
    "Row",
    "SchemaTooNew",
    "Unit",
    "dump_json",
    "migrations",
    "opt_float",
    "pending_migrations",
]

Row = Mapping[str, Any]

#: The most rows one list call returns (the store contract's page size).
MAX_LIST_LIMIT = MAX_PAGE

# The migrations ship inside the store package: service/store/migrations/<dialect>/.
_STORE_PACKAGE = __name__.rsplit(".", 2)[0]


def dump_json(value: Any) -> str:
    """Compact, key-sorted JSON: the same value always gives the same text on both backends.

    Only values within ``service.limits`` are written (``limits.JSONValueRefused`` otherwise):
    deeper ones would not read back (the decoder recurses), U+0000 has no place in a PostgreSQL
    ``jsonb``, an unpaired surrogate none in SQLite's UTF-8 text.
    """
    if type(value) is CheckedEntry:  # made and checked by these same rules (its docstring)
        return value.text
    limits.check_json(value, strings=False)
    text = jsontext.compact_sorted(value)
    # The strings, on the text: an escaped U+0000 or no UTF-8 form (an unpaired surrogate)
    # sends the value through the whole walk, which says which string (a "\\u0000" written
    # by a string's own backslash passes it).
    size = limits.text_size(text)
    if size is None:
        limits.check_json(value)
        size = len(text.encode("utf-8"))
    limits.check_size(size)
    return text


def opt_float(value: Any) -> float | None:
    return None if value is None else float(value)


@functools.lru_cache(maxsize=512)
def _numbered(sql: str) -> str:
    # Shared statements use '?' placeholders; PostgreSQL wants $1, $2, ... None of the shared
    # statements contains a '?' inside a literal, which is what makes this plain rewrite safe.
    parts = sql.split("?")
    out = [parts[0]]
    for i, part in enumerate(parts[1:], start=1):
        out.append(f"${i}{part}")
    return "".join(out)


@dataclass(frozen=True, slots=True)
class Dialect:
    """What differs in the SQL text and values between the backends."""

    name: str
    numbered_params: bool  # '$1' (PostgreSQL) instead of '?' (SQLite)
    # How a JSON value goes into / comes out of a JSON column. PostgreSQL registers a jsonb codec
    # on its connections, so both are the identity there; SQLite stores text.
    json_in: Callable[[Any], Any]
    json_out: Callable[[Any], Any]
    # Data-modifying statements inside WITH (PostgreSQL): two writes in one round trip.
    writes_in_cte: bool = False
    # An expression naming the current transaction (PostgreSQL: its id, forcing one), for a
    # backend that can lose COMMIT's answer to ask later whether it committed; None: no need.
    xact_id: str | None = None

    def sql(self, text: str) -> str:
        return _numbered(text) if self.numbered_params else text


class Conn(Protocol):
    """One connection inside an open transaction; implementations wrap driver errors."""

    async def execute(self, sql: str, args: Sequence[Any]) -> None: ...
    async def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None: ...
    async def fetchone(self, sql: str, args: Sequence[Any]) -> Row | None: ...
    async def fetchall(self, sql: str, args: Sequence[Any]) -> list[Row]: ...


class Query:
    """Statements on one connection inside one open transaction, in the backend's dialect.

    Also its own (no-op) async context manager, so a transaction can hand out the same query to
    each of its operations without building a new context manager per call.
    """

    __slots__ = ("_conn", "_open", "dialect")

    def __init__(self, conn: Conn, dialect: Dialect) -> None:
        self._conn = conn
        self.dialect = dialect
        self._open = True

    def close(self) -> None:
        # A query must not outlive its transaction: a late write would run outside it (or on a
        # connection already handed to someone else).
        self._open = False

    def check(self) -> None:
        if not self._open:
            raise StoreError("transaction is closed")

    async def __aenter__(self) -> Query:
        self.check()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None

    async def exec(self, sql: str, *args: Any) -> None:
        self.check()
        await self._conn.execute(self.dialect.sql(sql), args)

    async def exec_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        self.check()
        await self._conn.executemany(self.dialect.sql(sql), rows)

    async def one(self, sql: str, *args: Any) -> Row | None:
        self.check()
        return await self._conn.fetchone(self.dialect.sql(sql), args)

    async def all(self, sql: str, *args: Any) -> list[Row]:
        self.check()
        return await self._conn.fetchall(self.dialect.sql(sql), args)

    def note_xact(self, xact: str) -> None:
        """Tell the connection the id of its transaction (``Dialect.xact_id``): if COMMIT's
        answer is lost, the backend asks the database with it whether the transaction committed."""
        note = getattr(self._conn, "note_xact", None)
        if note is not None:
            note(xact)


class Unit:
    """Base of the per-kind operation classes: where one operation's statements run.

    Every operation is ``async with self._unit(write=...) as q: ...`` and nothing else touches a
    connection. No operation calls another from inside its unit (on a store that would be a
    second transaction, and on SQLite a second writer waiting for the first); shared steps are
    functions taking ``q``.
    ``write=False`` promises the operation only reads: SQLite then runs it on its reader, outside
    the writers' lock. ``single=True`` (with ``write=False``) promises it runs exactly one
    statement: a statement sees one snapshot by itself, so a store may run it without opening a
    transaction (on PostgreSQL that saves the BEGIN and COMMIT round trips).
    """

    __slots__ = ()

    def _unit(self, *, write: bool, single: bool = False) -> AbstractAsyncContextManager[Query]:
        raise NotImplementedError

    def _statements(self) -> AbstractAsyncContextManager[Query | None]:
        """A query outside any transaction, each statement committing on its own; it is None
        where there is no such thing (SQLite's writers, an open transaction)."""
        raise NotImplementedError


# ----------------------------------------------------------------------------------- migrations


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str


def migrations(dialect_dir: str) -> list[Migration]:
    """The ``NNNN_name.sql`` files of ``migrations/<dialect_dir>/``, in version order."""
    root = resources.files(_STORE_PACKAGE).joinpath("migrations", dialect_dir)
    found: list[Migration] = []
    for entry in root.iterdir():
        name = entry.name
        if not name.endswith(".sql"):
            continue
        prefix = name.split("_", 1)[0]
        if not prefix.isdigit():
            raise StoreError(f"migration file without a version prefix: {name}")
        found.append(Migration(int(prefix), name, entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise StoreError(f"duplicate migration versions in {dialect_dir}")
    return found


class SchemaTooNew(StoreError):
    """The database was migrated by a newer build: this build must not use it (fail closed).

    Not an outage: retrying cannot help, deploying a build that knows the schema does.
    """

    def __init__(self, database_version: int, known_version: int) -> None:
        super().__init__(
            f"the database schema (version {database_version}) is newer than this build "
            f"(which knows up to version {known_version}): deploy a newer build"
        )
        self.database_version = database_version
        self.known_version = known_version


def pending_migrations(available: list[Migration], applied: set[int]) -> list[Migration]:
    """Migrations still to apply; refuses a database migrated by a newer build (fail closed)."""
    known = {m.version for m in available}
    unknown = sorted(applied - known)
    if unknown:
        raise SchemaTooNew(unknown[-1], max(known, default=0))
    return [m for m in available if m.version not in applied]
