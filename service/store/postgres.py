"""PostgreSQL backend (asyncpg): several replicas on several machines share one database.

Only what differs from SQLite lives here: the connection pool, transactions, the jsonb codec,
migration locking and error wrapping; the statements are in the ``sql`` package. Writing
transactions run at READ COMMITTED: every conditional write there is a single
``UPDATE ... WHERE ...`` whose row lock makes a concurrent writer wait and then re-check the
condition against the committed row, which is what makes ticket consumption exactly-once across
replicas.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any, cast

import asyncpg

from .base import StoreError, StoreUnavailable
from .sql import Dialect, Row, SqlStore, dump_json, migrations, pending_migrations

__all__ = ["PostgresStore"]

log = logging.getLogger(__name__)


def _identity(value: Any) -> Any:
    return value


DIALECT = Dialect(
    name="postgresql",
    numbered_params=True,
    # The jsonb codec registered on every connection does the (de)serialisation.
    json_in=_identity,
    json_out=_identity,
    not_distinct="IS NOT DISTINCT FROM",
)

# One cluster-wide key: concurrent starters (any schema) apply migrations one at a time.
_MIGRATION_LOCK = 0x6370_7374_6F72_6501  # "cpstore" + 1

_SCHEMA_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")

# Errors meaning "the database cannot serve us now": fail closed with 503, retry later.
# InterfaceError is included because asyncpg raises it for connections closed under us.
_UNAVAILABLE: tuple[type[BaseException], ...] = (
    OSError,
    asyncio.TimeoutError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.exceptions.OperatorInterventionError,  # shutdown, cannot connect now
    asyncpg.exceptions.InsufficientResourcesError,  # too many connections, disk full
    asyncpg.exceptions.InvalidAuthorizationSpecificationError,  # bad credentials
    asyncpg.exceptions.InvalidCatalogNameError,  # database does not exist
)


def _wrap(exc: BaseException) -> StoreError:
    # Class name or SQLSTATE only: asyncpg messages can echo the host, user or statement.
    if isinstance(exc, _UNAVAILABLE):
        return StoreUnavailable(f"postgresql store unavailable: {type(exc).__name__}")
    sqlstate = getattr(exc, "sqlstate", None)
    return StoreError(f"postgresql error: {sqlstate or type(exc).__name__}")


_WRAPPED = (*_UNAVAILABLE, asyncpg.PostgresError)


async def _init_connection(conn: asyncpg.Connection) -> None:
    # Text format with our canonical dumps: JSON columns take and give plain Python values.
    await conn.set_type_codec(
        "jsonb", schema="pg_catalog", encoder=dump_json, decoder=json.loads, format="text"
    )


class _Conn:
    """``sql.Conn`` over one asyncpg connection inside an open transaction."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self._c = conn

    async def execute(self, sql: str, args: Sequence[Any]) -> None:
        try:
            await self._c.execute(sql, *args)
        except _WRAPPED as exc:
            raise _wrap(exc) from exc

    async def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        try:
            await self._c.executemany(sql, rows)
        except _WRAPPED as exc:
            raise _wrap(exc) from exc

    async def fetchone(self, sql: str, args: Sequence[Any]) -> Row | None:
        try:
            return cast("Row | None", await self._c.fetchrow(sql, *args))
        except _WRAPPED as exc:
            raise _wrap(exc) from exc

    async def fetchall(self, sql: str, args: Sequence[Any]) -> list[Row]:
        try:
            return cast("list[Row]", await self._c.fetch(sql, *args))
        except _WRAPPED as exc:
            raise _wrap(exc) from exc


class PostgresStore(SqlStore):
    """The multi-replica store: an asyncpg pool; each transaction on one pooled connection."""

    dialect = DIALECT

    def __init__(self, pool: asyncpg.Pool, acquire_timeout_s: float) -> None:
        self._pool = pool
        self._acquire_timeout_s = acquire_timeout_s
        self._closed = False

    @classmethod
    async def open(
        cls,
        dsn: str,
        *,
        schema: str | None = None,
        min_size: int = 1,
        max_size: int = 10,
        timeout_s: float = 10.0,
    ) -> PostgresStore:
        if schema is not None and not _SCHEMA_NAME.fullmatch(schema):
            raise ValueError("schema must be a plain SQL identifier")
        try:
            await _migrate(dsn, schema, timeout_s)
            pool = await asyncpg.create_pool(
                dsn,
                min_size=min_size,
                max_size=max_size,
                timeout=timeout_s,
                init=_init_connection,
                server_settings={"search_path": f'"{schema}"'} if schema else None,
            )
        except _WRAPPED as exc:
            raise _wrap(exc) from exc
        return cls(pool, timeout_s)

    @asynccontextmanager
    async def _transaction(self, *, write: bool) -> AsyncIterator[_Conn]:
        if self._closed:
            raise StoreUnavailable("postgresql store is closed")
        try:
            conn = await self._pool.acquire(timeout=self._acquire_timeout_s)
        except _WRAPPED as exc:
            raise _wrap(exc) from exc
        try:
            # Reads get one snapshot (a ticket and its reviews agree); writes rely on row locks.
            tr = conn.transaction(
                isolation="read_committed" if write else "repeatable_read", readonly=not write
            )
            try:
                await tr.start()
            except _WRAPPED as exc:
                raise _wrap(exc) from exc
            try:
                yield _Conn(conn)
            except BaseException:
                try:
                    await tr.rollback()
                except Exception:  # the original error matters more than a failed rollback
                    log.warning("postgresql rollback failed", exc_info=True)
                raise
            try:
                await tr.commit()
            except _WRAPPED as exc:
                raise _wrap(exc) from exc
        finally:
            await self._pool.release(conn)

    async def describe(self) -> dict[str, Any]:
        # Never the DSN or schema: status surfaces must not reveal connection details.
        return {"backend": "postgresql", "durable": True, "multi_replica_safe": True}

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._pool.close()


async def _migrate(dsn: str, schema: str | None, timeout_s: float) -> None:
    """Create the schema if asked and apply pending migrations, one starter at a time."""
    available = migrations("postgres")
    conn = await asyncpg.connect(dsn, timeout=timeout_s)
    try:
        async with conn.transaction():
            # Held until commit: a second process starting now waits here, then finds the
            # migrations applied. Also guards CREATE SCHEMA IF NOT EXISTS, which races.
            await conn.execute("SELECT pg_advisory_xact_lock($1)", _MIGRATION_LOCK)
            if schema:
                await conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
                await conn.execute(f'SET LOCAL search_path TO "{schema}"')
            await conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations "
                "(version INTEGER PRIMARY KEY, name TEXT NOT NULL)"
            )
            applied = {
                r["version"] for r in await conn.fetch("SELECT version FROM schema_migrations")
            }
            for migration in pending_migrations(available, applied):
                await conn.execute(migration.sql)  # no arguments: simple protocol, many statements
                await conn.execute(
                    "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)",
                    migration.version,
                    migration.name,
                )
    finally:
        await conn.close()
