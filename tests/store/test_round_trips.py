"""Round trips per store call on PostgreSQL, counted by the store itself (the
``controlplane_store_round_trips_total`` metric): the production chain's own calls are pinned
here, so a change that adds a round trip to them is seen."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from service.store import Conflict, Store, open_store
from service.store.base import TaskOps
from tests.auth import bearer, login, step_up
from tests.metrics import scrape, value

from . import pg
from .helpers import T0, approved_ticket, binding
from .test_outcome_unknown import approved_ticket as approved_run_ticket
from .test_outcome_unknown import execute as execute_run

pytestmark = pytest.mark.postgres


@pytest.fixture
async def counted() -> AsyncIterator[tuple[Store, list[int]]]:
    async with pg.temp_schema("cp_trips") as (dsn, schema):
        store = await open_store(dsn, schema=schema)
        trips: list[int] = []
        store.on_round_trips = trips.append
        try:
            yield store, trips
        finally:
            await store.close()


async def test_a_ticket_with_its_reviews_is_one_statement_without_begin_or_commit(counted):
    store, trips = counted
    await approved_ticket(store)
    trips.clear()
    ticket = await store.get_ticket("t-1")
    assert ticket is not None and len(ticket.reviews) == 1
    assert trips == [1]
    assert await store.get_ticket("t-unknown") is None
    assert trips == [1, 1]


async def test_the_chain_run_transaction_makes_one_round_trip_per_step(counted):
    store, trips = counted
    rec = await approved_ticket(store)
    trips.clear()
    async with store.transaction() as tx:
        consumed = await tx.consume_ticket("t-1", **binding(rec))
        task = await tx.ensure_task("task-1", "alice", T0 + 30)
        event = await tx.append_event("task-1", "installer.run.requested", "alice", {}, T0 + 30)
    assert consumed.state == "consumed" and len(consumed.reviews) == 1
    assert task.last_seq == 0 and event.seq == 1
    # BEGIN; consume with its reviews; the outbox event; the task; its seq and event; COMMIT.
    assert trips == [6]


async def test_a_run_redeeming_a_ticket_sends_its_writes_in_one_call(counted):
    """A production run's transaction (``run_transaction``): one read of the task, then the
    consumption, its outbox event, the task, its step event and the staged audit record in one
    call of ``cp_chain_run``, which commits on its own (no BEGIN, no COMMIT)."""
    store, trips = counted
    rec = await approved_ticket(store)
    pre_read = await store.get_ticket("t-1")
    trips.clear()
    async with store.run_transaction(pre_read) as tx:
        consumed = await tx.consume_ticket("t-1", **binding(rec))
        task = await tx.ensure_task("task-1", "alice", T0 + 30)
        event = await tx.append_event("task-1", "installer.run.requested", "alice", {}, T0 + 30)
        staged = await tx.stage_audit({"action": "installer.run.execute"}, T0 + 30)
    assert consumed.state == "consumed" and len(consumed.reviews) == 1
    assert task.last_seq == 0 and event.seq == 1 and staged > 0
    assert trips == [1, 1]
    # All of it was written, once.
    after = await store.get_ticket("t-1")
    assert after is not None and after.state == "consumed"
    assert after.consumed_correlation_id == binding(rec)["correlation_id"]
    assert [e.seq for e in await store.list_events("task-1")] == [1]
    outbox = [e.type for e in await store.list_outbox() if e.ticket_id == "t-1"]
    assert outbox.count("approval.consumed") == 1
    # A second redemption of the same ticket is refused as the conditional UPDATE refuses it,
    # and writes nothing.
    with pytest.raises(Conflict) as refused:
        async with store.run_transaction(pre_read) as tx:
            await tx.consume_ticket("t-1", **binding(rec))
            await tx.ensure_task("task-1", "alice", T0 + 40)
            await tx.append_event("task-1", "installer.run.requested", "alice", {}, T0 + 40)
            await tx.stage_audit({"action": "installer.run.execute"}, T0 + 40)
    assert refused.value.reason == "ticket_consumed"
    assert [e.seq for e in await store.list_events("task-1")] == [1]


async def test_a_run_takes_the_task_its_ticket_pre_read_found_and_reads_no_other(counted):
    """``get_ticket_and_task``: the ticket and the run's task in one statement; the run's
    transaction then sends its writes in one call with no read of its own. The call re-checks
    what the pre-read found: a step event appended since fails the run and writes nothing."""
    store, trips = counted
    rec = await approved_ticket(store)
    await approved_ticket(store, "t-2")
    await store.append_event(
        (await store.ensure_task("task-1", "alice", T0)).id, "step", "alice", {}, T0)
    trips.clear()
    pre_read, task = await store.get_ticket_and_task("t-1", "task-1")
    assert trips == [1]
    assert pre_read == await store.get_ticket("t-1")
    assert task is not None and task.task is not None and task.task.last_seq == 1
    _, unknown = await store.get_ticket_and_task("t-1", "task-new")
    assert unknown is not None and unknown.id == "task-new" and unknown.task is None
    assert await store.get_ticket_and_task("t-unknown", "task-1") == (None, None)
    trips.clear()
    async with store.run_transaction(pre_read, task) as tx:
        await tx.consume_ticket("t-1", **binding(rec))
        assert await tx.ensure_task("task-1", "alice", T0 + 30) == task.task
        event = await tx.append_event("task-1", "installer.run.requested", "alice", {}, T0 + 30)
        await tx.stage_audit({"action": "installer.run.execute"}, T0 + 30)
    assert event.seq == 2 and trips == [1]
    assert [e.seq for e in await store.list_events("task-1")] == [1, 2]
    # A task read that is no longer true (seq 2 was appended since): refused, nothing written.
    ticket_2, _ = await store.get_ticket_and_task("t-2", "task-1")
    with pytest.raises(Conflict) as refused:
        async with store.run_transaction(ticket_2, task) as tx:
            await tx.consume_ticket("t-2", **binding(rec, correlation_id="corr-2"))
            await tx.ensure_task("task-1", "alice", T0 + 40)
            await tx.append_event("task-1", "installer.run.requested", "alice", {}, T0 + 40)
            await tx.stage_audit({"action": "installer.run.execute"}, T0 + 40)
    assert refused.value.reason == "state_conflict"
    assert [e.seq for e in await store.list_events("task-1")] == [1, 2]
    after = await store.get_ticket("t-2")
    assert after is not None and after.state == "approved"


async def test_concurrent_one_call_runs_of_one_ticket_consume_it_exactly_once(counted):
    store, _ = counted
    rec = await approved_ticket(store)
    pre_read = await store.get_ticket("t-1")

    async def redeem(n: int) -> str:
        try:
            async with store.run_transaction(pre_read) as tx:
                await tx.consume_ticket("t-1", **binding(rec))
                await tx.ensure_task(f"task-{n}", "alice", T0 + 30)
                await tx.append_event(f"task-{n}", "installer.run.requested", "alice", {}, T0 + 30)
                await tx.stage_audit({"n": n}, T0 + 30)
        except Conflict as exc:
            return exc.reason
        return "consumed"

    results = await asyncio.gather(*(redeem(n) for n in range(8)))
    assert sorted(results) == ["consumed"] + ["ticket_consumed"] * 7
    tasks = [await store.get_task(f"task-{n}") for n in range(8)]
    assert sum(task is not None for task in tasks) == 1  # the losers wrote nothing


async def test_a_production_run_through_the_app_is_four_round_trips(make_client):
    """POST /api/v1/installer/actions in production on PostgreSQL, counted by the metric: the
    session check with the ticket and the run's task (one statement: ``get_run_read``), the
    one call of the run's writes, then sealing its record (read the staged rows, swap the
    head)."""
    async with pg.temp_schema("cp_trips_run") as (dsn, schema):
        client = await make_client({"store": {"backend": "postgres",
                                              "postgres": {"dsn": dsn, "schema": schema}}})
        alice = await step_up(client, await login(client, "alice"), "alice")
        name = "controlplane_store_round_trips"
        # The metric counts the process's background work too (the store link's ping every
        # second, the audit tip's walk): a run is deterministic and background trips only add,
        # so the fewest of three runs is the run's own count.
        deltas = []
        for _ in range(3):
            ticket = await approved_run_ticket(client, alice)
            before = value(await scrape(client), name, name + "_total")
            response = await execute_run(client, alice, ticket)
            assert response.status == 202, await response.text()
            deltas.append(value(await scrape(client), name, name + "_total") - before)
        assert min(deltas) == 4, deltas


async def test_one_call_outside_a_chain_is_begin_its_statements_and_commit(counted):
    store, trips = counted
    ops: TaskOps = store
    await ops.ensure_task("task-1", "alice", T0)
    await ops.ensure_task("task-1", "alice", T0)  # exists: the INSERT returns nothing, one read
    await ops.append_event("task-1", "step", "alice", {"n": 1}, T0)
    assert trips == [3, 4, 3]


async def test_a_refused_write_counts_its_rollback(counted):
    store, trips = counted
    rec = await approved_ticket(store)
    await store.consume_ticket("t-1", **binding(rec))
    trips.clear()
    with pytest.raises(Conflict):
        await store.consume_ticket("t-1", **binding(rec))
    # BEGIN; the UPDATE that matches nothing; the re-read that says why; ROLLBACK.
    assert trips == [4]


async def test_the_metric_counts_the_round_trips_of_a_request(make_client):
    """``controlplane_store_round_trips_total`` on a scraped /metrics of an app on PostgreSQL:
    an authenticated read adds at least its session check and its audit record's writes."""
    async with pg.temp_schema("cp_trips_http") as (dsn, schema):
        client = await make_client({"store": {"backend": "postgres",
                                              "postgres": {"dsn": dsn, "schema": schema}}})
        alice = await login(client, "alice")
        name = "controlplane_store_round_trips"
        before = value(await scrape(client), name, name + "_total")
        assert before > 0  # the login's writes
        response = await client.get("/api/v1/tasks/t-unknown", headers=bearer(alice))
        assert response.status == 404
        after = value(await scrape(client), name, name + "_total")
        assert after - before >= 2  # the session check, then the refusal's audit record
