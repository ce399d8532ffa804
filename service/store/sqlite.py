"""SQLite backend: one database file shared by the worker processes of one machine.

Only what differs from PostgreSQL lives here: connecting, the transaction discipline and error
wrapping; the statements are in the ``sql`` package.

* Two connections per process: one writer, confined to its own thread (``_Thread``) because
  the stdlib ``sqlite3`` module blocks (the event loop never waits on the disk or on a lock, and
  the writer's statements run strictly in submission order), and one read-only connection used
  on the loop's thread (``_InlineConnection``).
* WAL lets readers proceed while one writer writes; ``synchronous=FULL`` makes each commit
  durable; ``busy_timeout`` makes writers from other processes queue instead of failing.
* Every writing transaction starts with ``BEGIN IMMEDIATE``: it takes the write lock up front, so
  a transaction never has to upgrade a read lock (the upgrade is where SQLite gives up with
  ``SQLITE_BUSY`` regardless of the timeout), and read-check-write sequences are serialised
  across processes.
* The session check of every request reads its session row again only when the file changed:
  the wal-index header (``_WalIndex``, else ``PRAGMA data_version`` on the inline reader) moves
  with every commit of any connection, this process's writer and other processes' alike
  (``SqliteStore.get_session``), so a revocation, a logout or a step-up is seen by the next
  request exactly as with a read.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import logging
import mmap
import os
import queue
import sqlite3
import sys
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar, cast

from ..deadline import call_deadline, charged
from .base import (
    AuditRecord,
    ChainGuard,
    CheckpointSigner,
    Seal,
    SessionRecord,
    StoreError,
    StoreUnavailable,
)
from .sql import Dialect, Row, SqlStore, dump_json, migrations, pending_migrations
from .sql.audit import ChainBroken, append_locked
from .sql.core import Query
from .sql.sessions import BY_ID as SESSION_BY_ID
from .sql.sessions import session_of

__all__ = ["SqliteStore"]

log = logging.getLogger(__name__)

T = TypeVar("T")

DIALECT = Dialect(
    name="sqlite",
    numbered_params=False,
    json_in=dump_json,
    json_out=json.loads,
)

# Primary result codes that mean "the database cannot serve us now" rather than "bad statement":
# BUSY, LOCKED, PERM, READONLY, IOERR, CORRUPT, FULL, CANTOPEN, NOTADB.
_UNAVAILABLE = {5, 6, 3, 8, 10, 11, 13, 14, 26}

_MIN_VERSION = (3, 35, 0)  # RETURNING


def _wrap(exc: sqlite3.Error) -> StoreError:
    code = getattr(exc, "sqlite_errorcode", None)
    name = getattr(exc, "sqlite_errorname", type(exc).__name__)
    # Never the path or the statement: messages may reach logs and status surfaces.
    if code is not None and code & 0xFF in _UNAVAILABLE:
        return StoreUnavailable(f"sqlite store unavailable: {name}")
    if isinstance(exc, sqlite3.OperationalError) and code is None:
        return StoreUnavailable(f"sqlite store unavailable: {type(exc).__name__}")
    return StoreError(f"sqlite error: {name}")


def _rows(cur: sqlite3.Cursor) -> list[Row]:
    try:
        # fetchall steps the statement to the end, so an UPDATE ... RETURNING is complete.
        return [dict(r) for r in cur.fetchall()]
    finally:
        cur.close()


def _split(script: str) -> list[str]:
    """Split a migration into statements (``executescript`` would commit our transaction)."""
    statements: list[str] = []
    buf = ""
    for line in script.splitlines(keepends=True):
        buf += line
        if sqlite3.complete_statement(buf):
            if buf.strip():
                statements.append(buf.strip())
            buf = ""
    if buf.strip() and not all(
        ln.strip().startswith("--") or not ln.strip() for ln in buf.splitlines()
    ):
        raise StoreError("migration ends with an incomplete statement")
    return statements


class _Thread:
    """The one thread a connection is used on: calls run in the order they were handed over,
    each answered on the event loop (``call_soon_threadsafe``).

    A call whose waiter was cancelled before the thread took it is skipped, never run (as
    ``ThreadPoolExecutor`` skips a cancelled future: ``_WriteBatch`` relies on it); one already
    running finishes, and its answer is dropped. Measured on the write batch's COMMIT hop: a call
    through ``run_in_executor`` cost ~50 us of the loop's CPU (a concurrent future, a wrapping
    asyncio future, four callbacks, the executor's lock and semaphore), this ~30 us.
    """

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._taken = [0]  # calls taken off the queue, run or skipped (written by the thread)
        # The thread holds the queue and the count, not this object: a runner nobody closed is
        # collected, and its thread then ends (as ThreadPoolExecutor's workers do).
        self._thread = threading.Thread(target=_work, args=(self._jobs, self._taken),
                                        name="store-sqlite", daemon=True)
        self._thread.start()
        weakref.finalize(self, self._jobs.put, None)

    @property
    def taken(self) -> int:
        """Calls the thread has taken off the queue (run, or skipped as cancelled)."""
        return self._taken[0]

    def call(self, fn: Callable[[], T]) -> asyncio.Future[T]:
        """Queue ``fn``; its result (or exception) on the returned future."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[T] = loop.create_future()
        self._jobs.put((fn, waiter, loop))
        return waiter

    def post(self, fn: Callable[[], Any]) -> None:
        """Queue ``fn`` with nobody waiting for it (it reports its own failures)."""
        self._jobs.put((fn, None, None))

    def stop(self, *, wait: bool = True) -> None:
        """Run what is queued, then end the thread (with ``wait``, wait for that)."""
        self._jobs.put(None)
        if wait and self._thread is not threading.current_thread():
            self._thread.join()


