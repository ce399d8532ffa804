"""Worker processes for the race tests (spawned: each has its own interpreter and event loop)."""

from __future__ import annotations

import asyncio
import traceback
from typing import Any

from service.audit.log import AuditLog
from service.store import Conflict, StoreError, open_store
from service.store.base import ThrottleRule

from .helpers import T0, binding, ticket


def run(
    job: str, url: str, schema: str | None, barrier: Any, queue: Any, args: dict[str, Any]
) -> None:
    """Process entry point: run ``job`` and put ``("ok", result)`` or ``("error", text)``."""
    try:
        result = asyncio.run(_JOBS[job](url, schema, barrier, **args))
        queue.put(("ok", result))
    except BaseException:
        queue.put(("error", traceback.format_exc()))


async def _consume(
    url: str, schema: str | None, barrier: Any, ticket_ids: list[str], attempts: int
) -> list[tuple[str, str]]:
    store = await open_store(url, schema=schema)
    try:
        # Start together, so attempts from all processes overlap.
        await asyncio.to_thread(barrier.wait, 30)

        async def attempt(ticket_id: str, n: int) -> tuple[str, str]:
            kw = binding(ticket(ticket_id), correlation_id=f"{ticket_id}-{n}")
            try:
                await store.consume_ticket(ticket_id, **kw)
            except Conflict as exc:
                return ticket_id, exc.reason
            except StoreError as exc:
                return ticket_id, type(exc).__name__
            return ticket_id, "won"

        return list(
            await asyncio.gather(*(attempt(t, n) for n in range(attempts) for t in ticket_ids))
        )
    finally:
        await store.close()


async def _append(
    url: str, schema: str | None, barrier: Any, task_id: str, writer: str, count: int
) -> list[int]:
    store = await open_store(url, schema=schema)
    try:
        await asyncio.to_thread(barrier.wait, 30)
        events = await asyncio.gather(
            *(
                store.append_event(task_id, "step", writer, {"writer": writer, "i": i}, T0 + i)
                for i in range(count)
            )
        )
        return [e.seq for e in events]
    finally:
        await store.close()


async def _claim(
    url: str, schema: str | None, barrier: Any, task_ids: list[str], writer: str
) -> list[str]:
    """``writer`` reports ``started`` on every task at once, as an executor claiming it; per
    task "won" or the conflict's reason."""
    store = await open_store(url, schema=schema)
    try:
        await asyncio.to_thread(barrier.wait, 30)

        async def claim(task_id: str) -> str:
            try:
                await store.append_event(task_id, "started", writer, {}, T0 + 1,
                                         state="running", progress=0, claimant=writer)
            except Conflict as exc:
                return exc.reason
            return "won"

        return list(await asyncio.gather(*(claim(t) for t in task_ids)))
    finally:
        await store.close()


async def _open(url: str, schema: str | None, barrier: Any) -> str:
    await asyncio.to_thread(barrier.wait, 30)
    store = await open_store(url, schema=schema)
    try:
        await store.ping()
        return "opened"
    finally:
        await store.close()


async def _reserve(
    url: str, schema: str | None, barrier: Any, key: str, limit: int, attempts: int, now: float
) -> int:
    """``attempts`` concurrent reservations of one budget; returns how many were granted."""
    rules = [ThrottleRule(key, 300.0, limit), ThrottleRule("login:subject:race", 300.0)]
    store = await open_store(url, schema=schema)
    try:
        await asyncio.to_thread(barrier.wait, 30)
        verdicts = await asyncio.gather(
            *(store.reserve_attempt(rules, now) for _ in range(attempts))
        )
        return sum(v.granted for v in verdicts)
    finally:
        await store.close()


async def _audit(
    url: str, schema: str | None, barrier: Any, writer: str, count: int, stage: bool
) -> int:
    """``count`` concurrent runs, each writing one audit record in its own transaction: staged
    and then sealed by this process's sealer (``stage``), or appended under the head's lock."""
    store = await open_store(url, schema=schema)
    log = AuditLog(store)
    try:
        await asyncio.to_thread(barrier.wait, 30)

        async def run(i: int) -> None:
            entry = {"writer": writer, "i": i}
            async with store.transaction() as tx:
                if not stage:
                    await log.append(entry, tx)
                    return
                staged = await log.stage(entry, tx)
            await log.settle(staged)

        await asyncio.gather(*(run(i) for i in range(count)))
        return count
    finally:
        await store.close()


_JOBS: dict[str, Any] = {
    "consume": _consume, "append": _append, "claim": _claim, "open": _open, "reserve": _reserve,
    "audit": _audit,
}
