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

    async def poll() -> None:
        try:
            if engine.poll_changes():
                await asyncio.to_thread(engine.reload)
        except Exception:
            log.exception("policy reload failed")

    async with sighup.watching(poll, lambda: _reload(engine), interval_s):
        yield


async def _reload(engine: PolicyEngine) -> None:
    try:
        await asyncio.to_thread(engine.reload)
    except Exception:
        log.exception("policy reload failed")