_Job = tuple[Callable[[], Any], "asyncio.Future[Any] | None", "asyncio.AbstractEventLoop | None"]


def _work(jobs: queue.SimpleQueue[_Job | None], taken: list[int]) -> None:
    """``_Thread``'s thread: run each call in turn until told to stop. A call is counted as
    taken before it is answered: the caller, woken by the answer, finds nothing left here."""
    while (job := jobs.get()) is not None:
        fn, waiter, loop = job
        job = None
        if waiter is not None and waiter.cancelled():
            taken[0] += 1
            continue  # its caller left before it started: never run
        error: BaseException | None = None
        result: Any = None
        try:
            result = fn()
        except BaseException as exc:  # handed to the waiter
            error = exc
        taken[0] += 1
        if waiter is None:
            if error is not None:
                log.warning("sqlite call failed with nobody waiting",
                            exc_info=(type(error), error, error.__traceback__))
        else:
            _answer_soon(loop, waiter, result, error)
        del fn, waiter, loop, result, error  # nothing of a finished call outlives it


def _answer_soon(loop: asyncio.AbstractEventLoop | None, waiter: asyncio.Future[Any], result: Any,
                 exc: BaseException | None) -> None:
    assert loop is not None
    with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is left to answer
        loop.call_soon_threadsafe(_answer, waiter, result, exc)


def _answer(waiter: asyncio.Future[Any], result: Any, exc: BaseException | None) -> None:
    if waiter.done():  # cancelled while the call ran
        return
    if exc is not None:
        waiter.set_exception(exc)
    else:
        waiter.set_result(result)


