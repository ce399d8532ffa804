"""SQLite's session check reads the row again only when the file changed (``get_session`` and
``PRAGMA data_version``): whoever commits a change to a session (this worker, another worker, a
process outside the server), the next check sees it; while nobody commits, or only the
workers' audit group commits noted as writing no session row (``_CommitNotes``), no row is
read."""

from __future__ import annotations

import asyncio
import sqlite3
import sys
from pathlib import Path

import pytest

from service.store.base import SessionRecord, StoreUnavailable
from service.store.sqlite import SqliteStore


def _session(id: str, now: float = 1_000.0) -> SessionRecord:
    return SessionRecord(id=id, subject_id="carol", kind="human", authn_method="password",
                         auth_time=now, created_at=now, expires_at=now + 3600)


def _selects(store: SqliteStore) -> list[str]:
    """The statements the store's inline reader runs from now on, as SQLite traces them."""
    seen: list[str] = []
    store._reader._db.set_trace_callback(seen.append)
    return seen


async def test_an_unchanged_file_reads_no_row_and_any_commit_reads_it_again(tmp_path: Path) -> None:
    path = str(tmp_path / "s.db")
    worker, other = await SqliteStore.open(path), await SqliteStore.open(path)
    try:
        await other.create_session(_session("s1"))
        traced = _selects(worker)
        first = await worker.get_session("s1")
        assert first is not None and first.revoked_at is None
        assert await worker.get_session("s1") == first
        assert await worker.get_session("nobody") is None
        assert await worker.get_session("nobody") is None
        rows = [s for s in traced if s.startswith("SELECT")]
        assert len(rows) == 2, traced  # s1 once, "nobody" once: the repeats read the version only

        # Another worker (its own connections) revokes it: seen by the next check.
        assert await other.revoke_session("s1", 1_010.0)
        assert (await worker.get_session("s1")).revoked_at == 1_010.0

        # This worker's own writer commits a step-up: seen too.
        await worker.create_session(_session("s2"))
        assert (await worker.get_session("s2")).step_up_at is None
        await worker.record_step_up("s2", 1_020.0, "totp")
        assert (await worker.get_session("s2")).step_up_at == 1_020.0

        # A process outside the server changes the row: seen at once.
        outsider = await asyncio.create_subprocess_exec(sys.executable, "-c", (
            "import sqlite3, sys; db = sqlite3.connect(sys.argv[1], isolation_level=None); "
            "db.execute(\"UPDATE sessions SET revoked_at = 1030.0 WHERE id = 's2'\")"), path)
        assert await asyncio.wait_for(outsider.wait(), 30) == 0
        assert (await worker.get_session("s2")).revoked_at == 1_030.0

        # A commit that does not touch sessions still reads the row again (nothing is assumed
        # about what a commit changed).
        before = len([s for s in traced if s.startswith("SELECT")])
        async with other.transaction() as tx:
            await tx.stage_audit({"n": 1}, 1.0)
        await worker.get_session("s2")
        assert len([s for s in traced if s.startswith("SELECT")]) == before + 1
    finally:
        await worker.close()
        await other.close()


async def test_a_reader_that_cannot_read_the_version_answers_as_the_store_does(
    tmp_path: Path,
) -> None:
    store = await SqliteStore.open(str(tmp_path / "s.db"))
    try:
        await store.create_session(_session("s1"))
        assert await store.get_session("s1") is not None
        real = store._reader.data_version

        def broken() -> int:
            raise sqlite3.OperationalError("disk I/O error")

        store._reader.data_version = broken  # type: ignore[method-assign]
        # No version, no copy: the row is read (and that read answers for the store).
        assert (await store.get_session("s1")).id == "s1"
        store._reader.data_version = real  # type: ignore[method-assign]
        assert (await store.get_session("s1")).id == "s1"
    finally:
        await store.close()


async def test_a_row_read_again_counts_as_one_read_and_reports_the_store(tmp_path: Path) -> None:
    """The re-read (``_session_now``) is not a unit, but the worker's metrics see it as one: one
    read transaction, served; and a reader that fails answers StoreUnavailable, reported."""
    path = str(tmp_path / "s.db")
    worker, other = await SqliteStore.open(path), await SqliteStore.open(path)
    try:
        await other.create_session(_session("s1"))
        opened: list[bool] = []
        outcomes: list[tuple[bool, bool]] = []
        worker.on_transaction = opened.append
        worker.on_outcome = lambda write, served: outcomes.append((write, served))
        assert (await worker.get_session("s1")).subject_id == "carol"
        assert await worker.get_session("s1") is not None  # the copy: nothing opened
        assert opened == [False] and outcomes == [(False, True)]

        await other.revoke_session("s1", 1_010.0)
        real = worker._reader._db

        class FailingReads:
            """The reader's connection with its reads failing as a broken disk's would."""

            def execute(self, sql: str, *args: object) -> sqlite3.Cursor:
                if sql.startswith("SELECT"):
                    raise sqlite3.OperationalError("disk I/O error")
                return real.execute(sql, *args)

        worker._reader._db = FailingReads()  # type: ignore[assignment]
        try:
            with pytest.raises(StoreUnavailable):
                await worker.get_session("s1")
        finally:
            worker._reader._db = real
        assert opened == [False, False] and outcomes == [(False, True), (False, False)]
        assert (await worker.get_session("s1")).revoked_at == 1_010.0
    finally:
        await worker.close()
        await other.close()


