"""Exactly-once and gap-free guarantees under real concurrency: several OS processes, one database.

PostgreSQL stands for several replicas (4 processes), SQLite for several workers on one machine
(2 processes on one file). Each process has its own pool, so contention is between connections
and processes, not just coroutines.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import sqlite3
import time
from collections import Counter
from typing import Any
from unittest.mock import ANY

import asyncpg

from service.audit.log import STAGED_GRACE_S, UNSEALED_PROBLEM_S, AuditLog
from service.store import Store, open_store, sqlite_path
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


async def test_racing_executors_claim_each_task_exactly_once(store: Store, target: Target) -> None:
    """Every process reports ``started`` on the same 30 pending tasks at once: each task is
    claimed by exactly one executor, the others get ``task_claimed``, and the one event each task
    holds is its claimant's."""
    task_ids = [f"task-{n}" for n in range(30)]
    for task_id in task_ids:
        await store.ensure_task(task_id, "alice", T0)
    writers = [f"executor-{n}" for n in range(_processes(target))]
    results = await asyncio.to_thread(
        _spawn, target, "claim", [{"task_ids": task_ids, "writer": w} for w in writers])
    for index, task_id in enumerate(task_ids):
        outcomes = Counter(result[index] for result in results)
        assert outcomes == {"won": 1, "task_claimed": len(writers) - 1}, (task_id, outcomes)
        winner = writers[[result[index] for result in results].index("won")]
        task = await store.get_task(task_id)
        assert task is not None
        assert (task.state, task.claimed_by, task.last_seq) == ("running", winner, 1)
        assert [e.actor for e in await store.list_events(task_id)] == [winner]


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


async def test_concurrent_audit_writers_keep_one_verifiable_chain(store: Store, target: Target) -> None:
    """Writers in several processes, staging (sealed in batches by each process's sealer) and
    appending under the head's lock at once: every record is in the chain exactly once, the
    chain verifies, nothing is left staged."""
    n, count = _processes(target), 40
    per_process = [{"writer": f"w{p}", "count": count, "stage": p % 2 == 0} for p in range(n)]
    assert await asyncio.to_thread(_spawn, target, "audit", per_process) == [count] * n
    log = AuditLog(store)
    records = [r async for r in log.records()]
    assert sorted((r.entry["writer"], r.entry["i"]) for r in records) == sorted(
        (f"w{p}", i) for p in range(n) for i in range(count))
    assert [r.seq for r in records] == list(range(1, n * count + 1))
    assert await log.verify() == (n * count, None)
    assert await store.audit_staged(time.time() + 3600) == (0, None)


async def test_records_left_staged_by_a_stopped_store_are_sealed_by_another(
    store: Store, target: Target
) -> None:
    """A store instance that committed staged records and stopped before sealing them: another
    instance's sweep seals them once they are past the grace period; ``verify`` reports them
    once they are older than its bound."""
    first = await open_store(target.url, schema=target.schema)
    try:
        staged_at = time.time() - UNSEALED_PROBLEM_S - 5
        async with first.transaction() as tx:
            for i in range(3):
                await tx.stage_audit({"left": i}, staged_at)
        await first.stage_audit({"fresh": True}, time.time())  # not past the grace yet
    finally:
        await first.close()  # "crashed": nothing sealed

    log = AuditLog(store)
    result = await log.verify_signed({})
    assert [(p.seq, p.reason) for p in result.problems] == [(1, "unsealed")]
    assert await log.sweep(time.time()) == 3
    assert [r.entry for r in [r async for r in log.records()]] == [{"left": i} for i in range(3)]
    result = await log.verify_signed({})
    assert result.problems == [] and result.records == 3
    # The fresh one is left to its own worker until it is past the grace, then swept too.
    assert await store.audit_staged(time.time() + STAGED_GRACE_S + 1) == (1, ANY)
    assert await log.sweep(time.time() + STAGED_GRACE_S + 1) == 1
    assert await log.verify() == (4, None)