class _Connection:
    """One ``sqlite3`` connection and the one thread allowed to touch it."""

    def __init__(self, db: sqlite3.Connection, thread: _Thread) -> None:
        self._db = db
        self._thread = thread
        self._lock_fd: int | None = None  # the writers' lock file, opened on first write
        # Set while this connection holds the write lock (between BEGIN IMMEDIATE and COMMIT).
        self._holding_write_lock = False
        # Calls handed to the thread (on the loop only). ``_queued == _thread.taken`` safely
        # means nothing is queued or running there (``_begin_inline``); a lost count could only
        # make it false, which costs a hop, never safety. (The thread's own calls so far, such
        # as the connect, are counted as queued.)
        self._queued = thread.taken
        self._busy_ms: int | None = None  # the connection's busy timeout, read once

    @classmethod
    async def open(cls, path: str, busy_timeout_s: float) -> _Connection:
        thread = _Thread()

        def connect() -> sqlite3.Connection:
            # isolation_level=None: no implicit transactions; BEGIN/COMMIT are issued explicitly.
            # check_same_thread=False: the inline reader is opened here and then used only on the
            # event loop's thread; every connection still has exactly one thread using it.
            db = sqlite3.connect(path, timeout=busy_timeout_s, isolation_level=None,
                                 check_same_thread=False)
            try:
                db.row_factory = sqlite3.Row
                db.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
                _ensure_wal(db, busy_timeout_s)
                db.execute("PRAGMA synchronous = FULL")
                db.execute("PRAGMA foreign_keys = ON")
            except BaseException:
                db.close()
                raise
            return db

        try:
            db = await thread.call(connect)
        except sqlite3.Error as exc:
            thread.stop(wait=False)
            raise _wrap(exc) from exc
        except BaseException:  # cancelled: a connect still running may wait on a lock
            thread.stop(wait=False)
            raise
        return cls(db, thread)

    async def _call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        self._queued += 1
        db = self._db
        try:
            return await self._thread.call(lambda: fn(db))
        except sqlite3.Error as exc:
            raise _wrap(exc) from exc

    async def _statement(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run one statement: on the loop's thread while this connection holds the write lock.

        Measured: a statement through the connection's thread costs a hop (~50-100 us, more
        under GIL contention); inline, an UPDATE or INSERT on cached pages costs ~10-20 us.
        Holding the write lock, a statement never waits for a lock and writes only to the page
        cache (the disk is touched at COMMIT, which stays on the thread, as does BEGIN, which
        may wait for another process). The awaits of one transaction are sequential, so the
        connection is still used by one thread at a time.
        """
        if self._holding_write_lock:
            try:
                return fn(self._db)
            except sqlite3.Error as exc:
                raise _wrap(exc) from exc
        return await self._call(fn)

    # -- sql.Conn
    async def execute(self, sql: str, args: Sequence[Any]) -> None:
        await self._statement(lambda db: db.execute(sql, tuple(args)).close())

    async def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        await self._statement(lambda db: db.executemany(sql, [tuple(r) for r in rows]).close())

    async def fetchone(self, sql: str, args: Sequence[Any]) -> Row | None:
        rows = await self.fetchall(sql, args)
        return rows[0] if rows else None

    async def fetchall(self, sql: str, args: Sequence[Any]) -> list[Row]:
        return await self._statement(lambda db: _rows(db.execute(sql, tuple(args))))

    # -- transaction control
    async def begin(self, write: bool) -> None:
        if not write:
            await self._call(lambda db: db.execute("BEGIN").close())
            return

        def begin_write(db: sqlite3.Connection) -> None:
            # Writers of every process queue on a kernel lock first. SQLite's own busy handler
            # sleeps and retries (1, 2, 5, 10 ... ms) when another process holds the write lock,
            # which under steady load from several workers turns into long stalls; a blocked
            # flock wakes as soon as the holder releases it. BEGIN IMMEDIATE stays the real lock.
            if self._lock_fd is None:
                self._lock_fd = os.open(_lock_path(db), os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
            try:
                db.execute("BEGIN IMMEDIATE").close()
            except BaseException:
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
                raise

        if not self.begin_now():
            await self._call(begin_write)
            self._holding_write_lock = True

    def begin_now(self) -> bool:
        """``begin(True)`` when it can run on the loop at once (``_begin_inline``); False,
        holding nothing, when it would have to wait (then ``begin`` waits on the thread)."""
        if self._queued != self._thread.taken:
            return False
        try:
            began = self._begin_inline()
        except OSError:  # the writers' lock file: the thread's BEGIN reports it
            return False
        if began:
            self._holding_write_lock = True
        return began

    def _begin_inline(self) -> bool:
        """BEGIN IMMEDIATE on the loop's thread, when it cannot wait: nothing is queued on the
        connection's thread (a queued ROLLBACK must not end this transaction), the writers'
        lock is free at once, and SQLite's own lock too (busy timeout 0: a writer outside the
        lock, such as another process migrating at start-up). Otherwise False, holding
        nothing, and the thread BEGINs, waiting as long as it must. Saves one of the two
        thread hops of every write batch (measured: ~50 us of the loop's CPU and ~25 us of the
        thread's a hop); a batch of the authorized read's audit records holds ~6."""
        db = self._db
        if self._lock_fd is None:
            self._lock_fd = os.open(_lock_path(db), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        try:
            if self._busy_ms is None:
                self._busy_ms = int(db.execute("PRAGMA busy_timeout").fetchone()[0])
            db.execute("PRAGMA busy_timeout = 0").close()
            try:
                db.execute("BEGIN IMMEDIATE").close()
            finally:
                db.execute(f"PRAGMA busy_timeout = {self._busy_ms}").close()
        except sqlite3.Error:
            with contextlib.suppress(sqlite3.Error):
                if db.in_transaction:
                    db.execute("ROLLBACK").close()
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            return False
        return True

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    async def commit(self) -> None:
        self._holding_write_lock = False

        def commit(db: sqlite3.Connection) -> None:
            try:
                db.execute("COMMIT").close()
            finally:
                if not db.in_transaction:
                    self._unlock()

        await self._call(commit)

    def rollback_soon(self) -> None:
        """Queue a rollback behind whatever this connection's thread is running.

        Not awaited, so it also works while the caller is being cancelled; the next user of the
        connection queues behind it on the same thread and finds no open transaction.
        """

        self._holding_write_lock = False

        def rollback(db: sqlite3.Connection) -> None:
            try:
                if db.in_transaction:
                    db.execute("ROLLBACK").close()
            except sqlite3.Error:
                log.warning("sqlite rollback failed", exc_info=True)
            finally:
                self._unlock()

        self._queued += 1
        db = self._db
        self._thread.post(lambda: rollback(db))

    async def locked(self, fn: Callable[[sqlite3.Connection], T],
                     committed: Callable[[], object] | None = None) -> T:
        """``fn`` in a write transaction of its own, run whole on the connection's thread: the
        writers' lock and BEGIN IMMEDIATE (waiting as ``begin``'s thread path does), ``fn``,
        COMMIT, then ``committed()`` (still under the writers' lock); ROLLBACK when anything
        raises, the lock released either way. One hop where a transaction's statements on the
        loop cost a unit, a batch and the COMMIT's hop. Only while no transaction of this
        connection is open or opening (``SqliteStore._writer_idle``): a batch that begins
        meanwhile queues its BEGIN behind."""
        db = self._db
        if self._lock_fd is None:
            self._lock_fd = os.open(_lock_path(db), os.O_RDWR | os.O_CREAT, 0o600)
        lock_fd = self._lock_fd

        def run(db: sqlite3.Connection) -> T:
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
            try:
                db.execute("BEGIN IMMEDIATE").close()
                try:
                    result = fn(db)
                    db.execute("COMMIT").close()
                    if committed is not None:
                        committed()
                except BaseException:
                    if db.in_transaction:
                        with contextlib.suppress(sqlite3.Error):
                            db.execute("ROLLBACK").close()
                    raise
                return result
            finally:
                fcntl.flock(lock_fd, fcntl.LOCK_UN)

        return await self._call(run)

    async def close(self) -> None:
        try:
            await self._call(lambda db: db.close())
        finally:
            self._thread.stop()
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None


class _ConnectionNow(_Connection):
    """A connection used on the thread that calls it: every statement runs at once, and its
    coroutines never suspend (``_now`` drives them on the writer's thread)."""

    async def _call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        try:
            return fn(self._db)
        except sqlite3.Error as exc:
            raise _wrap(exc) from exc


def _now(coroutine: Coroutine[Any, Any, T]) -> T:
    """The result of a coroutine that never suspends (``_ConnectionNow``'s statements), run to
    its end here, on the caller's thread."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return cast(T, done.value)
    coroutine.close()
    raise RuntimeError("a statement waited where none may")


class _InlineConnection(_ConnectionNow):
    """A read-only connection used on the event loop's own thread.

    Measured: a read transaction through a worker thread costs three thread hops (~120 us and
    GIL hand-offs under load); inline it costs ~15 us. In WAL mode a reader never waits for a
    writer, and an indexed read of a few rows touches cached pages, so running it on the loop
    is cheaper than the hop. Only ever used for read transactions.
    """

    _wal: _WalIndex | None = None
    _wal_tried = False

    @classmethod
    async def open_inline(cls, path: str, setup_busy_timeout_s: float) -> _InlineConnection:
        # Set up with the writers' patience (switching to WAL needs a lock another process may
        # hold while it migrates), then lower it: on the loop, a reader must never wait long.
        opened = await _Connection.open(path, setup_busy_timeout_s)
        opened._db.execute(f"PRAGMA busy_timeout = {int(READER_BUSY_TIMEOUT_S * 1000)}")
        opened._db.execute("PRAGMA query_only = ON")
        # The connection moves to the loop's thread: allowed because only that thread uses it
        # from now on (the thread that opened it is stopped first).
        opened._thread.stop()
        db = opened._db
        return cls(db, opened._thread)

    def data_version(self) -> int:
        """``PRAGMA data_version``: changes whenever another connection (of any process) has
        committed since this connection last looked. Its own statement: a fresh snapshot."""
        cursor = self._db.execute("PRAGMA data_version")
        try:
            return int(cursor.fetchone()[0])
        finally:
            cursor.close()

    def version(self) -> bytes | int:
        """What changes with every commit to the file, of any connection of any process: the
        WAL-index header (``_WalIndex``) where it reads consistent, else ``data_version``
        (which also opens the WAL-index the header is read from: the first call always runs
        it). Two calls answer equal only if nothing was committed in between."""
        wal = self._wal
        if wal is not None:
            header = wal.header()
            if header is not None:
                return header
        version = self.data_version()
        if wal is None and not self._wal_tried:
            # After a read of this connection: it holds the WAL-index open from now on.
            self._wal_tried = True
            self._wal = _WalIndex.open(self._db)
            if self._wal is not None:
                return self.version()  # read after: a later version (the row is read later still)
        return version

    def wal_index(self) -> _WalIndex | None:
        """The wal-index header's mapping (``version``'s), opened if it was not yet."""
        if self._wal is None and not self._wal_tried:
            with contextlib.suppress(sqlite3.Error):
                self.version()
        return self._wal

    def fetch_now(self, sql: str, args: Sequence[Any]) -> Row | None:
        """The first row of ``sql`` (its own statement: a fresh snapshot), at once: an
        ``sqlite3.Row``, read by column name like the units' rows."""
        try:
            cursor = self._db.execute(sql, tuple(args))
            try:
                row: Row | None = cursor.fetchone()  # (no cast() call: every session read)
                return row
            finally:
                cursor.close()
        except sqlite3.Error as exc:
            raise _wrap(exc) from exc

    def rollback_soon(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self._db.execute("ROLLBACK").close()

    async def close(self) -> None:
        if self._wal is not None:  # before the connection that keeps the file's size
            self._wal.close()
            self._wal = None
        self._db.close()


class _WalIndex:
    """The header of a WAL-mode database's wal-index (its ``-shm`` file), read from memory.

    SQLite's "WAL-mode File Format" document (section 2.1) fixes it for the unix VFS: the file
    starts with two copies of the 48-byte ``WalIndexHdr``; a writer rewrites both on every
    commit, after the commit's frames are in the WAL (and synced), the second copy first; a
    reader that finds the two equal holds a consistent header. Every commit changes it (its
    ``iChange`` counter and ``mxFrame``; a WAL restart its salts), so an unchanged header means
    no commit since: the same answer as ``PRAGMA data_version``, without a statement (~0.3 us
    against ~3 us on the authorized read's session check).

    Mapped only while this process's reader connection is open: an open connection keeps the
    wal-index in use, and SQLite truncates the file only when no connection of any process
    uses it (a mapped page past the end of a truncated file would be fatal to touch). None
    where the file cannot be mapped (the caller reads ``data_version`` instead); a header that
    is torn or not yet initialised reads as None too.
    """

    SIZE = 48

    __slots__ = ("_map",)

    def __init__(self, mapped: mmap.mmap) -> None:
        self._map = mapped

    @classmethod
    def open(cls, db: sqlite3.Connection) -> _WalIndex | None:
        try:
            mode = str(db.execute("PRAGMA journal_mode").fetchone()[0]).lower()
            if mode != "wal":
                return None
            row = db.execute("PRAGMA database_list").fetchone()
            fd = os.open(str(row[2]) + "-shm", os.O_RDONLY | os.O_CLOEXEC)
        except (sqlite3.Error, OSError, TypeError):
            return None
        try:
            if os.fstat(fd).st_size < 2 * cls.SIZE:
                return None
            found = cls(mmap.mmap(fd, 2 * cls.SIZE, mmap.MAP_SHARED, mmap.PROT_READ))
        except (OSError, ValueError):
            return None
        finally:
            os.close(fd)  # the mapping keeps the file
        return found if found.header() is not None else None

    def header(self) -> bytes | None:
        """The current header, or None when its copies differ (a commit is writing it) or it
        is not initialised (``isInit``, byte 12)."""
        both = self._map[: 2 * self.SIZE]
        first = both[: self.SIZE]
        if first != both[self.SIZE:] or first[12] != 1:
            return None
        return first

    @staticmethod
    def commits(before: bytes, after: bytes) -> int:
        """How many transactions committed from header ``before`` to ``after``: their
        ``iChange`` counters (bytes 8-11, native order), which every commit moves by one and
        nothing else moves (modulo 2**32)."""
        return (int.from_bytes(after[8:12], sys.byteorder)
                - int.from_bytes(before[8:12], sys.byteorder)) % 2**32

    def close(self) -> None:
        self._map.close()


class _CommitNotes:
    """Commits that wrote no session row, noted by the processes that made them: a file shared
    by every process of one database (``<database>.commit-notes`` beside it), so that a worker
    keeps its session copies (``SqliteStore.session_now``) across another worker's audit group
    commits, not only its own.

    Every commit changes the wal-index header (``_WalIndex``), so a copy read at one header is
    dropped at the next, whoever committed. Under two workers' reads nearly every commit is
    the other worker's group commit of audit records, which writes no session row; each made
    the next check read the row again (~20-30 us on the loop, every commit resets the reader's
    page cache). The one-call group commit (``SqliteStore.append_audit_many``: audit records and
    a due checkpoint, nothing else) notes here the header its transaction began at and the one
    it committed, read under the writers' lock, when exactly one commit lies between the two
    (its own). A reader whose copies were read at header ``since`` keeps them at header ``now``
    only when notes chain from one to the other, each note's ``before`` the ``after`` of the
    one before: every commit in between is one that wrote no session row. A commit nobody
    noted (a login, a revocation, a step-up, any other transaction, a process outside the
    server) breaks the chain, and the row is read again, as before.

    Layout: the count of notes ever written (8 bytes, little-endian), then ``SLOTS`` notes in a
    ring, each ``before`` and ``after`` (48 bytes each) and a BLAKE2b digest of the two (16): a
    note read while another process writes it (torn) fails its digest and breaks the chain. The
    file is as writable as the database beside it, and someone who can write it can write the
    sessions too: it adds no way in. None where the file cannot be opened or mapped: then only
    the row's read again serves (nothing is carried)."""

    SLOTS = 128
    NOTE = 2 * _WalIndex.SIZE + 16
    _FIRST = 64
    SIZE = _FIRST + SLOTS * 128
    #: How many notes a reader walks back (past newer ones, then along its chain) at most.
    WALK = 32

    __slots__ = ("_map",)

    def __init__(self, mapped: mmap.mmap) -> None:
        self._map = mapped

    @classmethod
    def open(cls, database: str) -> _CommitNotes | None:
        try:
            fd = os.open(database + ".commit-notes", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError:
            return None
        try:
            if os.fstat(fd).st_size < cls.SIZE:
                os.ftruncate(fd, cls.SIZE)  # (zeros: no note; another opener's is the same size)
            return cls(mmap.mmap(fd, cls.SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE))
        except (OSError, ValueError):
            return None
        finally:
            os.close(fd)  # the mapping keeps the file

    @staticmethod
    def _digest(pair: bytes) -> bytes:
        return hashlib.blake2b(pair, digest_size=16).digest()

    def note(self, before: bytes | None, after: bytes | None) -> None:
        """Note the commit from header ``before`` to ``after`` as one that wrote no session row,
        when it is exactly one commit. Called under the writers' lock (one writer at a time)."""
        if before is None or after is None or _WalIndex.commits(before, after) != 1:
            return
        count = int.from_bytes(self._map[:8], "little")
        at = self._FIRST + (count % self.SLOTS) * 128
        pair = before + after
        self._map[at:at + self.NOTE] = pair + self._digest(pair)
        self._map[:8] = (count + 1).to_bytes(8, "little")

    def chain(self, since: bytes, now: bytes) -> bool:
        """Whether noted commits lead from header ``since`` to header ``now`` (see above)."""
        count = int.from_bytes(self._map[:8], "little")
        size, target, linked = _WalIndex.SIZE, now, False
        for i in range(count - 1, max(count - self.WALK, 0) - 1, -1):
            at = self._FIRST + (i % self.SLOTS) * 128
            found = self._map[at:at + self.NOTE]
            after = found[size:2 * size]
            if after != target:
                if linked or not 0 < _WalIndex.commits(now, after) < 2**31:
                    # In commit order: the commit before this one (or ``now``'s own commit,
                    # older than this note) was not noted. (Most commits of a write load: the
                    # walk ends here, at once.)
                    return False
                continue  # newer than ``now``: committed since it was read
            if self._digest(found[:2 * size]) != found[2 * size:]:
                return False
            target, linked = found[:size], True
            if target == since:
                return True
        return False

    def close(self) -> None:
        self._map.close()


#: A reader waits at most this long on a lock (only WAL recovery or a checkpoint can make it).
READER_BUSY_TIMEOUT_S = 0.2

#: At most this many write transactions share one commit (bounds the latency a batch adds).
MAX_BATCH_MEMBERS = 64

#: Session rows kept for ``SqliteStore.get_session`` while the file has not changed (at most).
SESSION_CACHE_SIZE = 1024


class _WriteBatch:
    """Write transactions of one process sharing one SQLite transaction, hence one fsync.

    Each member runs in its own SAVEPOINT, one at a time: a member that fails is rolled back to
    its savepoint alone, and the others commit. Every member waits for the shared COMMIT before
    it returns, so "committed" still means durable for each of them. A batch BEGINs only after
    the previous batch on the same connection has finished.
    """

    def __init__(self, conn: _Connection, previous: _WriteBatch | None) -> None:
        loop = asyncio.get_running_loop()
        self.conn = conn
        self.slot = asyncio.Lock()
        self.joined = 0
        self.active = 0
        self.sealed = False  # no more members may join
        self.poisoned = False  # a savepoint could not be unwound: the whole batch rolls back
        self.finishing = False
        self.finisher: asyncio.Future[None] | None = None  # referenced so it is not collected
        self.committed: asyncio.Future[None] = loop.create_future()
        self.opened: asyncio.Future[None]
        if (previous is None or previous.committed.done()) and conn.begin_now():
            # BEGUN on the loop at once (``_Connection._begin_inline``): no task to wait for.
            self.opened = loop.create_future()
            self.opened.set_result(None)
        else:
            self.opened = asyncio.ensure_future(self._open(previous))

    async def _open(self, previous: _WriteBatch | None) -> None:
        if previous is not None and not previous.committed.done():
            await asyncio.wait([previous.committed])
        await self.conn.begin(True)

    async def finish(self) -> None:
        """Commit the batch, or end whatever it opened: never leaves the writer in a transaction.

        Every member may have left before BEGIN returned (their deadline passed while another
        process held the write lock). The BEGIN still runs on the writer's thread and may yet
        take the lock: the batch then waits for it and rolls back what it opened, and the next
        batch (which BEGINs only after this one has finished) finds no open transaction.
        """
        try:
            if not self.opened.done():
                await asyncio.wait([self.opened])
            if self.opened.cancelled() or self.opened.exception() is not None:
                raise StoreUnavailable("sqlite batch could not begin")
            if self.poisoned:
                raise StoreError("sqlite batch rolled back")
            await self.conn.commit()
        except BaseException as exc:
            if not self.opened.done():  # cancelled while waiting for BEGIN (shutdown)
                self.opened.add_done_callback(self._end_opened)
            elif _began(self.opened):
                self.conn.rollback_soon()
            self.committed.set_exception(exc)
            self.committed.exception()  # retrieved: members re-raise it themselves
        else:
            self.committed.set_result(None)

    def _end_opened(self, opened: asyncio.Future[None]) -> None:
        if _began(opened):
            self.conn.rollback_soon()


def _began(opened: asyncio.Future[None]) -> bool:
    """Whether a finished BEGIN opened a transaction (its failure counts as retrieved)."""
    return not opened.cancelled() and opened.exception() is None


class _Held:
    """Release an already acquired lock on exit."""

    __slots__ = ("_lock",)

    def __init__(self, lock: asyncio.Lock) -> None:
        self._lock = lock

    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, *exc: object) -> None:
        self._lock.release()


class SqliteStore(SqlStore):
    """The embedded store: a WAL-mode SQLite file; safe for several processes on one machine."""

    dialect = DIALECT

    def __init__(self, path: str, writer: _Connection, reader: _InlineConnection,
                 busy_timeout_s: float = 5.0) -> None:
        self._path = path
        self._reader = reader
        # Read transactions on the inline reader do not suspend between statements, so they
        # cannot interleave; the lock only matters if one ever did.
        self._reader_lock = asyncio.Lock()
        # Every write of this process goes through one connection, in group-committed batches.
        self._writer = writer
        self._batch: _WriteBatch | None = None
        self._savepoints = 0
        self._closed = False
        # Session rows read at the reader's ``data_version`` (``get_session``).
        self._sessions: dict[str, SessionRecord | None] = {}
        self._sessions_version: bytes | int | None = None
        # Commits that wrote no session row, noted by every process of the file.
        self._notes = _CommitNotes.open(path)
        #: Waiting for the writer (another process's lock, the batch ahead) ends here.
        self.timeout_s = busy_timeout_s

    @classmethod
    async def open(cls, path: str, *, busy_timeout_s: float = 5.0) -> SqliteStore:
        if sqlite3.sqlite_version_info < _MIN_VERSION:
            raise StoreError(f"SQLite {sqlite3.sqlite_version} is too old (3.35+ needed)")
        try:
            file = await asyncio.to_thread(_prepare_file, path)
        except OSError as exc:
            # Opening, the path is what the operator needs (it is no secret); calls never say it.
            reason = exc.strerror or type(exc).__name__
            raise StoreUnavailable(
                f"sqlite store unavailable: {type(exc).__name__} ({path}: {reason})"
            ) from exc
        try:
            writer = await _Connection.open(str(file), busy_timeout_s)
        except StoreError as exc:
            raise _at(exc, file) from exc.__cause__
        try:
            await _migrate(writer)
            reader = await _InlineConnection.open_inline(str(file), busy_timeout_s)
        except StoreError as exc:
            await writer.close()
            raise _at(exc, file) from exc.__cause__
        except BaseException:
            await writer.close()
            raise
        return cls(str(file), writer, reader, busy_timeout_s)

    def _inline_free(self) -> bool:
        """Whether a single read may run on the inline reader now (``_InlineRead``)."""
        return not self._closed and not self._reader_lock.locked()

    def _writer_idle(self) -> bool:
        """Whether no write transaction of this process is open or opening (``_Connection.locked``
        may run)."""
        batch = self._batch
        return not self._closed and (batch is None or batch.committed.done())

    async def append_audit_many(
        self, entries: Sequence[dict[str, Any]], seal: Seal, *, guard: ChainGuard | None = None,
        checkpoint: CheckpointSigner | None = None,
    ) -> list[AuditRecord]:
        """A group commit of audit records (``AuditLog``) while the writer is idle: the whole
        transaction as one call on the writer's thread (``append_locked``), where the generic
        unit costs the loop ~90 us a commit in statements, savepoints, a batch and the COMMIT's
        hop (measured: 8 records, 150 us of the loop and 125 of the thread against 26 and 135;
        under the read load of two workers a commit holds ~10 records). Otherwise, and for a
        guard that gives no start to read from, the generic path (which joins the open batch).
        The guard and the checkpointer are told on the loop what the thread found."""
        start = None if guard is None else guard.reads_from()
        if not entries or (guard is not None and start is None) or not self._writer_idle():
            return await super().append_audit_many(entries, seal, guard=guard,
                                                   checkpoint=checkpoint)
        if guard is not None and start is not None:
            guard.since(start)  # its own start: raises only where it vouches for nothing
        if self.on_transaction is not None:
            self.on_transaction(True)
        wal, writer, notes = self._reader.wal_index(), self._writer, self._notes
        began: list[bytes | None] = []  # the file's version as the transaction began

        def append(db: sqlite3.Connection) -> tuple[list[AuditRecord], tuple[int, str] | None]:
            if wal is not None:  # the write lock held: no commit but this one until COMMIT
                began.append(wal.header())
            q = Query(_ConnectionNow(db, writer._thread), DIALECT)
            return _now(append_locked(q, entries, seal, guard, start, checkpoint))

        def committed() -> None:
            # Still under the writers' lock: a commit that wrote no session row, for every
            # worker's session copies (``_CommitNotes``), this one's included.
            if wal is not None and notes is not None and began:
                notes.note(began[0], wal.header())

        try:
            with charged(), self._observed(True):
                records, vouched = await writer.locked(append, committed)
        except ChainBroken as broken:
            assert guard is not None
            guard.vouch(broken.start, broken.head, broken.records)  # raises: it is spoiled
            raise
        if vouched is not None:
            assert guard is not None and start is not None
            guard.vouched(start, vouched)
        return records

    async def get_session(self, id: str) -> SessionRecord | None:
        """The session row as a read now would find it (``session_now``), awaited where it
        cannot be read at once."""
        found = self.session_now(id)
        return await super().get_session(id) if found is None else found[0]

    def session_now(self, id: str) -> tuple[SessionRecord | None] | None:
        """The session row as a read now would find it, without waiting: from this worker's
        copy while the file's version (``_InlineConnection.version``) is the one it was read at
        (no connection of any process has committed since: nothing can have changed it), or
        every commit since is noted as one that wrote no session row (``_CommitNotes``: the
        workers' audit group commits), else read again on the inline reader. None when the
        inline reader cannot answer now (``get_session`` then awaits the read).

        Measured on the authorized read (in-process, SQLite, 32 in flight): the row's read costs
        ~20 us on the loop while commits keep coming (each resets the reader's page cache), the
        version ~0.3 us read from the wal-index (~3 us as a ``PRAGMA data_version``). Every
        commit changes the version; under reads, nearly all of them are audit group commits,
        which the notes carry the copies over."""
        if not self._inline_free():
            return None
        try:
            version = self._reader.version()
        except sqlite3.Error:
            return None  # the awaited read answers as the store is
        if version != self._sessions_version:
            if not self._carried(version):
                self._sessions.clear()
            self._sessions_version = version
        if id in self._sessions:
            return (self._sessions[id],)
        session = self._session_now(id)
        # Read after the version was: a commit in between makes the next version differ, and
        # this copy is dropped unused.
        if self._sessions_version == version:
            if len(self._sessions) >= SESSION_CACHE_SIZE:
                self._sessions.clear()
            self._sessions[id] = session
        return (session,)

    def _carried(self, version: bytes | int) -> bool:
        """Whether the session copies read at ``_sessions_version`` hold at ``version``: every
        commit in between wrote no session row (``_CommitNotes``)."""
        since, notes = self._sessions_version, self._notes
        return (notes is not None and bool(self._sessions) and type(version) is bytes
                and type(since) is bytes and notes.chain(since, version))

    def _session_now(self, id: str) -> SessionRecord | None:
        """``get_session``'s read on the inline reader, counted and observed as that unit
        (``_InlineRead``) but without it: the unit's context manager, query object, dict rows
        and awaits cost a fifth of it (measured in-process, a session check right after another
        connection's commit, version included: 43-48 us through the unit, 34-40 us here)."""
        if self.on_transaction is not None:
            self.on_transaction(False)
        with self._observed(False):
            row = self._reader.fetch_now(SESSION_BY_ID, (id,))
        return None if row is None else session_of(row)

    def _unit(self, *, write: bool, single: bool = False) -> AbstractAsyncContextManager[Query]:
        if single and not write and self._inline_free():
            return _InlineRead(self)
        return self._generic_unit(write=write, single=single)

    @asynccontextmanager
    async def _transaction(self, *, write: bool, single: bool = False
                           ) -> AsyncIterator[_Connection]:
        if self._closed:
            raise StoreUnavailable("sqlite store is closed")
        if single:
            # One statement on the reader, in SQLite's own implicit transaction.
            async with self._reader_lock:
                yield self._reader
            return
        if not write:
            async with self._reader_lock:
                reader = self._reader
                committed = False
                try:
                    await reader.begin(False)
                    yield reader
                    await reader.commit()
                    committed = True
                finally:
                    if not committed:
                        reader.rollback_soon()
            return
        batch = self._batch
        if batch is None or batch.sealed:
            batch = self._batch = _WriteBatch(self._writer, batch)
        batch.joined += 1
        batch.active += 1
        if batch.joined >= MAX_BATCH_MEMBERS:
            batch.sealed = True
        self._savepoints += 1
        name = f"cp{self._savepoints}"
        released = False
        try:
            try:
                # Bounded: the batch's BEGIN waits for other processes' writers and for the
                # batch ahead of it; past the deadline (this call's, or what is left of its
                # request's: ``service.deadline``) this member leaves without having run.
                if batch.opened.done() and _began(batch.opened) and not batch.slot.locked():
                    await batch.slot.acquire()  # BEGUN and free: taken without suspending
                else:
                    async with asyncio.timeout_at(call_deadline(self.timeout_s)):
                        await asyncio.shield(batch.opened)
                        await batch.slot.acquire()
            except TimeoutError:
                raise StoreUnavailable("sqlite store unavailable: deadline exceeded") from None
            async with _Held(batch.slot):
                conn = batch.conn
                if batch.poisoned:
                    raise StoreError("sqlite batch rolled back")
                await conn.execute(f"SAVEPOINT {name}", ())
                try:
                    yield conn
                except BaseException:
                    try:
                        await conn.execute(f"ROLLBACK TO {name}", ())
                        await conn.execute(f"RELEASE {name}", ())
                    except BaseException:
                        batch.poisoned = True
                    raise
                try:
                    await conn.execute(f"RELEASE {name}", ())
                except BaseException:
                    batch.poisoned = True
                    raise
                released = True
        finally:
            batch.active -= 1
            if batch.active == 0 and not batch.finishing:
                batch.sealed = True
                batch.finishing = True
                batch.finisher = asyncio.ensure_future(batch.finish())
        if released:
            await asyncio.shield(batch.committed)

    async def describe(self) -> dict[str, Any]:
        # Never the path: status surfaces must not reveal where the data lives.
        return {"backend": "sqlite", "durable": True, "multi_replica_safe": False}

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._batch is not None and not self._batch.committed.done():
            await asyncio.wait([self._batch.committed])
        await self._writer.close()
        async with self._reader_lock:
            await self._reader.close()
        if self._notes is not None:
            self._notes.close()
            self._notes = None


class _InlineRead:
    """``_unit(write=False, single=True)`` while nobody holds the inline reader: the unit's one
    statement runs on the loop's thread and never suspends (``_InlineConnection``), so nothing
    can interleave with it and it needs neither the reader's lock nor a transaction (SQLite's
    implicit one is the statement's snapshot). Nor does it charge the request's store deadline:
    it cannot wait longer than ``READER_BUSY_TIMEOUT_S``. A class, not a generator: it wraps
    every session check (measured: a third of what the generic unit costs)."""

    __slots__ = ("_observed", "_query", "_store")

    def __init__(self, store: SqliteStore) -> None:
        self._store = store

    async def __aenter__(self) -> Query:
        store = self._store
        if store.on_transaction is not None:
            store.on_transaction(False)
        self._observed = store._observed(False)
        self._query = Query(store._reader, store.dialect)
        return self._query

    async def __aexit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        self._query.close()
        self._observed.__exit__(kind, *exc)


def _ensure_wal(db: sqlite3.Connection, timeout_s: float) -> None:
    """Put the file in WAL mode (a no-op once it is).

    Switching needs an exclusive lock, and SQLite may answer "locked" at once, without its busy
    handler, while another process is converting or migrating a fresh file: retry until the
    busy timeout.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            mode = str(db.execute("PRAGMA journal_mode").fetchone()[0]).lower()
            if mode != "wal":
                db.execute("PRAGMA journal_mode = WAL").close()
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def _lock_path(db: sqlite3.Connection) -> str:
    """``<database>.writer-lock`` beside the database file."""
    row = db.execute("PRAGMA database_list").fetchone()
    return str(row[2]) + ".writer-lock"


def _at(exc: StoreError, file: Path) -> StoreError:
    """An error met while opening, with the file and SQLite's own message (opening, the path
    is what the operator needs; it is no secret). Other kinds (SchemaTooNew) stay as they are."""
    if type(exc) not in (StoreError, StoreUnavailable):
        return exc
    cause = " ".join(str(exc.__cause__ or "").split())[:300]
    return type(exc)(f"{exc} ({file}: {cause})" if cause else f"{exc} ({file})")


def _prepare_file(path: str) -> Path:
    file = Path(path).expanduser().resolve()
    file.parent.mkdir(parents=True, exist_ok=True)
    # Create the file owner-only before SQLite does (it would honour the umask): it holds
    # session ids and ticket bindings. SQLite gives the -wal/-shm files the same mode.
    os.close(os.open(file, os.O_CREAT | os.O_RDWR, 0o600))
    return file


async def _migrate(conn: _Connection) -> None:
    """Apply pending migrations under the write lock, so concurrent starters apply them once."""
    available = migrations("sqlite")

    def apply(db: sqlite3.Connection) -> None:
        db.execute("BEGIN IMMEDIATE")
        try:
            db.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations "
                "(version INTEGER PRIMARY KEY, name TEXT NOT NULL)"
            )
            applied = {r[0] for r in db.execute("SELECT version FROM schema_migrations")}
            for migration in pending_migrations(available, applied):
                for statement in _split(migration.sql):
                    db.execute(statement)
                db.execute(
                    "INSERT INTO schema_migrations (version, name) VALUES (?, ?)",
                    (migration.version, migration.name),
                )
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise

    await conn._call(apply)
