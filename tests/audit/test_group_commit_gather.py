"""A group commit lets the event loop run ``GATHER_TURNS`` turns before it takes its batch: the
records of requests already on their way (a few turns from their append) share its commit
instead of each paying one of their own."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from service.audit.log import GATHER_TURNS, AuditLog
from service.store.base import AuditRecord
from service.store.sqlite import SqliteStore


async def test_records_appended_within_the_gather_turns_share_one_commit(tmp_path: Path) -> None:
    store = await SqliteStore.open(str(tmp_path / "s.db"))
    log = AuditLog(store)
    try:
        await log.append({"action": "approvals.read", "n": 0})  # the tip is started
        batches: list[int] = []
        append_many = store.append_audit_many

        async def counted(entries: Any, *args: Any, **kwargs: Any) -> list[AuditRecord]:
            batches.append(len(entries))
            return await append_many(entries, *args, **kwargs)

        store.append_audit_many = counted  # type: ignore[method-assign]

        async def after(turns: int, n: int) -> AuditRecord:
            for _ in range(turns):  # a request still being handled
                await asyncio.sleep(0)
            return await log.append({"action": "approvals.read", "n": n})

        records = await asyncio.gather(*(after(n % GATHER_TURNS, n) for n in range(1, 25)))
        assert batches == [24]
        # Every caller is answered with its own record, in the order they appended.
        assert [r.entry["n"] for r in sorted(records, key=lambda r: r.seq)] == sorted(
            range(1, 25), key=lambda n: (n % GATHER_TURNS, n))
        count, broken = await log.verify()
        assert broken is None and count == 25
    finally:
        await store.close()


async def test_an_idle_workers_record_is_committed_after_the_gather_turns_alone(
    tmp_path: Path,
) -> None:
    """Nothing else to gather: the record commits on its own, a few turns after its append."""
    store = await SqliteStore.open(str(tmp_path / "s.db"))
    log = AuditLog(store)
    try:
        first = await log.append({"action": "approvals.read", "n": 0})
        second = await log.append({"action": "approvals.read", "n": 1})
        assert (first.seq, second.seq) == (1, 2) and second.prev_hash == first.hash
        assert not log._pending and not log._committing
    finally:
        await store.close()
