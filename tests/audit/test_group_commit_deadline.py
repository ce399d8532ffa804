"""The group commit answers each caller by its own deadline (the store's, or what is left of its
request's), with one timer for all of them: a caller whose deadline passes is answered
StoreUnavailable while the commit goes on for the others; one that leaves is skipped."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from service.audit.log import AuditLog
from service.deadline import budget
from service.store.base import StoreUnavailable
from service.store.sqlite import SqliteStore
from tests.store.sqlite_locks import write_lock_held


async def test_each_caller_is_answered_at_its_own_deadline_while_the_commit_waits(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    store = await SqliteStore.open(str(path), busy_timeout_s=1.5)
    log = AuditLog(store)
    try:
        await log.append({"action": "approvals.read", "n": 0})  # the tip is started
        async with write_lock_held(path, hold_s=4.0):  # the commit's BEGIN waits for it
            with budget(30.0):  # the store's deadline (1.5 s) comes first
                late = asyncio.ensure_future(log.append({"action": "approvals.read", "n": 1}))
            await asyncio.sleep(0.05)
            with budget(0.2):  # sooner than the timer armed for ``late``: it is moved
                soon = asyncio.ensure_future(log.append({"action": "approvals.read", "n": 2}))
            with budget(0.2):
                gone = asyncio.ensure_future(log.append({"action": "approvals.read", "n": 3}))
            await asyncio.sleep(0)
            gone.cancel()  # a caller that left is skipped, not answered
            with pytest.raises(StoreUnavailable, match="deadline exceeded"):
                await soon
            # Answered by its own deadline, not with the commit: the commit ``late`` waits for
            # is still going on (it gives up at the store's deadline, before the lock is free).
            assert not late.done()
            with pytest.raises(StoreUnavailable):
                await late
            assert gone.cancelled()
        # The store answers again: the next caller's record commits, and the chain holds.
        record = await log.append({"action": "approvals.read", "n": 4})
        assert not log._pending and not log._committing
        count, broken = await log.verify()
        assert broken is None and count == record.seq
    finally:
        await store.close()


async def test_a_callers_wait_for_the_commit_comes_out_of_its_requests_budget(
    tmp_path: Path,
) -> None:
    """The time a caller waits for its record's group commit is charged to its request's store
    budget: what is left after it is what its next store call may wait."""
    from service import deadline

    path = tmp_path / "s.db"
    store = await SqliteStore.open(str(path), busy_timeout_s=5.0)
    log = AuditLog(store)
    try:
        await log.append({"action": "approvals.read", "n": 0})  # the tip is started
        async with write_lock_held(path, hold_s=0.4):  # the commit waits ~0.4 s for the lock
            with budget(3.0):
                await log.append({"action": "approvals.read", "n": 1})
                left = deadline.call_deadline(60.0) - asyncio.get_running_loop().time()
        assert left <= 3.0 - 0.3
    finally:
        await store.close()
