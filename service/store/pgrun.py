"""A production chain run's writes in one PostgreSQL call (``PostgresStore.run_transaction``).

A run that redeems a ticket writes, in order: the consumed ticket and its outbox event, the
task (created if new), the step event, and the run's staged audit record. ``RunTx`` holds those
writes instead of sending them, and sends them all as ONE call of the server-side function
``cp_chain_run`` (migration 0011) when the run stages its audit record, which is a run's last
write: the call is one statement, so it commits on its own, all of it or none. No BEGIN, no
COMMIT, one round trip where a transaction of statements takes seven.

What each held write returns is known before the call: the consumed ticket is the ticket the
chain pre-read and checked (``approvals.redeem.check``) with the consumption applied, the task
is the one that pre-read found in the same statement (``get_ticket_and_task``; read once, one
statement without a transaction, when the run's task is another) and the step event's seq
follows from it.
The call re-checks all of it under the rows' locks: a ticket that no longer matches refuses
the run exactly as the conditional UPDATE does (``CPT01`` -> the same ``Conflict``), and an
event seq a concurrent append took first fails the run (``CPS01``); nothing is written then.
Any other operation on the transaction, or a write the function does not cover, opens an
ordinary transaction first and replays the held writes into it (``_open``).

A call whose answer is lost leaves the outcome unknown (``StoreOutcomeUnknown``): the id the
function returns (``pg_current_xact_id``) would be in that answer, so the resolver asks instead
whether the backend that ran the call has ended and, then, whether the ticket was consumed by
this run's correlation id (``PostgresStore._run_resolver``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from typing import Any, Protocol

from ..approvals.binding import Binding
from ..approvals.events import ticket_event
from .base import (
    Conflict,
    EventRecord,
    Json,
    StoreError,
    StoreOutcomeUnknown,
    TaskRead,
    TaskRecord,
    TicketRecord,
)
from .sql import SqlTx, dump_json
from .sql.core import Query
from .sql.tasks import get_task
from .sql.tickets import COLUMNS as TICKET_COLUMNS
from .sql.tickets import consume_refusal

__all__ = ["CALL", "PostgresCalls", "RunTx"]


class PostgresCalls(Protocol):
    """What a run needs of ``PostgresStore``, named by shape: ``postgres`` imports this module,
    so this one does not import it back (not even for its types)."""

    def _unit(self, *, write: bool, single: bool = False) -> AbstractAsyncContextManager[Query]:
        ...

    async def _call_run(self, sql: str, args: Sequence[Any], ticket_id: str,
                        correlation_id: str) -> tuple[Any, str | None]:
        ...

CALL = ("SELECT staged, xact FROM cp_chain_run($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, "
        "$12, $13::jsonb, $14, $15, $16, $17, $18, $19, $20, $21, $22::jsonb, $23, $24, $25)")

# Built from a module constant; the id is bound.
_CURRENT = f"SELECT {TICKET_COLUMNS} FROM tickets WHERE id = ?"  # noqa: S608

#: SQLSTATEs ``cp_chain_run`` raises (nothing was written).
TICKET_REFUSED, SEQ_TAKEN = "CPT01", "CPS01"
REFUSALS = frozenset({TICKET_REFUSED, SEQ_TAKEN})


class RunTx(SqlTx):
    """``base.Tx`` of one chain run that redeems ``ticket``: its writes go in one call."""

    __slots__ = ("_consume", "_event", "_outbox", "_read", "_sent", "_stack", "_store", "_task",
                 "_task_seq", "_ticket")

    def __init__(self, store: PostgresCalls, ticket: TicketRecord,
                 task: TaskRead | None = None) -> None:
        super().__init__(None)  # type: ignore[arg-type]  # set by _open, if ever
        self._store = store
        self._ticket = ticket
        self._read = task  # the task as the ticket's pre-read found it
        self._stack: AsyncExitStack | None = None
        self._sent = False
        self._consume: dict[str, Any] | None = None
        self._outbox: Any = None
        self._task: tuple[str, str, float] | None = None
        self._event: tuple[str, str, str, Json, float, int] | None = None
        self._task_seq = 0

    # ------------------------------------------------------------------ held writes
    async def consume_ticket(self, id: str, *, nonce_hash: str, subject_id: str, env: str,
                             action: str, resource_hash: str, command_hash: str | None,
                             now: float, correlation_id: str) -> TicketRecord:
        args: dict[str, Any] = dict(nonce_hash=nonce_hash, subject_id=subject_id, env=env, action=action,
                    resource_hash=resource_hash, command_hash=command_hash, now=now,
                    correlation_id=correlation_id)
        if self._held() and self._consume is None and id == self._ticket.id:
            self._consume = {"id": id, **args}
            ticket = dataclasses.replace(self._ticket, state="consumed", consumed_at=now,
                                         consumed_correlation_id=correlation_id)
            self._outbox = ticket_event("consumed", ticket, actor=subject_id, at=now,
                                        correlation_id=correlation_id)
            return ticket
        await self._open()
        return await super().consume_ticket(id, **args)

    async def ensure_task(self, id: str, created_by: str, at: float) -> TaskRecord:
        if self._held() and self._consume is not None and self._task is None:
            if self._read is not None and self._read.id == id:
                # As the pre-read found it: the call re-checks it under the task's row lock
                # (the seq it predicts), as it would a task read here.
                task = self._read.task
            else:
                async with self._store._unit(write=False, single=True) as q:
                    task = await get_task(q, id)
            self._task = (id, created_by, at)
            self._task_seq = 0 if task is None else task.last_seq
            if task is not None:
                return task
            return TaskRecord(id=id, state="pending", progress=0, result=None,
                              created_by=created_by, created_at=at, updated_at=at, last_seq=0)
        await self._open()
        return await super().ensure_task(id, created_by, at)

    async def append_event(self, task_id: str, kind: str, actor: str, data: Json, at: float, *,
                           state: str | None = None, progress: int | None = None,
                           result: Json | None = None,
                           claimant: str | None = None) -> EventRecord:
        if (self._held() and self._task is not None and self._task[0] == task_id
                and self._event is None and state is None and progress is None and result is None
                and claimant is None):
            seq = self._task_seq + 1
            self._event = (task_id, kind, actor, data, at, seq)
            return EventRecord(task_id=task_id, seq=seq, kind=kind, at=float(at), actor=actor,
                               data=data)
        await self._open()
        return await super().append_event(task_id, kind, actor, data, at, state=state,
                                          progress=progress, result=result, claimant=claimant)

    async def stage_audit(self, entry: dict[str, Any], at: float) -> int:
        """The run's last write: every held write and this record go in the one call now."""
        if not self._held():
            await self._open()
            return await super().stage_audit(entry, at)
        return await self._send(dump_json(entry), at)

    # ------------------------------------------------------------------ sending
    def _held(self) -> bool:
        if self._sent:
            raise StoreError("the run's writes were already sent")
        return self._stack is None

    async def _send(self, entry: str | None, at: float | None) -> int:
        self._sent = True
        c, task, event, ev = self._consume, self._task, self._event, self._outbox
        assert c is not None  # a RunTx holds writes only from its consumption on
        args = [
            c["now"], c["correlation_id"], c["id"], c["nonce_hash"], c["subject_id"], c["env"],
            c["action"], c["resource_hash"], c["command_hash"],
            ev.id, ev.type, ev.at, dump_json(ev.data), ev.next_attempt_at, ev.window_start,
            *(task if task is not None else (None, None, None)),
            *((event[1], event[2], event[4], dump_json(event[3]), event[5])
              if event is not None else (None, None, None, None, None)),
            at, entry,
        ]
        try:
            row, sqlstate = await self._store._call_run(CALL, args, c["id"], c["correlation_id"])
        except StoreOutcomeUnknown as exc:
            if entry is not None:
                exc.staged_of = self._staged_of(entry)
            raise
        if sqlstate == TICKET_REFUSED:
            async with self._store._unit(write=False, single=True) as q:
                current = await q.one(_CURRENT, c["id"])
            presented = Binding(c["nonce_hash"], c["subject_id"], c["env"], c["action"],
                                c["resource_hash"], c["command_hash"])
            raise consume_refusal(c["id"], current, presented, c["now"])
        if sqlstate == SEQ_TAKEN:
            raise Conflict("state_conflict", current_state="task_event_seq_taken")
        assert row is not None
        return -1 if row["staged"] is None else int(row["staged"])

    def _staged_of(self, entry: str) -> Callable[[], Awaitable[int | None]]:
        """The staging id of ``entry`` (as sent) while it waits in ``audit_staged`` (unsealed
        rows only: a short table)."""
        store = self._store

        async def find() -> int | None:
            async with store._unit(write=False, single=True) as q:
                row = await q.one("SELECT id FROM audit_staged WHERE entry = ? "
                                  "ORDER BY id LIMIT 1", entry)
            return None if row is None else int(row["id"])

        return find

    async def finish(self) -> None:
        """The run's block ended without an exception: send what is still held."""
        if self._stack is not None:
            stack, self._stack = self._stack, None
            await stack.aclose()  # COMMIT
        elif not self._sent and self._consume is not None:
            await self._send(None, None)

    async def abort(self, exc: BaseException) -> None:
        """The run's block raised: roll back an opened transaction (held writes are dropped)."""
        if self._stack is not None:
            stack, self._stack = self._stack, None
            await stack.__aexit__(type(exc), exc, exc.__traceback__)

    async def _open(self) -> Query:
        """An ordinary transaction from here on, with the held writes replayed into it."""
        if self._sent:
            raise StoreError("the run's writes were already sent")
        if self._stack is None:
            stack = AsyncExitStack()
            self._q = await stack.enter_async_context(self._store._unit(write=True))
            self._stack = stack
            c, task, event = self._consume, self._task, self._event
            self._consume = self._task = self._event = None
            if c is not None:
                await super().consume_ticket(c.pop("id"), **c)
            if task is not None:
                await super().ensure_task(*task)
            if event is not None:
                done = await super().append_event(*event[:5])
                if done.seq != event[5]:
                    raise Conflict("state_conflict", current_state="task_event_seq_taken")
        return self._q

    def _unit(self, *, write: bool, single: bool = False) -> Any:
        return _Opened(self)


class _Opened:
    """``RunTx._unit``: opens the ordinary transaction, then is its query."""

    __slots__ = ("_tx",)

    def __init__(self, tx: RunTx) -> None:
        self._tx = tx

    async def __aenter__(self) -> Query:
        q = await self._tx._open()
        return await q.__aenter__()

    async def __aexit__(self, *exc: Any) -> None:
        await self._tx._q.__aexit__(*exc)


@asynccontextmanager
async def run_transaction(store: PostgresCalls, ticket: TicketRecord,
                          task: TaskRead | None = None) -> AsyncIterator[RunTx]:
    tx = RunTx(store, ticket, task)
    try:
        yield tx
    except BaseException as exc:
        await tx.abort(exc)
        raise
    await tx.finish()
