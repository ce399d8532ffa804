"""Unknown run outcomes, resolved in the background once the store answers again.

A run whose COMMIT was sent but never answered (``StoreOutcomeUnknown``) is answered 503
``outcome_unknown`` at once and handed here: the ``Resolver`` retries its resolution (ask the
store whether the transaction committed, then record the outcome once) with a growing backoff
until it succeeds. Nothing is persisted about a pending resolution: if the worker stops first,
the runs still unresolved are logged (``chain.outcome_unresolved``, with their correlation ids)
for an operator to check; a committed run's staged record is sealed by any worker's sweep anyway.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from ..errors import ServiceUnavailable
from ..store.base import StoreError

__all__ = ["Resolver", "Unresolved"]

log = logging.getLogger("controlplane.chain")

#: The first retry's delay and the longest one (seconds): a store back within a second is
#: resolved at once; one that stays away is asked about twice a minute.
FIRST_RETRY_S = 0.5
MAX_RETRY_S = 30.0


@dataclass
class Unresolved:
    """One run to resolve: ``attempt()`` returns True once the outcome is known and recorded
    (False: ask again later); a ``StoreError`` it raises also means later."""

    correlation_id: str
    action: str
    attempt: Callable[[], Awaitable[bool]]


class Resolver:
    """The worker's queue of unknown outcomes and the one task that works through it."""

    def __init__(self) -> None:
        self._waiting: list[Unresolved] = []
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._arrived = asyncio.Event()  # a new run cuts the backoff short

    def add(self, run: Unresolved) -> None:
        if self._closed:
            _unresolved(run, "the worker is stopping")
            return
        self._waiting.append(run)
        self._arrived.set()
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._work())

    async def _work(self) -> None:
        delay = FIRST_RETRY_S
        while self._waiting:
            self._arrived.clear()
            try:
                async with asyncio.timeout(delay):
                    await self._arrived.wait()
                await asyncio.sleep(FIRST_RETRY_S)  # a new run: its store is likely back soon
                delay = FIRST_RETRY_S
            except TimeoutError:
                pass
            for run in list(self._waiting):
                try:
                    done = await run.attempt()
                except (StoreError, ServiceUnavailable) as exc:  # the store is still away: later
                    log.info("unknown outcome not resolved yet", extra={"fields": {
                        "event": "chain.outcome_unknown_retry", "correlation_id": run.correlation_id,
                        "error": type(exc).__name__}})
                    done = False
                except Exception:
                    log.exception("resolving an unknown outcome failed; trying again later")
                    done = False
                if done:
                    self._waiting.remove(run)
            delay = min(delay * 2, MAX_RETRY_S)

    async def close(self) -> None:
        """Stop resolving; log each run left unresolved."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for run in self._waiting:
            _unresolved(run, "the worker stopped before the store answered")
        self._waiting.clear()


def _unresolved(run: Unresolved, why: str) -> None:
    log.error("unknown outcome left unresolved: %s", why, extra={"fields": {
        "event": "chain.outcome_unresolved", "correlation_id": run.correlation_id,
        "action": run.action}})
