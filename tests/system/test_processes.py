"""Real `cpctl serve` processes: single-use tickets across processes, and a worker killed mid-burst.

These are the tests that a single in-process app cannot give: several processes (as several
workers or replicas would be) racing for the same tickets through the whole HTTP chain, and a
SIGKILL in the middle of a burst of mutations.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
from collections import Counter
from typing import Any

import aiohttp
import pytest

from service.audit.log import AuditLog
from service.authn import totp
from service.store import open_store
from tests.auth import PASSWORDS, TOTP_SECRETS
from tests.servers import serve
from tests.store.pg import require_postgres, temp_schema

RESOURCE = {"app": "web", "version": "2.0.0"}


class Caller:
    """A logged-in, stepped-up dev identity talking to a set of servers over real HTTP."""

    def __init__(self, session: aiohttp.ClientSession, bases: list[str]):
        self.session = session
        self.bases = bases
        self.tokens: dict[str, str] = {}

    def base(self) -> str:
        return random.choice(self.bases)

    async def login(self, subject: str, step: int) -> str:
        async with self.session.post(self.base() + "/api/v1/authn/sessions", json={
                "subject_id": subject, "password": PASSWORDS[subject]}) as r:
            assert r.status == 201, await r.text()
            token = (await r.json())["access_token"]
        # One step-up per subject per store: the code of a time step is single-use.
        code = totp.code_at(TOTP_SECRETS[subject], step * 30)
        async with self.session.post(self.base() + "/api/v1/authn/step-up", json={"otp": code},
                                     headers={"Authorization": f"Bearer {token}"}) as r:
            assert r.status == 201, await r.text()
            self.tokens[subject] = (await r.json())["access_token"]
        return self.tokens[subject]

    async def call(self, method: str, path: str, subject: str, **kwargs: Any) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {self.tokens[subject]}", **kwargs.pop("headers", {})}
        async with self.session.request(method, self.base() + path, headers=headers, **kwargs) as r:
            return r.status, await r.json(content_type=None)


async def approved_tickets(caller: Caller, count: int, *, resource: Any = RESOURCE) -> list[dict]:
    tickets = []
    for _ in range(count):
        status, ticket = await caller.call("POST", "/api/v1/approvals", "alice", json={
            "subject_id": "alice", "env": "prod", "action": "installer.run.execute",
            "resource": resource})
        assert status == 201, ticket
        status, reviewed = await caller.call("POST", f"/api/v1/approvals/{ticket['id']}/reviews",
                                             "bob", json={"decision": "approve"})
        assert status == 200 and reviewed["state"] == "approved", reviewed
        tickets.append(ticket)
    return tickets


def installer(task: str, ticket: dict) -> dict[str, Any]:
    return {
        "json": {"task_id": task, "action": "installer.run.execute", "resource": RESOURCE,
                 "env": "prod"},
        "headers": {"Approval-Ticket": ticket["id"], "Approval-Nonce": ticket["nonce"]},
    }


async def race(bases: list[str], tickets_n: int, attempts: int) -> Counter[tuple[int, str]]:
    """``tickets_n`` approved tickets, ``attempts`` concurrent redemptions of each, spread over
    every server; returns (status, code) counts."""
    import time

    step = int(time.time() // 30)
    connector = aiohttp.TCPConnector(limit=64)
    async with aiohttp.ClientSession(connector=connector) as session:
        caller = Caller(session, bases)
        await caller.login("alice", step)
        await caller.login("bob", step)
        tickets = await approved_tickets(caller, tickets_n)
        jobs = [installer(f"race-{i}", t) for i, t in enumerate(tickets) for _ in range(attempts)]
        random.shuffle(jobs)
        results = await asyncio.gather(*(
            caller.call("POST", "/api/v1/installer/actions", "alice", **job) for job in jobs))
    return Counter((status, body.get("code", "")) for status, body in results)


async def test_tickets_are_single_use_across_four_processes_on_postgresql(tmp_path):
    await require_postgres()
    async with temp_schema("cp_race") as (dsn, schema):
        env = {"CONTROLPLANE_STORE__BACKEND": "postgres", "CONTROLPLANE_STORE__POSTGRES__DSN": dsn,
               "CONTROLPLANE_STORE__POSTGRES__SCHEMA": schema}
        state = tmp_path / "state"
        with contextlib.ExitStack() as stack:
            # Four app instances: separate processes sharing the database and the signing keys.
            bases = [stack.enter_context(serve(state, env=env))[0] for _ in range(4)]
            counts = await race(bases, tickets_n=50, attempts=20)
        assert counts == Counter({(202, ""): 50, (409, "ticket_consumed"): 950}), counts


async def test_tickets_are_single_use_across_two_processes_on_sqlite(tmp_path):
    state = tmp_path / "state"
    with serve(state) as (first, _), serve(state) as (second, _):
        counts = await race([first, second], tickets_n=50, attempts=20)
    assert counts == Counter({(202, ""): 50, (409, "ticket_consumed"): 950}), counts


BURST = 200


async def test_sigkill_mid_burst_loses_nothing_acknowledged(tmp_path):
    """Every 202 survives a SIGKILL with its event and audit record; no ticket is consumed
    without its event; the audit chain still verifies."""
    import time

    state = tmp_path / "state"
    acknowledged: list[dict] = []
    with serve(state) as (base, proc):
        async with aiohttp.ClientSession() as session:
            caller = Caller(session, [base])
            step = int(time.time() // 30)
            await caller.login("alice", step)
            await caller.login("bob", step)
            # Enough runs that the kill lands mid-burst: with 60, a fast host acknowledged them
            # all (group commits of up to 64) before the SIGKILL reached the server.
            tickets = await approved_tickets(caller, BURST)

            ten_acknowledged = asyncio.Event()

            async def fire(i: int, ticket: dict) -> None:
                with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
                    status, body = await caller.call("POST", "/api/v1/installer/actions", "alice",
                                                     **installer(f"kill-{i}", ticket))
                    if status == 202:
                        acknowledged.append(body)
                        if len(acknowledged) >= 10:
                            ten_acknowledged.set()

            burst = [asyncio.create_task(fire(i, t)) for i, t in enumerate(tickets)]
            await asyncio.wait_for(ten_acknowledged.wait(), timeout=60)
            os.kill(proc.pid, signal.SIGKILL)
            await asyncio.gather(*burst)
        proc.wait(timeout=10)
    assert 10 <= len(acknowledged) < BURST

    store = await open_store(f"sqlite:///{state / 'controlplane.db'}")
    try:
        for body in acknowledged:
            events = await store.list_events(body["task_id"])
            assert [(e.seq, e.data["ticket_id"]) for e in events] == [
                (body["event"]["seq"], body["event"]["ticket_id"])]
        records = [r async for r in AuditLog(store).records()]
        executed = {r.entry["ticket_id"] for r in records
                    if r.entry.get("outcome") == "executed" and r.entry.get("ticket_consumed")}
        assert {b["event"]["ticket_id"] for b in acknowledged} <= executed
        for ticket in tickets:
            stored = await store.get_ticket(ticket["id"])
            if stored.state == "consumed":
                i = tickets.index(ticket)
                events = await store.list_events(f"kill-{i}")
                assert [e.data["ticket_id"] for e in events] == [ticket["id"]]
                assert ticket["id"] in executed
            else:
                assert stored.state == "approved"
        count, broken = await AuditLog(store).verify()
        assert broken is None and count == len(records)
    finally:
        await store.close()


@pytest.fixture(autouse=True)
def _deterministic_spread() -> None:
    random.seed(7)

