"""Exactly-once and gap-free guarantees under real concurrency: several OS processes, one database.

PostgreSQL stands for several replicas (4 processes), SQLite for several workers on one machine
(2 processes on one file). Each process has its own pool, so contention is between connections
and processes, not just coroutines.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import sqlite3
from collections import Counter
from typing import Any

import asyncpg

from service.store import Store, sqlite_path
from service.store.sql import migrations

from . import race
from .conftest import Target
from .helpers import T0, approved_ticket

TICKETS = 50
ATTEMPTS_PER_TICKET = 20


def _processes(target: Target) -> int:
    return 4 if target.backend == "postgres" else 2


def _spawn(target: Target, job: str, per_process: list[dict[str, Any]]) -> list[Any]:
    """Run ``job`` in one spawned process per argument set; return their results in order."""
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(len(per_process))
    queues = [ctx.Queue() for _ in per_process]
    procs = [
        ctx.Process(target=race.run, args=(job, target.url, target.schema, barrier, q, args))
        for q, args in zip(queues, per_process, strict=True)
    ]
    for p in procs:
        p.start()
    try:
        outcomes = [q.get(timeout=120) for q in queues]
    finally:
        for p in procs:
            p.join(timeout=30)
        for q in queues:
            q.close()
            q.join_thread()
    errors = [text for status, text in outcomes if status != "ok"]
    assert not errors, "\n".join(errors)
    assert all(p.exitcode == 0 for p in procs)
    return [result for _, result in outcomes]


async def test_concurrent_consume_exactly_once(store: Store, target: Target) -> None:
    ids = [f"t-{i:02d}" for i in range(TICKETS)]
    for ticket_id in ids:
        await approved_ticket(store, ticket_id)
    n = _processes(target)
    per_process = [{"ticket_ids": ids, "attempts": ATTEMPTS_PER_TICKET // n}] * n
    results = await asyncio.to_thread(_spawn, target, "consume", per_process)
    outcomes = [o for process in results for o in process]
    assert len(outcomes) == TICKETS * ATTEMPTS_PER_TICKET
    wins = Counter(t for t, outcome in outcomes if outcome == "won")
    assert wins == Counter({t: 1 for t in ids})  # exactly one winner per ticket
    losers = Counter(outcome for _, outcome in outcomes if outcome != "won")
    assert losers == Counter({"ticket_consumed": TICKETS * (ATTEMPTS_PER_TICKET - 1)})
    tickets, _ = await store.list_tickets(state="consumed", limit=TICKETS)
    assert len(tickets) == TICKETS


async def test_concurrent_append_event_gap_free(store: Store, target: Target) -> None:
    await store.ensure_task("task-1", "alice", T0)
    per_writer = 60
    results = await asyncio.to_thread(
        _spawn,
        target,
        "append",
        [{"task_id": "task-1", "writer": w, "count": per_writer} for w in ("w1", "w2")],
    )
    total = 2 * per_writer
    assert sorted(s for seqs in results for s in seqs) == list(range(1, total + 1))
    events = await store.list_events("task-1", limit=500)
    assert [e.seq for e in events] == list(range(1, total + 1))
    assert Counter(e.data["writer"] for e in events) == {"w1": per_writer, "w2": per_writer}
    task = await store.get_task("task-1")
    assert task is not None and task.last_seq == total


async def test_concurrent_start_migrates_once(target: Target) -> None:
    n = _processes(target) + 2
    results = await asyncio.to_thread(_spawn, target, "open", [{}] * n)
    assert results == ["opened"] * n
    if target.backend == "sqlite":
        db = sqlite3.connect(sqlite_path(target.url))
        try:
            rows = db.execute("SELECT version FROM schema_migrations").fetchall()
        finally:
            db.close()
    else:
        conn = await asyncpg.connect(target.url)
        try:
            rows = await conn.fetch(f'SELECT version FROM "{target.schema}".schema_migrations')  # noqa: S608
        finally:
            await conn.close()
    # Every shipped migration, each applied once.
    assert sorted(tuple(r) for r in rows) == [(m.version,) for m in migrations(target.backend)]
