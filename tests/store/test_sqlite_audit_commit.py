"""SQLite's group commit of audit records runs whole on the writer's thread while the writer is
idle (``SqliteStore.append_audit_many``, ``_Connection.locked``, ``sql.audit.append_locked``):
one call, the same chain as the generic path, the tip told on the loop, and a failure that
leaves neither a transaction nor the writers' lock behind. With a transaction open, it joins
the open batch as before."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from service.audit.log import AuditLog
from service.audit.record import seal, verify
from service.store.base import StoreError
from service.store.sqlite import SqliteStore


def _entries(n: int, tag: str = "read") -> list[dict[str, object]]:
    return [{"action": "databases.list", "outcome": "executed", "tag": tag, "i": i}
            for i in range(n)]


def _thread_calls(store: SqliteStore) -> int:
    """Calls the writer's thread has taken so far."""
    return store._writer._thread.taken


def _locked_calls(store: SqliteStore) -> list[int]:
    """Each ``_Connection.locked`` call of the store's writer from now on."""
    seen: list[int] = []
    locked = store._writer.locked

    async def counted(fn, committed=None):  # type: ignore[no-untyped-def]
        seen.append(1)
        return await locked(fn, committed)

    store._writer.locked = counted  # type: ignore[method-assign]
    return seen


async def test_an_idle_writer_commits_a_batch_in_one_call_and_chains_it_as_before(
        tmp_path: Path) -> None:
    path = str(tmp_path / "a.db")
    one, two = await SqliteStore.open(path), await SqliteStore.open(path)
    try:
        first, second = AuditLog(one), AuditLog(two)
        for log in (first, second):
            log.tip.start()
        seen, before = _locked_calls(one), _thread_calls(one)
        mine = await asyncio.gather(*(first.append(e) for e in _entries(8)))
        assert seen == [1] and _thread_calls(one) == before + 1  # BEGIN to COMMIT: one call
        assert [r.seq for r in mine] == list(range(1, 9))
        assert first.tip.known == (8, mine[-1].hash)
        # Another worker appends: this one reads and verifies those records before extending
        # the head, and its tip moves past them.
        theirs = await asyncio.gather(*(second.append(e) for e in _entries(3, "other")))
        seen.clear()
        before = _thread_calls(one)
        again = await first.append(_entries(1, "again")[0])
        assert seen == [1] and _thread_calls(one) == before + 1
        assert again.seq == 12 and again.prev_hash == theirs[-1].hash
        assert first.tip.known == (12, again.hash)
        stored = await one.audit_range(0, 100)
        assert [r.seq for r in stored] == list(range(1, 13))
        assert verify(stored) == (12, None)
    finally:
        await one.close()
        await two.close()


async def test_with_a_transaction_open_the_records_join_its_batch(tmp_path: Path) -> None:
    store = await SqliteStore.open(str(tmp_path / "a.db"))
    try:
        log = AuditLog(store)
        log.tip.start()
        seen = _locked_calls(store)
        async with store.transaction() as tx:
            await tx.stage_audit({"n": 1}, 1.0)
            # Open here: the group commit may not begin a transaction of its own on the
            # connection, it joins this batch (and commits with it).
            appended = asyncio.ensure_future(log.append(_entries(1)[0]))
            await asyncio.sleep(0.05)
            assert not appended.done()
        record = await appended
        assert record.seq == 1
        assert seen == []
    finally:
        await store.close()


async def test_a_failed_commit_leaves_no_transaction_and_no_lock(tmp_path: Path) -> None:
    path = str(tmp_path / "a.db")
    store, other = await SqliteStore.open(path), await SqliteStore.open(path)
    try:
        log = AuditLog(store)
        log.tip.start()
        await other._writer.locked(lambda db: db.execute(
            "CREATE TRIGGER refuse BEFORE INSERT ON audit_log WHEN NEW.entry LIKE '%refused%' "
            "BEGIN SELECT RAISE(ABORT, 'refused'); END"))
        with pytest.raises(StoreError):
            await store.append_audit_many(_entries(2, "refused"), seal, guard=log.tip)
        assert not store._writer._db.in_transaction
        # Neither the writers' lock nor SQLite's is held: another process's store writes, and
        # this one goes on.
        async with other.transaction() as tx:
            await tx.stage_audit({"n": 1}, 1.0)
        records = await store.append_audit_many(_entries(2), seal, guard=log.tip)
        assert [r.seq for r in records] == [1, 2]
    finally:
        await store.close()
        await other.close()
