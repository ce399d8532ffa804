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
import contextlib
import json
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, cast
from urllib.parse import parse_qs, unquote, urlsplit

import asyncpg

from ..deadline import Waiting, call_deadline
from ..limits import JSONValueRefused
from . import pgrun
from .base import (
    StoreError,
    StoreOutcomeUnknown,
    StoreUnavailable,
    TaskRead,
    TicketRecord,
    Tx,
)
from .sql import Dialect, Row, SqlStore, dump_json, migrations, pending_migrations

__all__ = ["Listener", "PostgresStore"]

log = logging.getLogger(__name__)


def _identity(value: Any) -> Any:
    return value


DIALECT = Dialect(
    name="postgresql",
    numbered_params=True,
    # The jsonb codec registered on every connection does the (de)serialisation.
    json_in=_identity,
    json_out=_identity,
    writes_in_cte=True,
    # Assigns the transaction its id if it has none yet; pg_xact_status tells its fate later.
    xact_id="pg_current_xact_id()::text",
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


def _late() -> StoreUnavailable:
    return StoreUnavailable("postgresql store unavailable: deadline exceeded")


async def _rollback(tr: Any, deadline: float) -> bool:
    """Roll back within the deadline; False (and the connection is to be dropped) if it fails."""
    try:
        async with asyncio.timeout_at(deadline):
            await tr.rollback()
    except Exception:  # the original error matters more
        log.warning("postgresql rollback failed", exc_info=True)
        return False
    return True


#: PostgresErrors that are no answer to the statement: the connection or server went away.
_UNANSWERED = (asyncpg.PostgresConnectionError, asyncpg.exceptions.OperatorInterventionError)


def _commit_failed(exc: BaseException, committed: Callable[[], Awaitable[bool | None]] | None
                   ) -> Exception:
    """What a write's failed COMMIT raises. The server's own error answer means it rolled back;
    anything else (the connection died, the deadline passed, the server was stopping) leaves
    the outcome unknown: COMMIT may have been applied and only its answer lost."""
    answered = isinstance(exc, asyncpg.PostgresError) and not isinstance(exc, _UNANSWERED)
    if answered:
        return _wrap(exc)
    cause = "deadline exceeded" if isinstance(exc, TimeoutError) else type(exc).__name__
    return StoreOutcomeUnknown(f"postgresql commit outcome unknown: {cause}", committed)



def _wrap(exc: BaseException) -> Exception:
    # A JSON value our jsonb encoder refused (service.limits) reaches us wrapped by the driver:
    # it is the caller's refusal (422), not a store failure.
    if isinstance(exc.__cause__, JSONValueRefused):
        return exc.__cause__
    # Class name or SQLSTATE only: asyncpg messages can echo the host, user or statement.
    if isinstance(exc, _UNAVAILABLE):
        return StoreUnavailable(f"postgresql store unavailable: {type(exc).__name__}")
    sqlstate = getattr(exc, "sqlstate", None)
    return StoreError(f"postgresql error: {sqlstate or type(exc).__name__}")


_WRAPPED = (*_UNAVAILABLE, asyncpg.PostgresError)

# What asyncpg raises when a connection is found dead as it is used: closed already, or closed
# (reset) under the statement. Never TimeoutError: a server that is slow is not retried.
_DEAD: tuple[type[BaseException], ...] = (
    ConnectionError,
    asyncpg.InterfaceError,
    asyncpg.exceptions.ConnectionDoesNotExistError,
)

# A first statement that may run again on another connection if its own was found dead: it only
# reads (``SqlStore``'s single units and the optimistic audit seal start with one).
_REREADABLE = re.compile(r"\s*SELECT\b", re.IGNORECASE)


def describe_dsn(dsn: str) -> str:
    """``host:port/database`` of a DSN: what an operator needs to find it, never the user or
    the password."""
    try:
        parts = urlsplit(dsn)
        query = parse_qs(parts.query)
        host = parts.hostname or query.get("host", ["localhost"])[0]
        port = parts.port or int(query.get("port", ["5432"])[0])
    except ValueError:
        return "(unparseable DSN)"
    database = unquote(parts.path.lstrip("/")) or query.get("dbname", [""])[0] or "(default)"
    host = f"[{host}]" if ":" in host else host
    return f"{host}:{port}/{database}"


def _opening_error(exc: BaseException, dsn: str) -> Exception:
    """``_wrap`` plus where (host:port/database) and the server's or driver's message, with
    the DSN, the user info and the password taken out of it."""
    wrapped = _wrap(exc)
    if not isinstance(wrapped, StoreError):
        return wrapped
    message = " ".join(str(exc).split())
    parts = urlsplit(dsn)
    secrets = [dsn, parts.netloc, parts.password, unquote(parts.password or "")]
    for secret in sorted({s for s in secrets if s}, key=len, reverse=True):
        message = message.replace(secret, "***")
    detail = f": {message[:300]}" if message else ""
    return type(wrapped)(f"{wrapped} ({describe_dsn(dsn)}{detail})")


async def _init_connection(conn: asyncpg.Connection) -> None:
    # Text format with our canonical dumps: JSON columns take and give plain Python values.
    await conn.set_type_codec(
        "jsonb", schema="pg_catalog", encoder=dump_json, decoder=json.loads, format="text"
    )


async def _keep_session(conn: asyncpg.Connection) -> None:
    """The pool's reset on release: nothing to send. No unit sets a session variable, holds an
    advisory lock or a cursor, or LISTENs on a pooled connection (``listen`` has its own), and
    asyncpg itself rolls back a transaction left open; so the default reset query (a round trip
    per unit) would change nothing."""


class _Conn:
    """``sql.Conn`` over one asyncpg connection inside an open transaction, or in autocommit.

    A pooled connection can have died idle in the pool (say right after its previous COMMIT,
    before the event loop read the reset): the first statement then fails at once. If that
    statement only reads (``_REREADABLE``), it runs again, once, on a new connection; a write is
    never re-sent, since whether it reached the server is unknown.
    """

    def __init__(self, conn: asyncpg.Connection, store: PostgresStore | None = None,
                 deadline: float = 0.0) -> None:
        self._c: Any = conn
        # Until the first statement has run: the store that can replace a dead connection.
        self._store = store
        self._deadline = deadline
        #: Statements sent so far (a re-sent one counts twice).
        self.trips = 0
        #: The transaction's id, once a statement named it (``sql.Query.note_xact``).
        self.xact: str | None = None

    def note_xact(self, xact: str) -> None:
        self.xact = xact

    async def _run(self, sql: str, call: Callable[[asyncpg.Connection], Awaitable[Any]]) -> Any:
        store, self._store = self._store, None
        self.trips += 1
        try:
            try:
                return await call(self._c)
            except _DEAD:
                if store is None or not _REREADABLE.match(sql):
                    raise
            dead, self._c = self._c, None
            self._c = await store._replace(dead, self._deadline)
            self.trips += 1
            return await call(self._c)
        except _WRAPPED as exc:
            raise _wrap(exc) from exc

    async def execute(self, sql: str, args: Sequence[Any]) -> None:
        await self._run(sql, lambda c: c.execute(sql, *args))

    async def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        await self._run(sql, lambda c: c.executemany(sql, rows))

    async def fetchone(self, sql: str, args: Sequence[Any]) -> Row | None:
        return cast("Row | None", await self._run(sql, lambda c: c.fetchrow(sql, *args)))

    async def fetchall(self, sql: str, args: Sequence[Any]) -> list[Row]:
        return cast("list[Row]", await self._run(sql, lambda c: c.fetch(sql, *args)))


class PostgresStore(SqlStore):
    """The multi-replica store: an asyncpg pool; each transaction on one pooled connection.

    Every transaction runs under one deadline (``timeout_s``, from ``store.timeout_s``): acquiring
    a connection, BEGIN, the caller's statements and COMMIT together. Past it the connection is
    dropped (the server rolls back what did not commit) and the call raises ``StoreUnavailable``.
    A write whose COMMIT was sent but not answered raises ``StoreOutcomeUnknown`` instead (with
    a way to ask later, when the transaction staged an audit record and so named its id).
    Once COMMIT has answered, the transaction is committed whatever happens to the connection
    afterwards: giving it back to the pool never fails the call.
    """

    dialect = DIALECT
    # Replicas share the audit head: runs stage their records, sealers chain them in batches.
    stages_audit = True
    autocommits = True
    reads_round_trip = True

    def __init__(self, pool: asyncpg.Pool, timeout_s: float, *, dsn: str | None = None,
                 settings: dict[str, str] | None = None) -> None:
        self._pool = pool
        self.timeout_s = timeout_s
        self._closed = False
        # For dedicated (non-pooled) connections: LISTEN holds its connection for as long as
        # it listens, so it never takes one from the pool.
        self._dsn = dsn
        self._settings = dict(settings or {})

    @classmethod
    async def open(
        cls,
        dsn: str,
        *,
        schema: str | None = None,
        min_size: int = 1,
        max_size: int = 10,
        timeout_s: float = 5.0,
    ) -> PostgresStore:
        if schema is not None and not _SCHEMA_NAME.fullmatch(schema):
            raise ValueError("schema must be a plain SQL identifier")
        settings = {
            # The server's own bounds: a statement waiting on a lock, and a transaction whose
            # client went silent (its row locks would hold every other replica up).
            "statement_timeout": str(int(timeout_s * 1000)),
            "idle_in_transaction_session_timeout": str(int(timeout_s * 2000)),
        }
        if schema:
            settings["search_path"] = f'"{schema}"'
        try:
            await _migrate(dsn, schema, timeout_s)
            pool = await asyncio.wait_for(asyncpg.create_pool(
                dsn,
                min_size=min_size,
                max_size=max_size,
                timeout=timeout_s,  # connecting
                command_timeout=timeout_s,
                init=_init_connection,
                reset=_keep_session,
                server_settings=settings,
            ), timeout_s)
        except _WRAPPED as exc:
            raise _opening_error(exc, dsn) from exc
        return cls(pool, timeout_s, dsn=dsn, settings=settings)

    async def listen(self, channel: str, on_notify: Callable[[str], None]) -> Listener:
        """LISTEN on ``channel`` over a dedicated connection; ``on_notify(payload)`` runs on the
        event loop for each notification. Raises ``StoreUnavailable`` if it cannot connect."""
        if self._closed or self._dsn is None:
            raise StoreUnavailable("postgresql store is closed")
        try:
            conn = await asyncio.wait_for(asyncpg.connect(
                self._dsn, timeout=self.timeout_s, server_settings=self._settings
            ), self.timeout_s)
            listener = Listener(conn, channel, on_notify)
            await conn.add_listener(channel, listener.deliver)
        except _WRAPPED as exc:
            raise _wrap(exc) from exc
        except TimeoutError:
            raise _late() from None
        return listener

    @asynccontextmanager
    async def _transaction(self, *, write: bool, single: bool = False) -> AsyncIterator[_Conn]:
        if self._closed:
            raise StoreUnavailable("postgresql store is closed")
        deadline = call_deadline(self.timeout_s)  # sooner if the request has less left
        conn = await self._acquire(deadline)
        # Whether the connection may go back to the pool as it is (else it is dropped).
        healthy = False
        if single:
            # No transaction, no BEGIN/COMMIT round trips: one read statement sees one snapshot
            # by itself; writes each commit on their own (``SqlStore._statements``).
            held = _Conn(conn, self, deadline)
            try:
                async with asyncio.timeout_at(deadline) as bound:
                    yield held
                healthy = True
            except BaseException:
                if bound.expired():
                    raise _late() from None
                raise
            finally:
                if held._c is not None:  # None: found dead and no other could be had
                    await self._release(held._c, deadline, healthy)
                self._count(held.trips)
            return
        # Reads get one snapshot (a ticket and its reviews agree); writes rely on row locks.
        # On failure _begin has given the connection back.
        tr, conn, trips = await self._begin(conn, deadline, write=write)
        held = _Conn(conn)
        try:
            try:
                async with asyncio.timeout_at(deadline) as bound:
                    yield held
            except BaseException as exc:
                if bound.expired():
                    raise _late() from None
                trips += 1
                healthy = await _rollback(tr, deadline) and not isinstance(exc, StoreUnavailable)
                raise
            trips += 1
            try:
                async with asyncio.timeout_at(deadline):
                    await tr.commit()
            except (TimeoutError, *_WRAPPED) as exc:
                if not write:
                    return  # a read is complete once its rows are in: how it ends changes nothing
                # Whether COMMIT reached the server is unknown: the caller must claim neither.
                raise _commit_failed(exc, self._resolver(held.xact)) from None
            healthy = True
        finally:
            await self._release(conn, deadline, healthy)
            self._count(trips + held.trips)

    def run_transaction(self, ticket: TicketRecord | None, task: TaskRead | None = None
                        ) -> AbstractAsyncContextManager[Tx]:
        """The transaction of a chain run; one that redeems ``ticket`` sends its writes in one
        call of ``cp_chain_run`` (``pgrun``), taking ``task`` (the ticket's pre-read found it)
        instead of reading it again."""
        if ticket is None:
            return self.transaction()
        return pgrun.run_transaction(self, ticket, task)

    async def _call_run(self, sql: str, args: Sequence[Any], ticket_id: str,
                        correlation_id: str) -> tuple[Any, str | None]:
        """Send one run's call (it commits on its own): its row, or the SQLSTATE it refused
        with. Never re-sent: whether it reached the server is unknown once it was written, so
        any failure but the server's own answer raises ``StoreOutcomeUnknown``."""
        if self._closed:
            raise StoreUnavailable("postgresql store is closed")
        if self.on_transaction is not None:
            self.on_transaction(True)
        with Waiting(self.timeout_s) as waiting, self._observed(True):
            deadline = waiting.at
            conn = await self._acquire(deadline)
            pid = conn.get_server_pid()
            healthy = False
            try:
                try:
                    async with asyncio.timeout_at(deadline):
                        row = await conn.fetchrow(sql, *args)
                except (TimeoutError, *_UNANSWERED, *_UNAVAILABLE) as exc:
                    raise _commit_failed(exc, self._run_resolver(pid, ticket_id,
                                                                 correlation_id)) from None
                except asyncpg.PostgresError as exc:
                    healthy = True  # the server answered: nothing was written
                    if exc.sqlstate in pgrun.REFUSALS:
                        return None, exc.sqlstate
                    raise _wrap(exc) from exc
                healthy = True
                return row, None
            finally:
                await self._release(conn, deadline, healthy)
                self._count(1)

    def _run_resolver(self, pid: int, ticket_id: str, correlation_id: str
                      ) -> Callable[[], Awaitable[bool | None]]:
        """Whether a run's lost call committed: None while the backend that ran it is still
        there (it may yet commit); then whether the ticket was consumed by this run (the call
        consumes it in the same transaction as every other write, or writes nothing)."""

        async def committed() -> bool | None:
            async with self._unit(write=False, single=True) as q:
                alive = await q.one("SELECT 1 AS alive FROM pg_stat_activity WHERE pid = ?", pid)
            if alive is not None:
                return None
            async with self._unit(write=False, single=True) as q:  # a snapshot taken after
                row = await q.one("SELECT consumed_correlation_id AS cid FROM tickets "
                                  "WHERE id = ?", ticket_id)
            return row is not None and row["cid"] == correlation_id

        return committed

    def _resolver(self, xact: str | None) -> Callable[[], Awaitable[bool | None]] | None:
        """Whether transaction ``xact`` committed, asked of the server (``pg_xact_status``):
        None while it is still in progress (the server has not yet seen its connection end)
        or too old for the server to know."""
        if xact is None:
            return None

        async def committed() -> bool | None:
            async with self._unit(write=False, single=True) as q:
                row = await q.one("SELECT pg_xact_status(?::xid8) AS status", int(xact))
            status = None if row is None else row["status"]
            return {"committed": True, "aborted": False}.get(str(status))

        return committed

    def _count(self, trips: int) -> None:
        if self.on_round_trips is not None and trips:
            self.on_round_trips(trips)

    async def _acquire(self, deadline: float) -> Any:
        try:
            async with asyncio.timeout_at(deadline):
                return await self._pool.acquire()
        except TimeoutError:
            raise _late() from None
        except _WRAPPED as exc:
            raise _wrap(exc) from exc

    async def _begin(self, conn: Any, deadline: float, *, write: bool) -> tuple[Any, Any, int]:
        """BEGIN on ``conn``; on a new connection instead if ``conn`` is found dead (BEGIN
        changes nothing, so it can always be sent again). The transaction, its connection and
        the BEGINs sent. On any failure, cancellation included, the connection has been given
        back."""
        attempt = 1
        try:
            while True:
                tr = conn.transaction(
                    isolation="read_committed" if write else "repeatable_read",
                    readonly=not write,
                )
                try:
                    async with asyncio.timeout_at(deadline):
                        await tr.start()
                    return tr, conn, attempt
                except _DEAD:
                    if attempt == 2:
                        raise
                attempt = 2
                dead, conn = conn, None
                conn = await self._replace(dead, deadline)
        except BaseException as exc:
            if conn is not None:
                await self._release(conn, deadline, False)
            self._count(attempt)
            if isinstance(exc, TimeoutError):
                raise _late() from None
            if isinstance(exc, _WRAPPED):
                raise _wrap(exc) from exc
            raise

    async def _replace(self, dead: Any, deadline: float) -> Any:
        """Drop a connection found dead and take another from the pool (a new one, as the
        dead one's slot is the pool's most recent)."""
        log.info("postgresql pooled connection found dead; using another")
        await self._release(dead, deadline, False)
        return await self._acquire(deadline)

    async def _release(self, conn: Any, deadline: float, healthy: bool) -> None:
        """Give the connection back to the pool; never raises: the transaction has ended.

        No reset round trip (the pool's ``reset`` is ``_keep_session``): no unit changes the
        session's state, and a connection that died after its COMMIT is found by the next
        unit that uses it, which then runs its BEGIN or first read on a new connection
        (``_begin``, ``_Conn``; tests/store/test_faults.py). A connection that is unhealthy
        or out of time is dropped instead; the pool opens another.
        """
        remaining = deadline - asyncio.get_running_loop().time()
        try:
            if not healthy or remaining <= 0:
                # A connection closed under us is back in the pool already (asyncpg says so
                # with an InterfaceError); the release below is then a no-op.
                with contextlib.suppress(asyncpg.InterfaceError):
                    conn.terminate()
            await self._pool.release(conn, timeout=max(remaining, 0.001))
        except Exception as exc:
            # The holder has terminated the connection already; the result stands.
            log.warning("postgresql connection dropped on release: %s", type(exc).__name__)

    async def describe(self) -> dict[str, Any]:
        # Never the DSN or schema: status surfaces must not reveal connection details.
        return {"backend": "postgresql", "durable": True, "multi_replica_safe": True}

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._pool.close()


class Listener:
    """One LISTEN connection: ``alive`` until the connection ends (then listen again)."""

    def __init__(self, conn: asyncpg.Connection, channel: str,
                 on_notify: Callable[[str], None]) -> None:
        self._conn = conn
        self._channel = channel
        self._on_notify = on_notify

    def deliver(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        try:
            self._on_notify(payload)
        except Exception:
            log.exception("postgresql notification handler failed")

    @property
    def alive(self) -> bool:
        return not self._conn.is_closed()

    async def close(self) -> None:
        try:
            await asyncio.wait_for(self._conn.close(), 2.0)
        except Exception:
            self._conn.terminate()


async def _migrate(dsn: str, schema: str | None, timeout_s: float) -> None:
    """Create the schema if asked and apply pending migrations, one starter at a time."""
    available = migrations("postgres")
    conn = await asyncpg.connect(dsn, timeout=timeout_s)
    try:
        async with conn.transaction():
            # Held until commit: a second process starting now waits here, then finds the
            # migrations applied. Also guards CREATE SCHEMA IF NOT EXISTS, which races.
            # Every step but the migrations themselves has a deadline (the lock a long one:
            # another starter may be migrating), so a stalled server cannot hang the start.
            await conn.execute("SELECT pg_advisory_xact_lock($1)", _MIGRATION_LOCK,
                               timeout=max(60.0, timeout_s))
            if schema:
                await conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"', timeout=timeout_s)
                await conn.execute(f'SET LOCAL search_path TO "{schema}"', timeout=timeout_s)
            await conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations "
                "(version INTEGER PRIMARY KEY, name TEXT NOT NULL)", timeout=timeout_s
            )
            applied = {
                r["version"]
                for r in await conn.fetch("SELECT version FROM schema_migrations", timeout=timeout_s)
            }
            for migration in pending_migrations(available, applied):
                await conn.execute(migration.sql)  # no arguments: simple protocol, many statements
                await conn.execute(
                    "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)",
                    migration.version,
                    migration.name,
                )
    finally:
        try:
            await conn.close(timeout=timeout_s)
        except Exception:
            conn.terminate()
