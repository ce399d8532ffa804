"""A COMMIT whose answer is lost, through the real app and the real PostgreSQL: the run's outcome
is unknown to the service, so the answer says so (503 ``outcome_unknown``), never "nothing was
executed"; once the store answers, the outcome is resolved and the run keeps one audit record.

The fault proxy (tests/store/faultproxy.py) forwards the COMMIT and drops the server's answer
(the transaction committed), or drops the COMMIT itself (the server rolls it back).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from service.audit.log import AUDIT
from service.store import open_store
from service.store.base import StoreOutcomeUnknown
from service.store.postgres import PostgresStore
from tests.auth import bearer, login, step_up
from tests.problems import assert_problem

pytestmark = pytest.mark.postgres

RESOURCE = {"app": "web", "version": "1.2.3"}
#: Generous bound on the wait for the resolver (it retries within a second here).
RESOLVED_WITHIN_S = 20.0
#: In the one call that carries a production run's writes (``store.pgrun``): its audit entry.
RUN_CALL = b'"outcome":"executed","path":"/api/v1/installer/actions"'




async def entries_where(schema: tuple[str, str], key: str, value: str) -> list[dict[str, Any]]:
    """The sealed audit entries whose ``key`` is ``value``, read straight from the database."""
    store = await open_store(schema[0], schema=schema[1])
    try:
        return [r.entry for r in await store.audit_range(0, 10_000) if r.entry.get(key) == value]
    finally:
        await store.close()


async def entries_for(schema: tuple[str, str], correlation_id: str) -> list[dict[str, Any]]:
    """The sealed audit entries of one run."""
    return await entries_where(schema, "correlation_id", correlation_id)


async def entries_for_ticket(schema: tuple[str, str], ticket_id: str) -> list[dict[str, Any]]:
    return await entries_where(schema, "ticket_id", ticket_id)


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


async def test_a_lost_commit_answer_of_an_executed_run_is_unknown_not_nothing_executed(
        app_client, proxy, schema, caplog):
    fault, _ = proxy
    caplog.set_level(logging.INFO, logger="controlplane.chain")
    alice = await step_up(app_client, await login(app_client, "alice"), "alice")
    ticket = await approved_ticket(app_client, alice)

    fault.lose_answer(RUN_CALL)
    first = await execute(app_client, alice, ticket)
    assert fault.lost_answers == 1
    body = await assert_problem(first, 503, "outcome_unknown")
    assert body["ticket_id"] == ticket["id"] and body["task_id"] == "t-prod"
    cid = first.headers["X-Correlation-ID"]

    # The ticket was consumed by the run that committed: the retry is refused, truthfully.
    await assert_problem(await execute(app_client, alice, ticket), 409, "ticket_consumed")
    assert (await resolution(caplog, cid))["committed"] is True
    entries = await entries_for(schema, cid)
    assert [(e["outcome"], e["status"]) for e in entries] == [("executed", 202)]
    assert entries[0]["ticket_consumed"] is True
    task = await app_client.get("/api/v1/tasks/t-prod", headers=bearer(alice))
    assert task.status == 200, await task.text()


async def test_a_commit_that_never_reached_the_server_is_recorded_failed_once(
        app_client, proxy, schema, caplog):
    fault, _ = proxy
    caplog.set_level(logging.INFO, logger="controlplane.chain")
    alice = await step_up(app_client, await login(app_client, "alice"), "alice")
    ticket = await approved_ticket(app_client, alice)

    fault.lose_answer(RUN_CALL, delivered=False)
    first = await execute(app_client, alice, ticket)
    assert fault.lost_answers == 1
    await assert_problem(first, 503, "outcome_unknown")
    cid = first.headers["X-Correlation-ID"]

    assert (await resolution(caplog, cid))["committed"] is False
    entries = await entries_for(schema, cid)
    assert [(e["outcome"], e["status"], e["error"]) for e in entries] == [
        ("failed", 503, "outcome_unknown")]
    assert "ticket_consumed" not in entries[0]
    # Nothing was executed: the ticket is still approved, and the retry runs.
    retry = await execute(app_client, alice, ticket)
    assert retry.status == 202, await retry.text()
    retried = await entries_for(schema, retry.headers["X-Correlation-ID"])
    assert [(e["outcome"], e["status"]) for e in retried] == [("executed", 202)]


async def test_a_ticket_created_without_its_answer_is_withdrawn_not_left_unusable(
        app_client, proxy, schema, caplog):
    fault, _ = proxy
    caplog.set_level(logging.INFO, logger="controlplane.chain")
    alice = await login(app_client, "alice")

    fault.lose_commit_answer(b"INSERT INTO tickets")
    created = await app_client.post("/api/v1/approvals", headers=bearer(alice), json={
        "subject_id": "alice", "env": "prod", "action": "installer.run.execute",
        "resource": RESOURCE})
    assert fault.lost_answers == 1
    body = await assert_problem(created, 503, "outcome_unknown")
    assert "nonce" not in body
    ticket_id = body["ticket_id"]
    cid = created.headers["X-Correlation-ID"]

    assert (await resolution(caplog, cid))["committed"] is True
    # Its requester never had the nonce: the ticket is withdrawn, out of the approvers' queue.
    read = await app_client.get(f"/api/v1/approvals/{ticket_id}", headers=bearer(alice))
    assert read.status == 200, await read.text()
    assert (await read.json())["state"] == "revoked"
    pending = await app_client.get("/api/v1/approvals?state=pending", headers=bearer(alice))
    assert pending.status == 200, await pending.text()
    assert ticket_id not in [t["id"] for t in (await pending.json())["items"]]
    # The creation run has its one record; the withdrawal is a run of its own.
    assert [(e["outcome"], e["status"]) for e in await entries_for(schema, cid)] == [
        ("executed", 201)]
    withdrawals = [e for e in await entries_for_ticket(schema, ticket_id)
                   if e["action"] == "approvals.withdraw"]
    assert [(e["principal"]["subject_id"], e["cause_correlation_id"]) for e in withdrawals] == [
        ("system", cid)]
    count, broken = await app_client.server.app[AUDIT].verify()
    assert broken is None and count >= 3
