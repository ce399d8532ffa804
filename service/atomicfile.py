"""Durable, private file writes, and the lock that serialises writers of one directory.

Used for key material (token signing keys, audit keys): a reader sees the old file or the whole
new one, never a part. A file is written 0600 to a temporary name in the same directory, fsynced,
renamed over the target, and the directory fsynced, so the rename itself survives a crash.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

__all__ = ["exclusive", "write_private"]


def write_private(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` (ASCII), mode 0600, atomically and durably."""
    tmp = path.with_name(f".tmp-{path.name}-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="ascii") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


@contextlib.contextmanager
def exclusive(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``lock_path`` (created 0600) across processes."""
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock
