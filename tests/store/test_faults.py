"""Store faults through the real app and the real PostgreSQL, with a fault-injecting TCP proxy
(tests/store/faultproxy.py) between them: stalls, resets right after COMMIT, outages, and a
database whose schema is newer than this build."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from aiohttp import ClientResponse

from service import storelink
from service.audit.log import AUDIT
from service.store import open_store
from service.store.base import StoreUnavailable
from service.store.postgres import PostgresStore
from service.storelink import STORE
from tests.auth import bearer, login
from tests.problems import assert_problem

from .conftest import ANSWERED_WITHIN_S, DEADLINE_S

pytestmark = pytest.mark.postgres

RESOURCE = {"app": "web", "version": "1.2.3"}


def installer_body(task_id: str) -> dict[str, Any]:
    return {"task_id": task_id, "action": "installer.run.execute", "resource": RESOURCE,
            "env": "dev"}




async def entries_for(schema: tuple[str, str], correlation_id: str) -> list[dict[str, Any]]:
    """The audit entries of one run, read straight from the database (not through the proxy)."""
    store = await open_store(schema[0], schema=schema[1])
    try:
        return [r.entry for r in await store.audit_range(0, 10_000)
                if r.entry.get("correlation_id") == correlation_id]
    finally:
        await store.close()


async def timed(request: Any) -> tuple[ClientResponse, float]:
    started = time.monotonic()
    response = await request
    await response.read()
    return response, time.monotonic() - started


async def assert_store_unavailable(response: ClientResponse) -> None:
    await assert_problem(response, 503, "store_unavailable")
    assert int(response.headers["Retry-After"]) >= 1


async def test_stall_answers_every_request_within_the_deadline(app_client, proxy, schema):
    fault, _ = proxy
    alice = await login(app_client, "alice")
    before = await app_client.post("/api/v1/installer/actions", json=installer_body("t-before"),
                                   headers=bearer(alice))
    assert before.status == 202, await before.text()
    acknowledged = before.headers["X-Correlation-ID"]

    fault.stall()
    stalled_at = time.monotonic()
    try:
        results = await asyncio.gather(
            timed(app_client.get("/api/v1/tasks/t-before", headers=bearer(alice))),
            timed(app_client.post("/api/v1/installer/actions", json=installer_body("t-stall"),
                                  headers=bearer(alice))),
            timed(app_client.post("/api/v1/authn/sessions",
                                  json={"subject_id": "bob", "password": "bob-dev-password"})),
            timed(app_client.get("/api/v1/tasks/t-before")),  # anonymous: a refusal to record
            timed(app_client.get("/readyz")),
        )
        (read, read_s), (write, write_s), (log_in, login_s), (anon, anon_s), (ready, ready_s) = results
        for _, elapsed in results:
            assert elapsed <= ANSWERED_WITHIN_S, [round(s, 2) for _, s in results]
        for response in (read, write, log_in, anon):
            await assert_store_unavailable(response)
        body = await assert_problem(ready, 503, "not_ready")
        assert body["components"] == {"store": "degraded"}
        # Later requests during the same stall are just as bounded.
        again, again_s = await timed(app_client.get("/readyz"))
        assert again.status == 503 and again_s <= ANSWERED_WITHIN_S
        print("answer times during the stall (s):",
              {"read": round(read_s, 2), "write": round(write_s, 2), "login": round(login_s, 2),
               "anonymous": round(anon_s, 2), "readyz": round(ready_s, 2),
               "readyz again": round(again_s, 2)})
        await asyncio.sleep(max(0.0, 10.0 - (time.monotonic() - stalled_at)))
    finally:
        fault.flow()

    # The store answers again: ready, writes work, and nothing acknowledged was lost.
    deadline = time.monotonic() + 10
    while (await app_client.get("/readyz")).status != 200:
        assert time.monotonic() < deadline, "not ready again after the stall"
        await asyncio.sleep(0.2)
    after = await app_client.post("/api/v1/installer/actions", json=installer_body("t-after"),
                                  headers=bearer(alice))
    assert after.status == 202, await after.text()
    assert [e["outcome"] for e in await entries_for(schema, acknowledged)] == ["executed"]
    count, broken = await app_client.server.app[AUDIT].verify()
    assert broken is None and count >= 2
    # The write refused during the stall did not happen.
    assert await app_client.server.app[STORE].require().get_task("t-stall") is None


async def test_runs_in_flight_when_a_stall_begins_are_answered_within_one_deadline(
        app_client, proxy):
    """A run makes several store calls in turn (its session check, its reads, its audit record
    and, when the store failed, the record of that failure); the stall may begin between any two.
    Each comes out of the one deadline of the request, never a fresh one of its own."""
    fault, _ = proxy
    alice = await login(app_client, "alice")
    before = await app_client.post("/api/v1/installer/actions", json=installer_body("t-before"),
                                   headers=bearer(alice))
    assert before.status == 202, await before.text()

    runs: list[asyncio.Future[tuple[ClientResponse, float]]] = []
    try:
        for n in range(16):  # one every 5 ms; the stall begins amid them
            runs.append(asyncio.ensure_future(timed(app_client.get(
                "/api/v1/tasks/t-before", headers=bearer(alice)))))
            if n == 4:
                fault.stall()
            await asyncio.sleep(0.005)
        results = await asyncio.gather(*runs)
    finally:
        fault.flow()
    elapsed = [round(s, 2) for _, s in results]
    print("answer times of runs in flight when the stall began (s):", elapsed)
    assert max(elapsed) <= ANSWERED_WITHIN_S, elapsed
    for response, _ in results:
        if response.status != 200:
            await assert_store_unavailable(response)


async def test_readyz_answers_within_its_probe_bound_during_a_stall(make_client, schema, proxy):
    """/readyz probes the store within ``store.probe_timeout_s`` (1 s by default), however
    long each store call may wait (``store.timeout_s``, 5 s here)."""
    fault, dsn = proxy
    client = await make_client({"store": {"backend": "postgres", "timeout_s": 5,
                                          "postgres": {"dsn": dsn, "schema": schema[1]}}})
    assert (await client.get("/readyz")).status == 200
    fault.stall()
    try:
        probes = [await timed(client.get("/readyz")) for _ in range(3)]
    finally:
        fault.flow()
    elapsed = [round(s, 2) for _, s in probes]
    print("/readyz answer times during the stall (s):", elapsed)
    for response, _ in probes:
        body = await assert_problem(response, 503, "not_ready")
        assert body["components"] == {"store": "degraded"}
        assert "127.0.0.1" not in await response.text()
    # The 1 s probe plus slack for a loaded machine; the failure is the 5 s store deadline.
    assert max(elapsed) <= 1 + 2.5, elapsed


async def test_reset_right_after_commit_answers_the_executed_run_once(app_client, proxy, schema):
    fault, _ = proxy
    alice = await login(app_client, "alice")
    fault.reset_after_commit(b"INSERT INTO task_events")
    response = await app_client.post("/api/v1/installer/actions",
                                     json=installer_body("t-reset"), headers=bearer(alice))
    assert fault.resets == 1
    assert response.status == 202, await response.text()
    entries = await entries_for(schema, response.headers["X-Correlation-ID"])
    assert [(e["outcome"], e["status"]) for e in entries] == [("executed", 202)]
    # The pool replaced the connection: the next request is served as usual.
    task = await app_client.get("/api/v1/tasks/t-reset", headers=bearer(alice))
    assert task.status == 200, await task.text()


async def test_outage_is_store_unavailable_not_an_authentication_or_audit_failure(
        app_client, proxy):
    fault, _ = proxy
    alice = await login(app_client, "alice")
    fault.refuse()
    fault.reset_all()
    # The session check cannot run: 503 at once, never 401 (clients would drop the token).
    await assert_store_unavailable(await app_client.get("/api/v1/tasks/x", headers=bearer(alice)))
    # An anonymous refusal whose record cannot be written: the cause is the store.
    await assert_store_unavailable(await app_client.get("/api/v1/tasks/x"))
    await assert_store_unavailable(await app_client.post(
        "/api/v1/authn/sessions", json={"subject_id": "bob", "password": "bob-dev-password"}))
    # Public routes that need no caller keep answering a client that sends its token along
    # (a probe or a dashboard must not go dark); those that act on the caller's session say
    # it is the store.
    assert (await app_client.get("/healthz", headers=bearer(alice))).status == 200
    assert (await app_client.get("/api/v1/authz/status", headers=bearer(alice))).status == 200
    await assert_store_unavailable(
        await app_client.get("/api/v1/authn/sessions/current", headers=bearer(alice)))


async def test_schema_newer_than_this_build_is_said_once_and_stays_not_ready(
        make_client, schema, caplog, monkeypatch):
    dsn, name = schema
    store = await open_store(dsn, schema=name)
    await store.close()
    conn = await asyncpg.connect(dsn, server_settings={"search_path": name})
    try:
        await conn.execute("INSERT INTO schema_migrations (version, name) "
                           "VALUES (9999, '9999_from_the_future.sql')")
    finally:
        await conn.close()
    monkeypatch.setattr(storelink, "CONNECT_RETRY_S", 0.05)
    caplog.set_level(logging.INFO, logger="controlplane.store")
    client = await make_client({"store": {"backend": "postgres",
                                          "postgres": {"dsn": dsn, "schema": name}}})
    await asyncio.sleep(0.5)  # ten retry intervals
    body = await assert_problem(await client.get("/readyz"), 503, "not_ready")
    assert body["components"] == {"store": "degraded"}
    info = await (await client.get("/api/v1/system/info")).json()
    assert "newer than this build" in info["components"]["store"]["detail"]
    lines = [r.getMessage() for r in caplog.records if r.name == "controlplane.store"]
    assert len(lines) == 1, lines
    assert "9999" in lines[0] and "newer than this build" in lines[0]


@pytest.fixture
async def one_connection(schema, proxy) -> AsyncIterator[tuple[PostgresStore, Any]]:
    """A store with a pool of one connection (the next unit always takes the same one) behind
    the fault proxy, and a function that creates a task and has that connection die right after
    the task's COMMIT."""
    fault, dsn = proxy
    store = await PostgresStore.open(dsn, schema=schema[1], max_size=1, timeout_s=DEADLINE_S)

    async def task_then_dead_connection(task_id: str) -> None:
        resets = fault.resets
        fault.reset_after_commit(b"INSERT INTO tasks")
        await store.ensure_task(task_id, "alice", 1.0)
        assert fault.resets == resets + 1

    try:
        yield store, task_then_dead_connection
    finally:
        await store.close()


