"""Shared SQL for both backends: every operation written once, over a tiny ``Dialect`` and ``Conn``.

A backend supplies a ``Conn`` (four async calls that run one statement inside the current
transaction), a ``Dialect`` (placeholder style, JSON encoding, null-safe equality) and
``_transaction``. Everything else — every statement, every conditional write and every conflict
classification — lives in this package, so SQLite and PostgreSQL cannot drift apart:

    core.py      Dialect, Conn, Query, Unit, migrations, canonical JSON
    sessions.py  sessions, one-time claims, login failures     (base.SessionOps)
    federation.py OIDC logins, CLI handoffs, federated sessions (base.FederationOps)
    tickets.py   approval tickets and reviews                   (base.TicketOps)
    tasks.py     tasks and step events                          (base.TaskOps)
    audit.py     the audit hash chain                           (base.AuditOps)
    policy_revisions.py  published policy revisions, the active one (base.PolicyRevisionOps)
    signingkeys.py  published token signing keys               (base.PublishedKeyOps)
    outbox.py    notification outbox events, leases, deliveries (base.OutboxOps)

Each kind is a class of operations whose bodies run in ``self._unit(write=...)``. ``SqlTx`` and
``SqlStore`` inherit the same classes and differ only in what a unit is: the transaction's own
connection, or a fresh transaction per operation. One body per operation, no forwarding.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

from ...deadline import charged
from ..base import StoreUnavailable, TaskRead, TicketRecord, Tx
from .audit import AuditSql
from .core import (
    Conn,
    Dialect,
    Migration,
    Query,
    Row,
    SchemaTooNew,
    dump_json,
    migrations,
    pending_migrations,
)
from .federation import FederationSql
from .outbox import OutboxSql
from .policy_revisions import PolicyRevisionSql
from .sessions import SessionSql
from .signingkeys import SigningKeySql
from .tasks import TaskSql
from .tickets import TicketSql

__all__ = [
    "Conn",
    "Dialect",
    "Migration",
    "Row",
    "SchemaTooNew",
    "SqlStore",
    "SqlTx",
    "dump_json",
    "migrations",
    "pending_migrations",
]


class _Operations(SessionSql, FederationSql, TicketSql, TaskSql, AuditSql, OutboxSql,
                  PolicyRevisionSql, SigningKeySql):
    """Every operation of ``base.Tx``; where they run is the subclass's ``_unit``."""

    __slots__ = ()


class SqlTx(_Operations):
    """The operations inside one open transaction: each unit is that transaction's query."""

    __slots__ = ("_q",)

    def __init__(self, q: Query) -> None:
        self._q = q

    @asynccontextmanager
    async def _statements(self) -> AsyncIterator[Query | None]:
        yield None  # inside a transaction, statements commit with it

    def _unit(self, *, write: bool, single: bool = False) -> AbstractAsyncContextManager[Query]:
        # The transaction was opened for writing, so reads and writes share it alike; the query
        # itself refuses statements once the transaction has ended.
        return self._q


class _Observed:
    """``SqlStore._observed``: a class, not a generator (it wraps every store call)."""

    __slots__ = ("_hook", "_write")

    def __init__(self, hook: Callable[[bool, bool], None] | None, write: bool) -> None:
        self._hook, self._write = hook, write

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        if self._hook is not None and (kind is None or issubclass(kind, StoreUnavailable)):
            self._hook(self._write, kind is None)


class SqlStore(_Operations):
    """The operations as a store: each unit is a fresh transaction, so each call is atomic."""

    dialect: Dialect
    #: The deadline of one store call (a transaction from its start to its COMMIT), seconds.
    timeout_s: float = 5.0
    #: Told of every transaction opened (``write``): the worker's metrics count store calls.
    on_transaction: Callable[[bool], None] | None = None
    #: See ``base.Store.on_round_trips`` (PostgreSQL's transactions call it).
    on_round_trips: Callable[[int], None] | None = None
    #: See ``base.Store.on_outcome``.
    on_outcome: Callable[[bool, bool], None] | None = None
    #: See ``base.Store.stages_audit``; SQLite's writers already share one lock per file.
    stages_audit: bool = False
    #: See ``base.Store.reads_round_trip``; SQLite reads the file in this process.
    reads_round_trip: bool = False

    def _transaction(self, *, write: bool, single: bool = False
                     ) -> AbstractAsyncContextManager[Conn]:
        """Open a transaction (backend-specific); commit on clean exit, roll back on error.
        ``single``: a read of one statement, which may run without a transaction; with
        ``autocommits``, also writes that each commit on their own (``_statements``)."""
        raise NotImplementedError

    #: Whether ``_transaction(write=True, single=True)`` gives a connection outside any
    #: transaction, each statement committing on its own (PostgreSQL).
    autocommits = False

    @asynccontextmanager
    async def _statements(self) -> AsyncIterator[Query | None]:
        if not self.autocommits:
            yield None
            return
        if self.on_transaction is not None:
            self.on_transaction(True)
        with charged(), self._observed(True):
            async with self._transaction(write=True, single=True) as conn:
                q = Query(conn, self.dialect)
                try:
                    yield q
                finally:
                    q.close()

    def _unit(self, *, write: bool, single: bool = False) -> AbstractAsyncContextManager[Query]:
        return self._generic_unit(write=write, single=single)

    @asynccontextmanager
    async def _generic_unit(self, *, write: bool, single: bool = False) -> AsyncIterator[Query]:
        if self.on_transaction is not None:
            self.on_transaction(write)
        # The call's deadline (``_transaction``) and the time it took both count against the
        # request's store deadline (``service.deadline``).
        with charged(), self._observed(write):
            async with self._transaction(write=write, single=single and not write) as conn:
                q = Query(conn, self.dialect)
                try:
                    yield q
                finally:
                    q.close()

    def _observed(self, write: bool) -> _Observed:
        """Tell ``on_outcome`` whether the store served the block (other errors say nothing
        about the store: a conflict, a caller's refusal)."""
        return _Observed(self.on_outcome, write)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Tx]:
        """Group operations: all commit together, or an exception rolls them all back.

        Do not call the store's own methods while holding a transaction: they run on another
        connection and, on SQLite, would wait for the lock this transaction holds.
        """
        async with self._unit(write=True) as q:
            yield SqlTx(q)

    def run_transaction(self, ticket: TicketRecord | None, task: TaskRead | None = None
                        ) -> AbstractAsyncContextManager[Tx]:
        """The transaction of a chain run that redeems ``ticket`` (None: redeems none); a
        backend may send such a run's writes together (PostgreSQL: ``pgrun``, which also takes
        ``task``, the pre-read's task, instead of reading it again)."""
        return self.transaction()

    async def ping(self) -> None:
        async with self._unit(write=False, single=True) as q:
            await q.one("SELECT 1 AS ok")
