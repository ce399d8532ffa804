"""SQLite's write BEGIN on the event loop's thread (``_Connection._begin_inline``): taken when it
cannot wait, left to the connection's thread whenever it could (the writers' lock held, SQLite's
own lock held by a writer outside it, a call still queued on the thread)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from service.store.sqlite import SqliteStore

from .sqlite_locks import write_lock_held


async def write(store: SqliteStore, n: int) -> None:
    async with store.transaction() as tx:
        await tx.stage_audit({"n": n}, 1.0)


async def waits_while_the_loop_runs(work: asyncio.Future[None]) -> None:
    """``work`` is still waiting for the other process's lock (held 2 s) after the loop ran
    something else. Where it waits is told by the thread's calls: a BEGIN on the thread is one
    more than the COMMIT alone."""
    await asyncio.sleep(0.1)
    assert not work.done()


async def test_a_free_write_lock_is_taken_without_a_thread_hop(tmp_path: Path) -> None:
    store = await SqliteStore.open(str(tmp_path / "s.db"))
    try:
        writer = store._writer
        await write(store, 0)
        before = writer._queued
        await write(store, 1)
        assert writer._queued - before == 1  # the COMMIT only: BEGIN ran on the loop
        async with store.transaction() as tx:
            assert await tx.stage_audit({"n": 2}, 1.0) > 0
    finally:
        await store.close()


async def test_a_writer_outside_the_lock_makes_the_thread_wait_not_the_loop(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    store = await SqliteStore.open(str(path))
    try:
        writer = store._writer
        await write(store, 0)
        busy_ms = writer._db.execute("PRAGMA busy_timeout").fetchone()[0]
        async with write_lock_held(path, hold_s=2.0, flock=False) as outsider:
            before = writer._queued
            work = asyncio.ensure_future(write(store, 1))
            await waits_while_the_loop_runs(work)
            await work  # written once the outsider let go
            assert writer._queued - before == 2  # BEGIN went to the thread, then COMMIT
            # The connection's busy timeout is what it was.
            assert writer._db.execute("PRAGMA busy_timeout").fetchone()[0] == busy_ms
        assert outsider.returncode == 0
        await write(store, 2)
    finally:
        await store.close()


async def test_a_held_writers_lock_leaves_the_begin_to_the_thread(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store = await SqliteStore.open(str(path))
    try:
        await write(store, 0)
        async with write_lock_held(path, hold_s=2.0) as holder:
            before = store._writer._queued
            work = asyncio.ensure_future(write(store, 1))
            await waits_while_the_loop_runs(work)
            await work
            assert store._writer._queued - before == 2
        assert holder.returncode == 0
    finally:
        await store.close()


async def test_a_call_queued_on_the_thread_keeps_the_begin_behind_it(tmp_path: Path) -> None:
    """A ROLLBACK queued by a failed batch must end that batch, not the next one: while any call
    is queued or running on the connection's thread, the BEGIN queues behind it."""
    store = await SqliteStore.open(str(tmp_path / "s.db"))
    try:
        writer = store._writer
        await write(store, 0)
        release, finished = threading.Event(), []

        def slow(db: object) -> None:
            release.wait(10)
            finished.append("slow")

        queued = asyncio.ensure_future(writer._call(slow))
        await asyncio.sleep(0)
        opened = asyncio.ensure_future(writer.begin(True))
        await asyncio.sleep(0.2)
        assert not opened.done()  # behind the queued call, not on the loop
        release.set()
        await queued
        await opened
        assert finished == ["slow"]
        await writer.commit()
        await write(store, 1)
    finally:
        await store.close()


async def test_a_batch_that_begins_at_once_has_no_task_to_wait_for(tmp_path: Path) -> None:
    """A new batch whose BEGIN cannot wait opens in its constructor: its first member finds it
    open (no task, no loop iteration); behind a held lock it is a task the member waits on."""
    path = tmp_path / "s.db"
    store = await SqliteStore.open(str(path))
    try:
        await write(store, 0)
        async with store.transaction() as tx:
            batch = store._batch
            assert batch is not None and batch.opened.done()
            assert not isinstance(batch.opened, asyncio.Task)
            await tx.stage_audit({"n": 1}, 1.0)
        async with write_lock_held(path, hold_s=0.5):
            work = asyncio.ensure_future(write(store, 2))
            await asyncio.sleep(0.1)
            assert store._batch is not None and isinstance(store._batch.opened, asyncio.Task)
            assert not store._batch.opened.done()
            await work
    finally:
        await store.close()