async def test_a_connection_dead_in_the_pool_is_replaced_for_a_begin_and_a_first_read(
        one_connection):
    """The pool sends no reset on release, so a connection that died right after its COMMIT is
    found by the next unit that takes it: its BEGIN, or its first (reading) statement, runs
    again on a new connection, and the caller never sees the dead one."""
    store, task_then_dead_connection = one_connection
    await task_then_dead_connection("t-1")
    task = await store.get_task("t-1")  # BEGIN on the dead connection first
    assert task is not None and task.created_by == "alice"
    await task_then_dead_connection("t-2")
    await store.ping()  # a single read, no BEGIN: its SELECT on the dead connection first


async def test_a_write_that_found_its_connection_dead_is_not_sent_again(one_connection):
    """Whether a write reached the server before its connection died is unknown, so it is never
    re-sent: the caller is told the store is unavailable, and the write happened at most once."""
    store, task_then_dead_connection = one_connection
    await task_then_dead_connection("t-1")
    with pytest.raises(StoreUnavailable):
        async with store._statements() as q:  # autocommit: each statement commits alone
            assert q is not None
            await q.exec("UPDATE tasks SET progress = progress + 1 WHERE id = ?", "t-1")
    task = await store.get_task("t-1")
    assert task is not None and task.progress == 0


async def test_a_call_cancelled_in_its_begin_gives_its_connection_back(one_connection, proxy):
    """A caller cancelled while its BEGIN waits on the server (a client that went away) must not
    keep the pooled connection: with a pool of one, the next call would wait for it until its
    deadline."""
    store, _ = one_connection
    fault, _ = proxy
    await store.ensure_task("t-1", "alice", 1.0)
    fault.stall()
    call = asyncio.create_task(store.get_task("t-1"))  # a transaction: BEGIN first
    await asyncio.sleep(0.2)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    fault.flow()
    started = time.monotonic()
    task = await store.get_task("t-1")
    assert task is not None and time.monotonic() - started < DEADLINE_S
