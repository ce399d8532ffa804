"""The store as one worker sees it: connected, or not (yet), and why.

A worker whose store is unreachable at start-up starts degraded instead of not at all: status
surfaces stay up to say why, ``/readyz`` answers 503, protected actions 503, and the store is
retried in the background. Everything that needs the store asks the link for it per call, so
the moment it connects every component uses it, and no component holds a store that is not there.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from aiohttp import web

from .config import CONFIG, Config
from .repeats import log_failure
from .store import open_store
from .store.base import Store, StoreError, StoreUnavailable
from .store.sql import SchemaTooNew

__all__ = [
    "CONNECT_RETRY_MAX_S",
    "CONNECT_RETRY_S",
    "STATUS_REFRESH_S",
    "STORE",
    "StoreLink",
    "setup_store",
]

log = logging.getLogger("controlplane.store")

#: The first retry of an unreachable store waits this long; each failure doubles the wait, up
#: to ``CONNECT_RETRY_MAX_S``.
CONNECT_RETRY_S = 2.0
CONNECT_RETRY_MAX_S = 60.0
#: How often the store is pinged in the background for the status surfaces, which serve the
#: last result from memory: an anonymous status call never costs a store round trip.
STATUS_REFRESH_S = 1.0


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
        #: The last check's status object (``check``), served by the status surfaces.
        self.status: dict[str, Any] = {"status": "degraded", "detail": "store not checked yet"}
        #: How many checks (store pings) this worker has made.
        self.checks = 0
        #: Told of every store transaction this worker opens (``write``): the metrics hook.
        self.on_transaction: Callable[[bool], None] | None = None
        #: Told how many round trips each store transaction made: the metrics hook.
        self.on_round_trips: Callable[[int], None] | None = None
        # Per kind (write?): (failed calls, first failure, last failure) since the last call of
        # that kind the store served (monotonic seconds). A read served does not clear write
        # failures: a full disk or another process's lock fails writes while reads go on.
        self._failing: dict[bool, tuple[int, float, float]] = {}

    @property
    def timeout_s(self) -> float:
        """The deadline of every store call (``store.timeout_s``)."""
        return self._config.store.timeout_s

    @property
    def probe_timeout_s(self) -> float:
        """The bound of a readiness probe of the store (``store.probe_timeout_s``)."""
        return self._config.store.probe_timeout_s

    def observed(self, write: bool, served: bool) -> None:
        """The store's ``on_outcome`` hook: whether it served a transaction of this kind."""
        if served:
            if self._failing:
                self._failing.pop(write, None)
            return
        now = time.monotonic()
        failed, first, _ = self._failing.get(write, (0, now, now))
        self._failing[write] = (failed + 1, first, now)

    def recent_failures(self) -> dict[str, Any] | None:
        """The kinds of store call (reads, writes) that failed within ``store.failure_window_s``
        with none of their kind served since: how many, for how long, how recently. Counts and
        times only, never an error's text."""
        window = self._config.store.failure_window_s
        if window <= 0 or not self._failing:
            return None
        now = time.monotonic()
        recent = {
            "writes" if write else "reads": {"failed": failed, "for_s": round(now - first, 1),
                                             "last_s_ago": round(now - last, 1)}
            for write, (failed, first, last) in sorted(self._failing.items())
            if now - last <= window
        }
        return {**recent, "window_s": window} if recent else None

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
        store.on_transaction = self.on_transaction
        store.on_round_trips = self.on_round_trips
        store.on_outcome = self.observed
        self.store, self.error = store, None
        self.status = {"status": "ready", "describe": await store.describe()}
        log.info("store connected", extra={"fields": {
            "event": "store.connected", "backend": self._config.store.backend,
            "failed_attempts": self.failures}})
        self.failures = 0
        return True

    async def check(self) -> dict[str, Any]:
        """Ping the store (within ``store.probe_timeout_s``) and keep the result as ``status``:
        ``ready`` with the store's self-description, or ``degraded`` with why (never the DSN
        or a path): the ping failed or was late, or calls of some kind failed recently with
        none served since (``recent_failures``), e.g. every write on a full disk."""
        store = self.store
        if store is None:
            self.status = self.current_status()
            return self.status
        self.checks += 1
        try:
            # A probe answers promptly: a store that cannot answer a ping within this bound
            # is not ready, whatever each call's own deadline (``store.timeout_s``).
            async with asyncio.timeout(self.probe_timeout_s):
                await store.ping()
        except (StoreError, TimeoutError) as exc:
            if isinstance(exc, TimeoutError):
                self.observed(False, False)  # cancelled, the ping could not say so itself
            status = {"status": "degraded", "detail": "store unreachable",
                      "describe": await store.describe()}
        else:
            status = {"status": "ready", "describe": await store.describe()}
        recent = self.recent_failures()
        if recent is not None:
            status["recent_failures"] = recent
            if status["status"] == "ready":
                status.update(status="degraded", detail="store calls failed recently")
        if self.store is store:  # not closed or replaced meanwhile
            self.status = status
        return status

    def current_status(self) -> dict[str, Any]:
        """The status object from memory: the last ``check``, or (while there is no store)
        why not, which needs no round trip."""
        if self.store is None:
            if self.schema_too_new:
                return {"status": "degraded", "detail": "the database schema is newer than "
                        "this build; deploy a newer build"}
            if self.configured:
                return {"status": "degraded", "detail": "store unreachable; retrying"}
            return {"status": "placeholder", "detail": "no store configured (store.backend: none)"}
        return self.status

    async def refreshing(self, interval_s: float) -> None:
        """Check the store every ``interval_s`` for the status surfaces (never raises)."""
        while True:
            try:
                await self.check()
            except Exception as exc:  # check() reports store errors itself: a bug
                log_failure(log, "store status check failed", exc, event="store.check_failed")
            await asyncio.sleep(interval_s)

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


#: The store as this worker sees it: connected, or not (yet), with the reason.
STORE: web.AppKey[StoreLink] = web.AppKey("store")


def setup_store(app: web.Application, *, on_transaction: Callable[[bool], None] | None = None,
                on_round_trips: Callable[[int], None] | None = None) -> None:
    """Open the store on start-up (or keep retrying in the background); close it on shutdown.
    The hooks (the metrics', given by ``app``) are the link's ``on_transaction`` and
    ``on_round_trips``: the link does not know who counts (metrics reads the link's store)."""

    async def store_ctx(app: web.Application) -> AsyncIterator[None]:
        link = app[STORE] = StoreLink(app[CONFIG])
        link.on_transaction, link.on_round_trips = on_transaction, on_round_trips
        retrying: asyncio.Task[None] | None = None
        if link.configured and not await link.connect():
            if app[CONFIG].store.required:
                # store.required: a worker that cannot reach its store does not start at all.
                raise StoreUnavailable(f"store unreachable at start and store.required is "
                                       f"true: {link.error}")
            if not link.schema_too_new:
                retrying = asyncio.create_task(link.retry())
        await link.check()
        refreshing = asyncio.create_task(link.refreshing(STATUS_REFRESH_S))
        try:
            yield
        finally:
            tasks = [t for t in (retrying, refreshing) if t is not None]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await link.close()

    app.cleanup_ctx.append(store_ctx)
