"""Two replicas (two app instances, each with its own dispatcher) on one PostgreSQL schema, and two
workers on one SQLite file: every event of 200 tickets is delivered, and no event is ever being
delivered by both at once."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from service.notifications.dispatcher import NOTIFICATIONS
from service.storelink import STORE
from tests.notifications.receiver import Receiver
from tests.store import pg
from tests.store.helpers import ticket

TICKETS = 200


@pytest.fixture
async def receiver():
    # Each request is held a while, so a second delivery of one id in flight would overlap.
    r = await Receiver(delay_s=0.02, fail_first=3).start()
    yield r
    await r.stop()


@asynccontextmanager
async def _store(backend: str) -> AsyncIterator[dict[str, Any]]:
    if backend == "sqlite":  # both apps share the test's state dir, so one database file
        yield {}
        return
    async with pg.temp_schema("cp_outbox") as (dsn, schema):
        yield {"store": {"backend": "postgres", "postgres": {"dsn": dsn, "schema": schema}}}


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def test_two_replicas_deliver_every_event_never_concurrently_twice(
        make_client, receiver, backend):
    async with _store(backend) as store_overrides:
        overrides = {
            **store_overrides,
            "notifications": {
                "poll_interval_s": 0.05, "backoff_base_s": 0.05, "backoff_max_s": 0.1,
                "batch_size": 20,
                "sinks": [{"name": "hook", "type": "webhook", "url": f"{receiver.url}/hook",
                           "secrets": ["whsec_" + "a" * 44], "timeout_s": 2}],
            },
        }
        first = await make_client(overrides)
        second = await make_client(overrides)
        owners = {first.server.app[NOTIFICATIONS].owner, second.server.app[NOTIFICATIONS].owner}
        assert len(owners) == 2
        store = first.server.app[STORE].require()
        started, now = time.monotonic(), time.time()
        async with store.transaction() as tx:  # all 200 due at once: both replicas compete
            for i in range(TICKETS):
                await tx.create_ticket(ticket(f"tkt_{i:032x}", created_at=now,
                                              pending_until=now + 3600))
        await receiver.wait_for(
            lambda r: len({h.headers["webhook-id"] for h in r.accepted("/hook")}) >= TICKETS,
            timeout_s=60)
        elapsed = time.monotonic() - started

        accepted = Counter(h.headers["webhook-id"] for h in receiver.accepted("/hook"))
        events = await store.list_outbox(limit=500)
        assert len(events) == TICKETS
        assert set(accepted) == {e.id for e in events}
        assert receiver.overlaps == []  # never two deliveries of one id at the same time
        assert set(accepted.values()) == {1}  # and with the leases held, none twice at all
        print(f"{backend}: {TICKETS} events delivered by 2 replicas in {elapsed:.2f} s")
