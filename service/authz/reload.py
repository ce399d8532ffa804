"""Hot reload of the policy revision: poll the files, and reload at once on SIGHUP.

A changed revision is compiled and vetted off the event loop and swapped in atomically by the
engine; a revision that fails keeps the last good one serving (the engine reports the error).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from .. import sighup
from .engine import PolicyEngine

__all__ = ["reloading"]

log = logging.getLogger("controlplane.authz")


@contextlib.asynccontextmanager
async def reloading(engine: PolicyEngine, interval_s: float) -> AsyncIterator[None]:
    """While open: poll every ``interval_s`` (0 turns polling off) and reload on SIGHUP."""
    tasks: set[asyncio.Task[None]] = set()
    if interval_s > 0:
        tasks.add(asyncio.create_task(_poll(engine, interval_s)))

    def on_sighup() -> None:
        task = asyncio.create_task(_reload(engine))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    try:
        with sighup.on_sighup(on_sighup):
            yield
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _poll(engine: PolicyEngine, interval_s: float) -> None:
    while True:
        await asyncio.sleep(interval_s)
        try:
            if engine.poll_changes():
                await asyncio.to_thread(engine.reload)
        except Exception:
            log.exception("policy reload failed")


async def _reload(engine: PolicyEngine) -> None:
    try:
        await asyncio.to_thread(engine.reload)
    except Exception:
        log.exception("policy reload failed")
