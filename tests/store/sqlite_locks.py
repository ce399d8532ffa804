"""Other processes holding an SQLite file's write lock, for the stall and inline-BEGIN tests."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

# Holds the write lock; with "flock", the way another worker of this server does (the writers'
# lock file first, service/store/sqlite.py, then BEGIN IMMEDIATE); without, as a writer outside
# it does (a process migrating at start-up, an operator's sqlite3 shell). Prints "locked",
# holds, lets go.
_HOLDER = """
import fcntl, os, sqlite3, sys, time
path, hold_s, flock = sys.argv[1], float(sys.argv[2]), sys.argv[3] == "flock"
if flock:
    fd = os.open(path + ".writer-lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
db = sqlite3.connect(path, isolation_level=None, timeout=10)
db.execute("BEGIN IMMEDIATE")
db.execute("UPDATE schema_migrations SET name = name")
print("locked", flush=True)
time.sleep(hold_s)
db.execute("ROLLBACK")
if flock:
    fcntl.flock(fd, fcntl.LOCK_UN)
"""


@asynccontextmanager
async def write_lock_held(path: Path, hold_s: float, *, flock: bool = True
                          ) -> AsyncIterator[asyncio.subprocess.Process]:
    """Another process holds the write lock of ``path`` for ``hold_s`` seconds from entry
    (``flock``: the writers' lock file too, as the server's workers take it)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _HOLDER, str(path), str(hold_s), "flock" if flock else "sqlite",
        stdout=asyncio.subprocess.PIPE)
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
        assert line.strip() == b"locked"
        yield proc
    finally:
        if proc.returncode is None:
            await asyncio.wait_for(proc.wait(), 30)
