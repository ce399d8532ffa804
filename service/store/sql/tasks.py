"""Tasks and their step events in SQL."""
# ruff: noqa: S608  (statements are built from module constants; caller data is always bound)

from __future__ import annotations

from ..base import TASK_STATES, Conflict, EventRecord, Json, NotFound, StoreError, TaskRecord
from .core import MAX_LIST_LIMIT, Query, Row, Unit

__all__ = ["TASK_COLUMNS", "TaskSql", "get_task", "task_of"]

#: A task row's columns (a chain run's ticket pre-read reads its task with them too).
TASK_COLUMNS = (
    "id, state, progress, result, created_by, created_at, updated_at, last_seq, claimed_by"
)
_EVENT_COLUMNS = "task_id, seq, kind, at, actor, data"


# Incrementing last_seq on the task row locks it until commit, so concurrent writers in any
# process queue up here and seqs come out gap-free: a rolled-back append rolls back its
# increment too. An executor's report (a claimant) claims an unclaimed task and applies only to
# a task unclaimed or claimed by the same subject: the condition is evaluated on the locked row,
# so of two executors racing to start a task exactly one claims it.
_BUMP = (
    "UPDATE tasks SET last_seq = last_seq + 1, updated_at = ?, "
    "state = COALESCE(?, state), progress = COALESCE(?, progress), "
    "result = COALESCE(?, result), claimed_by = COALESCE(claimed_by, CAST(? AS TEXT)) "
    "WHERE id = ? AND (CAST(? AS TEXT) IS NULL OR claimed_by IS NULL OR claimed_by = ?) "
    "RETURNING last_seq AS seq"
)
# PostgreSQL: the same UPDATE and the event's INSERT in one statement (no row: no such task).
# The casts give the SELECT list's parameters the columns' types.
_BUMP_AND_APPEND = (
    f"WITH bumped AS ({_BUMP}) INSERT INTO task_events ({_EVENT_COLUMNS}) "
    "SELECT ?::text, seq, ?::text, ?::double precision, ?::text, ?::jsonb FROM bumped "
    "RETURNING seq"
)


def task_of(q: Query, row: Row, prefix: str = "") -> TaskRecord:
    """A task from ``row``'s ``tasks`` columns (named with ``prefix``)."""
    result = row[prefix + "result"]
    return TaskRecord(
        id=row[prefix + "id"],
        state=row[prefix + "state"],
        progress=int(row[prefix + "progress"]),
        result=None if result is None else q.dialect.json_out(result),
        created_by=row[prefix + "created_by"],
        created_at=float(row[prefix + "created_at"]),
        updated_at=float(row[prefix + "updated_at"]),
        last_seq=int(row[prefix + "last_seq"]),
        claimed_by=row[prefix + "claimed_by"],
    )


def _event(q: Query, row: Row) -> EventRecord:
    return EventRecord(
        task_id=row["task_id"],
        seq=int(row["seq"]),
        kind=row["kind"],
        at=float(row["at"]),
        actor=row["actor"],
        data=q.dialect.json_out(row["data"]),
    )


async def get_task(q: Query, id: str) -> TaskRecord | None:
    """One task by id (None: no such task), through ``q``: a store's or a transaction's."""
    row = await q.one(f"SELECT {TASK_COLUMNS} FROM tasks WHERE id = ?", id)
    return None if row is None else task_of(q, row)


class TaskSql(Unit):
    """``base.TaskOps`` over the ``tasks`` and ``task_events`` tables."""

    __slots__ = ()

    async def ensure_task(self, id: str, created_by: str, at: float) -> TaskRecord:
        async with self._unit(write=True) as q:
            # A new task comes back from the INSERT itself; only an existing one is read.
            row = await q.one(
                f"INSERT INTO tasks ({TASK_COLUMNS}) VALUES (?, 'pending', 0, NULL, ?, ?, ?, 0, NULL) "
                f"ON CONFLICT (id) DO NOTHING RETURNING {TASK_COLUMNS}",
                id, created_by, at, at,
            )  # fmt: skip
            task = task_of(q, row) if row is not None else await get_task(q, id)
        if task is None:  # pragma: no cover - the row was just inserted or already there
            raise StoreError("task vanished")
        return task

    async def get_task(self, id: str) -> TaskRecord | None:
        async with self._unit(write=False) as q:
            return await get_task(q, id)

    async def list_tasks(self, state: str, limit: int = 100) -> list[TaskRecord]:
        if state not in TASK_STATES:
            raise ValueError(f"invalid task state {state!r}")
        if limit < 1:
            raise ValueError("limit must be positive")
        async with self._unit(write=False) as q:
            rows = await q.all(
                f"SELECT {TASK_COLUMNS} FROM tasks WHERE state = ? ORDER BY created_at, id "
                "LIMIT ?",
                state, min(limit, MAX_LIST_LIMIT),
            )  # fmt: skip
            return [task_of(q, r) for r in rows]

    async def append_event(
        self,
        task_id: str,
        kind: str,
        actor: str,
        data: Json,
        at: float,
        *,
        state: str | None = None,
        progress: int | None = None,
        result: Json | None = None,
        claimant: str | None = None,
    ) -> EventRecord:
        if state is not None and state not in TASK_STATES:
            raise ValueError(f"invalid task state {state!r}")
        async with self._unit(write=True) as q:
            d = q.dialect
            bump = (at, state, progress, None if result is None else d.json_in(result),
                    claimant, task_id, claimant, claimant)
            if d.writes_in_cte:  # both writes in one round trip
                row = await q.one(_BUMP_AND_APPEND, *bump, task_id, kind, at, actor,
                                  d.json_in(data))
            else:
                row = await q.one(_BUMP, *bump)
            if row is None:
                task = await get_task(q, task_id)
                if task is None:
                    raise NotFound("task", task_id)
                raise Conflict("task_claimed", current_state=task.state)
            seq = int(row["seq"])
            if not d.writes_in_cte:
                await q.exec(
                    f"INSERT INTO task_events ({_EVENT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)",
                    task_id, seq, kind, at, actor, d.json_in(data),
                )  # fmt: skip
        return EventRecord(task_id=task_id, seq=seq, kind=kind, at=float(at), actor=actor,
                           data=data)  # fmt: skip

    async def list_events(
        self, task_id: str, after_seq: int = 0, limit: int = 100
    ) -> list[EventRecord]:
        if limit < 1:
            raise ValueError("limit must be positive")
        async with self._unit(write=False) as q:
            rows = await q.all(
                f"SELECT {_EVENT_COLUMNS} FROM task_events WHERE task_id = ? AND seq > ? "
                "ORDER BY seq LIMIT ?",
                task_id, after_seq, min(limit, MAX_LIST_LIMIT),
            )  # fmt: skip
            return [_event(q, r) for r in rows]