async def test_the_version_is_read_from_the_wal_index_without_a_statement(tmp_path: Path) -> None:
    """Once the reader has read, the version comes from the wal-index header in memory: a
    check of an unchanged file runs no statement at all, and every commit (this worker's
    writer, another worker's, a process outside the server) still moves it."""
    path = str(tmp_path / "s.db")
    worker, other = await SqliteStore.open(path), await SqliteStore.open(path)
    try:
        await other.create_session(_session("s1"))
        assert await worker.get_session("s1") is not None
        assert worker._reader._wal is not None
        traced = _selects(worker)
        for _ in range(3):
            assert (await worker.get_session("s1")).revoked_at is None
        assert traced == []  # neither the row nor PRAGMA data_version

        before = worker._reader.version()
        assert isinstance(before, bytes) and worker._reader.version() == before
        await other.revoke_session("s1", 1_010.0)
        moved = worker._reader.version()
        assert moved != before
        assert (await worker.get_session("s1")).revoked_at == 1_010.0
        await worker.create_session(_session("s2"))  # this worker's own writer
        assert worker._reader.version() != moved
        assert (await worker.get_session("s2")).step_up_at is None
        outsider = await asyncio.create_subprocess_exec(sys.executable, "-c", (
            "import sqlite3, sys; db = sqlite3.connect(sys.argv[1], isolation_level=None); "
            "db.execute(\"UPDATE sessions SET revoked_at = 1030.0 WHERE id = 's1'\")"), path)
        assert await asyncio.wait_for(outsider.wait(), 30) == 0
        assert (await worker.get_session("s1")).revoked_at == 1_030.0
    finally:
        await worker.close()
        await other.close()
    assert worker._reader._wal is None  # unmapped with its connection


async def test_a_header_that_does_not_read_consistent_falls_back_to_data_version(
    tmp_path: Path,
) -> None:
    """A header caught mid-write (its two copies differ) or unreadable is no version: the
    statement answers, and the session is read again as after any change."""
    path = str(tmp_path / "s.db")
    worker, other = await SqliteStore.open(path), await SqliteStore.open(path)
    try:
        await other.create_session(_session("s1"))
        assert await worker.get_session("s1") is not None
        wal = worker._reader._wal
        assert wal is not None
        header = wal.header()
        assert header is not None

        class Torn:
            def header(self) -> bytes | None:
                return None

            def close(self) -> None:
                wal.close()

        worker._reader._wal = Torn()  # type: ignore[assignment]
        traced = _selects(worker)
        await other.revoke_session("s1", 1_010.0)
        assert (await worker.get_session("s1")).revoked_at == 1_010.0
        assert traced[0] == "PRAGMA data_version" and traced[1].startswith("SELECT")
    finally:
        await worker.close()
        await other.close()


def test_a_database_not_in_wal_mode_has_no_wal_index(tmp_path: Path) -> None:
    from service.store.sqlite import _WalIndex

    db = sqlite3.connect(str(tmp_path / "plain.db"), isolation_level=None)
    try:
        db.execute("CREATE TABLE t (x)")
        assert _WalIndex.open(db) is None
    finally:
        db.close()


