"""The store as one worker sees it: connected, or not (yet), and why.

A worker whose store is unreachable at start-up starts degraded instead of not at all: status
surfaces stay up to say why, ``/readyz`` answers 503, protected actions 503, and the store is
retried in the background. Everything that needs the store asks the link for it per call, so
the moment it connects every component uses it, and no component holds a store that is not there.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

from aiohttp import web

from .appkeys import CONFIG, STORE
from .config import Config
from .store import open_store
from .store.base import Store, StoreError, StoreUnavailable
from .store.sql import SchemaTooNew

__all__ = ["CONNECT_RETRY_MAX_S", "CONNECT_RETRY_S", "StoreLink", "setup_store"]

log = logging.getLogger("controlplane.store")

#: The first retry of an unreachable store waits this long; each failure doubles the wait, up
#: to ``CONNECT_RETRY_MAX_S``.
CONNECT_RETRY_S = 2.0
CONNECT_RETRY_MAX_S = 60.0


class StoreLink:
    """The worker's store, once it answers."""

    def __init__(self, config: Config) -> None:
        self._config = config
        self.store: Store | None = None
        #: Why there is no store: where and why, never the DSN's user info or password.
        self.error: str | None = None
        #: The database was migrated by a newer build: retrying cannot help, a newer build can.
        self.schema_too_new = False
        #: Failed connection attempts since the last success (the first one is logged).
        self.failures = 0

    @property
    def timeout_s(self) -> float:
        """The deadline of every store call (``store.timeout_s``)."""
        return self._config.store.timeout_s

    @property
    def configured(self) -> bool:
        return self._config.store.backend != "none"

    def require(self) -> Store:
        """The store; ``StoreUnavailable`` (503 ``store_unavailable``) while there is none."""
        if self.store is None:
            raise StoreUnavailable(
                "no store is configured (store.backend is none)" if not self.configured
                else "the store is not connected"
            )
        return self.store

    async def connect(self) -> bool:
        """Open the store; False (and the reason kept) when unreachable."""
        url = self._config.store.url
        assert url is not None
        try:
            store = await open_store(url.reveal(), schema=self._config.store.postgres_schema,
                                     timeout_s=self.timeout_s)
        except SchemaTooNew as exc:
            # Said once: this worker stays not ready until a build that knows the schema runs.
            self.error, self.schema_too_new = str(exc), True
            log.critical("store refused: %s; this worker stays not ready", exc,
                         extra={"fields": {"event": "store.schema_too_new",
                                           "backend": self._config.store.backend}})
            return False
        except StoreError as exc:
            self.error = str(exc)
            self.failures += 1
            # A state change is logged once: the first failure; the retries only at DEBUG.
            log.log(logging.ERROR if self.failures == 1 else logging.DEBUG,
                    "store unavailable: %s", exc,
                    extra={"fields": {"event": "store.unavailable", "attempt": self.failures,
                                      "backend": self._config.store.backend}})
            return False
        self.store, self.error = store, None
        log.info("store connected", extra={"fields": {
            "event": "store.connected", "backend": self._config.store.backend,
            "failed_attempts": self.failures}})
        self.failures = 0
        return True

    async def retry(self) -> None:
        """Retry until the store answers (each failure is logged by ``connect``), with
        exponential backoff: ``CONNECT_RETRY_S``, then doubled per failure up to
        ``CONNECT_RETRY_MAX_S``; not at all once the schema is known to be newer than this build."""
        delay = CONNECT_RETRY_S
        while not self.schema_too_new:
            await asyncio.sleep(delay)
            if await self.connect():
                return
            delay = min(delay * 2, max(CONNECT_RETRY_MAX_S, CONNECT_RETRY_S))

    async def close(self) -> None:
        if self.store is not None:
            await self.store.close()
            self.store = None
            log.info("store closed", extra={"fields": {
                "event": "store.closed", "backend": self._config.store.backend}})


def setup_store(app: web.Application) -> None:
    """Open the store on start-up (or keep retrying in the background); close it on shutdown."""

    async def store_ctx(app: web.Application) -> AsyncIterator[None]:
        link = app[STORE] = StoreLink(app[CONFIG])
        retrying: asyncio.Task[None] | None = None
        if link.configured and not await link.connect():
            if app[CONFIG].store.required:
                # store.required: a worker that cannot reach its store does not start at all.
                raise StoreUnavailable(f"store unreachable at start and store.required is "
                                       f"true: {link.error}")
            if not link.schema_too_new:
                retrying = asyncio.create_task(link.retry())
        try:
            yield
        finally:
            if retrying is not None:
                retrying.cancel()
                await asyncio.gather(retrying, return_exceptions=True)
            await link.close()

    app.cleanup_ctx.append(store_ctx)
