"""The outbox dispatcher: one per server process, delivering ``approval.*`` events to the sinks.

A round: if any event is due (a read, so idle dispatchers of many workers take no write lock),
claim up to ``batch_size`` due events under a lease of ``lease_s`` (the store guarantees no two
dispatchers hold one event at once, on any number of processes or replicas, and that events of
one ticket are claimed in order), deliver each to every sink whose filters match and that has
not accepted it yet (all at once), then record the attempts and the event's next state:

- every matching sink accepted it: ``delivered``;
- otherwise ``pending`` again, due after an exponential backoff with jitter
  (``backoff_base_s * 2**(attempts-1)``, capped at ``backoff_max_s``, times a random factor in
  [0.5, 1)), never later than the end of its ``max_age_s`` window;
- a failure at or past the end of the window: ``dead`` (``cpctl notifications list --failed``,
  ``cpctl notifications retry ID``).

Delivery is at least once: a process that dies between a sink's 2xx and the record of it, or a
lease that ends mid-round, means the event goes out again, with the same ``webhook-id`` /
CloudEvents ``id`` for receivers to de-duplicate on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, Protocol

import aiohttp
from aiohttp import web

from .. import clock
from ..background import background
from ..config import NotificationsConfig
from ..repeats import log_failure
from ..store.base import DeliveryRecord, OutboxEvent, OutboxState, Store, StoreError
from .envelope import event_data
from .sinks import Attempt, make_sink

__all__ = ["NOTIFICATIONS", "Dispatcher", "ReviewersOf", "dispatching"]

log = logging.getLogger("controlplane.notifications")

#: Who may review a requested ticket (None: not a request, nothing to suggest).
ReviewersOf = Callable[[Store, OutboxEvent, float], Awaitable[Sequence[str] | None]]
#: The policy change a requested ticket is about (``policytools.change``), None for other events.
ChangeOf = Callable[[Store, OutboxEvent], Awaitable[dict[str, Any] | None]]


class Observer(Protocol):
    """Told what each round did (the worker's metrics: ``Metrics.notification_*``)."""

    def notification_sinks(self, names: Sequence[str]) -> None: ...
    def notification_delivery(self, sink: str, delivered: bool) -> None: ...
    def notification_events_ended(self, outcome: str, count: int = 1) -> None: ...


#: How often delivered events past their retention are deleted.
PURGE_INTERVAL_S = 3600.0

_random = secrets.SystemRandom()


class Dispatcher:
    """Claims and delivers due outbox events (``round``), in a loop while ``dispatching``."""

    def __init__(self, store: Callable[[], Store | None], config: NotificationsConfig,
                 reviewers: ReviewersOf, observer: Observer | None = None,
                 changes: ChangeOf | None = None) -> None:
        self._store = store
        self._changes = changes
        self._config = config
        self._reviewers = reviewers
        self.sinks = [make_sink(s, config.source) for s in config.sinks]
        self._observer = observer
        if observer is not None:
            observer.notification_sinks([s.name for s in self.sinks])
        #: This dispatcher's lease owner id (host, pid and a random part: unique per process).
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._last_purge = 0.0

    async def _change(self, store: Store, event: OutboxEvent) -> dict[str, Any] | None:
        if self._changes is None or event.type != "approval.requested":
            return None
        try:
            return await self._changes(store, event)
        except Exception:  # never holds a delivery back: the console and API show it too
            log.exception("notifications: the policy change of %s could not be read",
                          event.ticket_id)
            return None

    def backoff(self, attempts: int) -> float:
        """Seconds before the next attempt after ``attempts`` failed ones (jittered)."""
        config = self._config
        delay = min(config.backoff_max_s, config.backoff_base_s * 2.0 ** max(0, attempts - 1))
        return float(delay * (0.5 + 0.5 * _random.random()))

    async def round(self, session: aiohttp.ClientSession, now: float) -> int:
        """One claim-and-deliver round; returns how many events it claimed."""
        store = self._store()
        if store is None:
            return 0
        if now - self._last_purge >= PURGE_INTERVAL_S:
            self._last_purge = now
            purged = await store.purge_outbox(now - self._config.retention_s)
            if purged:
                log.info("purged %d delivered notification events", purged)
        if not await store.outbox_due(now):
            return 0
        if not self.sinks:
            # Nothing to deliver to: every due event is finished in one statement, instead of
            # a claim and a record per event (each a write transaction beside the requests').
            settled = await store.settle_outbox(now, self._config.batch_size)
            if self._observer is not None and settled:
                self._observer.notification_events_ended("settled", settled)
            return settled
        events = await store.claim_outbox(self.owner, now, self._config.lease_s,
                                          self._config.batch_size)
        results = await asyncio.gather(*(self._deliver(store, session, e) for e in events),
                                       return_exceptions=True)
        for event, result in zip(events, results, strict=True):
            # One event's failure (the store gone mid-round) leaves the others' records alone;
            # its lease runs out and it is delivered again.
            if isinstance(result, StoreError):
                log.warning("notification %s not recorded: store unavailable", event.id)
            elif isinstance(result, Exception):
                log.error("notification %s failed", event.id, exc_info=result)
        return len(events)

    async def _deliver(self, store: Store, session: aiohttp.ClientSession,
                       event: OutboxEvent) -> None:
        targets = [s for s in self.sinks if s.wants(event) and s.name not in event.delivered_sinks]
        attempts: list[Attempt] = []
        if targets:
            now = clock.now()
            data = event_data(event, self._config.public_url,
                              await self._reviewers(store, event, now))
            change = await self._change(store, event)
            if change is not None:
                data["policy_change"] = change
            attempts = list(await asyncio.gather(
                *(sink.send(session, event, data, now) for sink in targets)))
        now = clock.now()
        records = [
            DeliveryRecord(event.id, sink.name, "delivered" if a.ok else "failed", 1,
                           a.status, a.error, now)
            for sink, a in zip(targets, attempts, strict=True)
        ]
        failed = [f"{r.sink}: {r.last_error}" for r in records if r.state == "failed"]
        end_of_window = event.window_start + self._config.max_age_s
        state: OutboxState
        if not failed:
            state, due, error = "delivered", now, None
        elif now >= end_of_window:
            state, due, error = "dead", now, "; ".join(failed)
        else:
            state, due = "pending", min(now + self.backoff(event.attempts + 1), end_of_window)
            error = "; ".join(failed)
        if self._observer is not None:
            for record in records:
                self._observer.notification_delivery(record.sink, record.state == "delivered")
        finished = await store.finish_outbox(event.id, self.owner, records, state=state,
                                             next_attempt_at=due, error=error, now=now)
        # What became of the event: one classification for the metric and the log line.
        outcome = "lease_lost" if not finished else "retried" if state == "pending" else state
        if self._observer is not None:
            self._observer.notification_events_ended(outcome)
        fields: dict[str, Any] = {"event_id": event.id, "type": event.type,
                                  "ticket_id": event.ticket_id, "attempt": event.attempts + 1}
        if outcome == "lease_lost":
            log.warning("notification lease lost before its attempts were recorded",
                        extra={"fields": {"event": "notification.lease_lost", **fields}})
        elif outcome == "dead":
            log.error("notification dead-lettered after %s", error,
                      extra={"fields": {"event": "notification.dead", **fields}})
        elif outcome == "retried":
            log.warning("notification delivery failed (retried): %s", error,
                        extra={"fields": {"event": "notification.failed", **fields}})
        elif records:
            log.info("notification delivered", extra={"fields": {
                "event": "notification.delivered", **fields, "sinks": [r.sink for r in records]}})


#: The notification outbox dispatcher of this process (``service.notifications``).
NOTIFICATIONS: web.AppKey[Dispatcher] = web.AppKey("notifications")

@contextlib.asynccontextmanager
async def dispatching(dispatcher: Dispatcher, config: NotificationsConfig) -> AsyncIterator[None]:
    """Run ``dispatcher`` while open; on close, let the round in flight finish (within the
    longest sink timeout), so its deliveries are recorded rather than repeated."""
    stop = asyncio.Event()
    # No cookies kept between deliveries, no proxy or credentials taken from the environment.
    session = aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar(), trust_env=False,
                                    timeout=aiohttp.ClientTimeout(total=None))

    async def loop() -> None:
        while not stop.is_set():
            claimed = 0
            try:
                claimed = await dispatcher.round(session, clock.now())
            except StoreError as exc:
                # An outage skips every round (one per poll interval): once per interval, counted.
                log_failure(log, "notification round skipped", exc,
                            event="notifications.round_skipped", expected=(StoreError,),
                            level=logging.WARNING)
            except Exception as exc:
                log_failure(log, "notification round failed", exc,
                            event="notifications.round_failed")
            if claimed < config.batch_size:  # a full batch: more may be due at once
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), config.poll_interval_s)

    try:
        async with background(loop()) as task:
            try:
                yield
            finally:
                stop.set()
                grace = max((s.timeout_s for s in config.sinks), default=0.0) + 1.0
                with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                    await asyncio.wait_for(asyncio.shield(task), grace)
    finally:
        await session.close()