async def test_audit_group_commits_of_any_worker_keep_the_session_copies(tmp_path: Path) -> None:
    """A group commit of audit records (``append_audit_many``) writes no session row, and says
    so in the commit notes: the copies read before this worker's, or another worker's, still
    hold after them and are not read again. Any other commit in between (another worker's
    revocation, a process outside the server) drops them as before."""
    from service.audit.log import AuditLog

    path = str(tmp_path / "s.db")
    worker, other = await SqliteStore.open(path), await SqliteStore.open(path)
    try:
        log, others = AuditLog(worker), AuditLog(other)
        log.tip.start()
        others.tip.start()
        await other.create_session(_session("s1"))
        assert await worker.get_session("s1") is not None
        traced = _selects(worker)
        copy = await worker.get_session("s1")
        await log.append({"action": "databases.list", "outcome": "executed"})
        assert await worker.get_session("s1") is copy
        await others.append({"action": "databases.list", "outcome": "executed"})
        await others.append({"action": "databases.list", "outcome": "executed"})
        await log.append({"action": "databases.list", "outcome": "executed"})
        assert await worker.get_session("s1") is copy
        assert traced == []  # neither the row nor the version statement

        # Another worker's revocation between two group commits: read again, and seen.
        await others.append({"action": "databases.list", "outcome": "executed"})
        await other.revoke_session("s1", 1_010.0)
        await others.append({"action": "databases.list", "outcome": "executed"})
        assert (await worker.get_session("s1")).revoked_at == 1_010.0
        assert len([s for s in traced if s.startswith("SELECT")]) == 1

        # A process outside the server changes the row, then a worker commits its audit
        # records: the change is seen.
        await other.create_session(_session("s2"))
        assert (await worker.get_session("s2")).revoked_at is None
        outsider = await asyncio.create_subprocess_exec(sys.executable, "-c", (
            "import sqlite3, sys; db = sqlite3.connect(sys.argv[1], isolation_level=None); "
            "db.execute(\"UPDATE sessions SET revoked_at = 1030.0 WHERE id = 's2'\")"), path)
        assert await asyncio.wait_for(outsider.wait(), 30) == 0
        await others.append({"action": "databases.list", "outcome": "executed"})
        assert (await worker.get_session("s2")).revoked_at == 1_030.0
    finally:
        await worker.close()
        await other.close()


def test_the_commit_counter_is_read_from_the_header() -> None:
    """``_WalIndex.commits``: the difference of the headers' ``iChange`` (native byte order),
    modulo 2**32; one commit is the only case that carries session copies over."""
    from service.store.sqlite import _WalIndex

    def header(change: int, frames: int) -> bytes:
        return (bytes(8) + change.to_bytes(4, sys.byteorder) + bytes(4)
                + frames.to_bytes(4, sys.byteorder) + bytes(28))

    assert _WalIndex.commits(header(7, 10), header(8, 14)) == 1
    assert _WalIndex.commits(header(7, 10), header(9, 20)) == 2
    assert _WalIndex.commits(header(7, 10), header(7, 0)) == 0  # a WAL restart alone
    assert _WalIndex.commits(header(2**32 - 1, 10), header(0, 12)) == 1


def test_commit_notes_chain_only_noted_commits_one_after_another(tmp_path: Path) -> None:
    """``_CommitNotes``: a note is taken only for exactly one commit; a reader's copies are
    carried from ``since`` to ``now`` only along notes that chain, past notes newer than
    ``now``; a commit nobody noted, a torn note or a chain longer than the walk carries nothing."""
    from service.store.sqlite import _CommitNotes

    def header(change: int) -> bytes:
        return bytes(8) + change.to_bytes(4, sys.byteorder) + bytes(36)

    notes = _CommitNotes.open(str(tmp_path / "n.db"))
    again = _CommitNotes.open(str(tmp_path / "n.db"))  # another process's mapping of it
    assert notes is not None and again is not None
    try:
        assert not again.chain(header(1), header(2))  # nothing noted yet
        notes.note(header(1), header(3))  # two commits: not noted
        notes.note(None, header(2))
        assert not again.chain(header(1), header(3)) and not again.chain(header(1), header(2))
        notes.note(header(1), header(2))
        notes.note(header(2), header(3))
        assert again.chain(header(1), header(3)) and again.chain(header(2), header(3))
        assert again.chain(header(1), header(2))  # past the newer note
        # Commit 4 was nobody's note (a revocation): nothing carries across it.
        notes.note(header(4), header(5))
        assert again.chain(header(4), header(5))
        assert not again.chain(header(3), header(5)) and not again.chain(header(1), header(5))
        # A note torn by a concurrent write fails its digest.
        count = int.from_bytes(notes._map[:8], "little")
        at = _CommitNotes._FIRST + ((count - 1) % _CommitNotes.SLOTS) * 128
        notes._map[at + 100] ^= 0xFF
        assert not again.chain(header(4), header(5))
        # A reader's header whose own commit nobody noted: the walk ends at the first note
        # (older than it), not after the whole ring (a write load's every commit).
        for change in range(100, 120):
            notes.note(header(change), header(change + 1))
        real = again._map

        class Counted:
            reads = 0

            def __getitem__(self, key: slice) -> bytes:
                Counted.reads += 1
                return real[key]

        again._map = Counted()  # type: ignore[assignment]
        assert not again.chain(header(100), header(130))
        assert Counted.reads <= 2  # the count, one note
        # Notes newer than the reader's header (committed since it read it) are walked past.
        assert again.chain(header(100), header(115))
        again._map = real
        # The ring wraps; a chain longer than the walk is not followed to its start.
        for change in range(10, 10 + _CommitNotes.SLOTS + 5):
            notes.note(header(change), header(change + 1))
        last = 10 + _CommitNotes.SLOTS + 5
        assert again.chain(header(last - _CommitNotes.WALK), header(last))
        assert not again.chain(header(last - _CommitNotes.WALK - 1), header(last))
    finally:
        notes.close()
        again.close()
