"""A background task bound to a context: started on entry, cancelled and awaited on exit.

The service's periodic jobs (housekeeping, key publishing, the policy follower, the notification
dispatcher) each run one loop for as long as their startup context is open; this is the one
place that starts such a loop and makes sure it has ended before the context closes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Coroutine
from typing import Any, TypeVar

__all__ = ["background"]

T = TypeVar("T")


@contextlib.asynccontextmanager
async def background(coro: Coroutine[Any, Any, T]) -> AsyncIterator[asyncio.Task[T]]:
    """Run ``coro`` as a task while the block is open; on exit cancel it (if still running)
    and wait for it, so nothing of it outlives the block. Its outcome is not raised."""
    task = asyncio.create_task(coro)
    try:
        yield task
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
