"""A COMMIT whose answer is lost, through the real app and the real PostgreSQL: the run's outcome
is unknown to the service, so the answer says so (503 ``outcome_unknown``), never "nothing was
executed"; once the store answers, the outcome is resolved and the run keeps one audit record.

The fault proxy (tests/store/faultproxy.py) forwards the COMMIT and drops the server's answer
(the transaction committed), or drops the COMMIT itself (the server rolls it back).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from service.store import open_store
from service.store.base import StoreOutcomeUnknown
from service.store.postgres import PostgresStore
from tests.auth import bearer, login, step_up

from . import pg
from .faultproxy import FaultProxy, proxied

pytestmark = pytest.mark.postgres

RESOURCE = {"app": "web", "version": "1.2.3"}
#: Generous bound on the wait for the resolver (it retries within a second here).
RESOLVED_WITHIN_S = 20.0


@pytest.fixture
async def schema() -> AsyncIterator[tuple[str, str]]:
    async with pg.temp_schema("cp_unknown") as (dsn, name):
        yield dsn, name


@pytest.fixture
async def proxy(schema: tuple[str, str]) -> AsyncIterator[tuple[FaultProxy, str]]:
    async with proxied(schema[0]) as (p, dsn):
        yield p, dsn


@pytest.fixture
async def app_client(make_client: Any, schema: tuple[str, str],
                     proxy: tuple[FaultProxy, str]) -> TestClient:
    return await make_client({"store": {
        "backend": "postgres", "timeout_s": 2.0,
        "postgres": {"dsn": proxy[1], "schema": schema[1]},
    }})


async def entries_for(schema: tuple[str, str], correlation_id: str) -> list[dict[str, Any]]:
    """The sealed audit entries of one run, read straight from the database."""
    store = await open_store(schema[0], schema=schema[1])
    try:
        return [r.entry for r in await store.audit_range(0, 10_000)
                if r.entry.get("correlation_id") == correlation_id]
    finally:
        await store.close()


async def resolution(caplog: pytest.LogCaptureFixture, correlation_id: str) -> dict[str, Any]:
    """The fields of the resolver's log line for one run, once it has resolved it."""
    deadline = time.monotonic() + RESOLVED_WITHIN_S
    while True:
        for record in caplog.records:
            fields = getattr(record, "fields", {})
            if (fields.get("event") == "chain.outcome_resolved"
                    and fields.get("correlation_id") == correlation_id):
                return dict(fields)
        assert time.monotonic() < deadline, "the unknown outcome was not resolved"
        await asyncio.sleep(0.1)


async def approved_ticket(client: TestClient, alice: str) -> dict[str, Any]:
    created = await client.post("/api/v1/approvals", headers=bearer(alice), json={
        "subject_id": "alice", "env": "prod", "action": "installer.run.execute",
        "resource": RESOURCE, "reason": "release 1.2.3"})
    assert created.status == 201, await created.text()
    ticket = await created.json()
    bob = await step_up(client, await login(client, "bob"), "bob")
    review = await client.post(f"/api/v1/approvals/{ticket['id']}/reviews",
                               json={"decision": "approve"}, headers=bearer(bob))
    assert review.status == 200, await review.text()
    return dict(ticket)


def execute(client: TestClient, alice: str, ticket: dict[str, Any]) -> Any:
    return client.post(
        "/api/v1/installer/actions",
        json={"task_id": "t-prod", "action": "installer.run.execute", "resource": RESOURCE,
              "env": "prod"},
        headers=bearer(alice, **{"Approval-Ticket": ticket["id"],
                                 "Approval-Nonce": ticket["nonce"]}))


@pytest.mark.parametrize("delivered", [pytest.param(True, id="commit-applied"),
                                       pytest.param(False, id="commit-never-arrived")])
async def test_a_write_whose_commit_went_unanswered_is_unknown_then_resolved(
        schema, proxy, delivered):
    """The store claims neither outcome, and the database tells it afterwards."""
    fault, dsn = proxy
    store = await PostgresStore.open(dsn, schema=schema[1], timeout_s=2.0)
    try:
        fault.lose_commit_answer(b"INSERT INTO tasks", delivered=delivered)
        with pytest.raises(StoreOutcomeUnknown) as raised:
            async with store.transaction() as tx:
                await tx.ensure_task("t-1", "alice", 1.0)
                await tx.stage_audit({"action": "probe"}, 1.0)  # names the transaction
        assert fault.lost_answers == 1
        assert raised.value.committed is not None
        committed = raised.value.committed
        deadline = time.monotonic() + RESOLVED_WITHIN_S
        while (outcome := await committed()) is None:  # the server has yet to see it end
            assert time.monotonic() < deadline
            await asyncio.sleep(0.1)
        assert outcome is delivered
        assert (await store.get_task("t-1") is not None) is delivered
    finally:
        await store.close()
