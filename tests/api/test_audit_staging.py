"""A mutation's audit record on PostgreSQL, through the real app: staged in the run's
transaction, sealed into the chain before the answer is sent, mirrored, nothing left staged."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg

from service.approvals.expiry import expire_once
from service.audit.log import AUDIT
from service.storelink import STORE
from tests.auth import bearer, login
from tests.store import pg

PROD = {"env": "prod", "action": "installer.run.execute", "resource": {"app": "web", "version": "1.2.3"}}


@contextlib.asynccontextmanager
async def _app_on_postgres(make_client: Any, mirror: Path, prefix: str) -> AsyncIterator[Any]:
    """The app on a fresh PostgreSQL schema, mirroring its audit to ``mirror``: (client, dsn,
    schema)."""
    async with pg.temp_schema(prefix) as (dsn, schema):
        client = await make_client({
            "store": {"backend": "postgres", "postgres": {"dsn": dsn, "schema": schema}},
            "audit": {"jsonl_path": str(mirror)},
        })
        try:
            yield client, dsn, schema
        finally:
            await client.close()


async def _assert_all_sealed_and_mirrored(audit: Any, mirror: Path, now: float) -> list[Any]:
    """The chain verifies, nothing is left staged, and every record is mirrored: the chain."""
    chain = [r async for r in audit.records()]
    assert await audit.verify() == (len(chain), None)
    assert await audit.store.audit_staged(now + 3600) == (0, None)
    text = await asyncio.to_thread(mirror.read_text)
    mirrored = [json.loads(line) for line in text.splitlines()]
    assert sorted(d["seq"] for d in mirrored if "purpose" not in d) == [r.seq for r in chain]
    return chain


async def test_mutation_records_are_in_the_chain_when_answered(make_client, tmp_path: Path):
    mirror = tmp_path / "audit.jsonl"
    async with _app_on_postgres(make_client, mirror, "cp_audit_staging") as (client, _, _):
        audit = client.server.app[AUDIT]
        assert audit.stages  # PostgreSQL: runs stage their records
        alice = await login(client, "alice")

        async def request(i: int) -> str:
            body = {"subject_id": "alice", **PROD, "resource": {"app": "web", "version": f"1.{i}"}}
            response = await client.post("/api/v1/approvals", json=body, headers=bearer(alice))
            assert response.status == 201, await response.text()
            ticket_id = str((await response.json())["id"])
            # Answered: its record is sealed into the chain already, and mirrored.
            chain = [r async for r in audit.records()]
            assert any(r.entry.get("ticket_id") == ticket_id for r in chain)
            return ticket_id

        tickets = await asyncio.gather(*(request(i) for i in range(12)))
        chain = await _assert_all_sealed_and_mirrored(audit, mirror, time.time())
        created = [r.entry["ticket_id"] for r in chain if r.entry.get("ticket_event") == "created"]
        assert sorted(created) == sorted(tickets)  # each exactly once


async def test_ticket_expiry_stages_its_records_and_seals_them(make_client, tmp_path: Path):
    """The expiry sweep on PostgreSQL stages its records like a run (its transaction never holds
    the chain's head); once it returns they are sealed into the chain, mirrored, none staged."""
    mirror = tmp_path / "audit.jsonl"
    async with _app_on_postgres(make_client, mirror, "cp_audit_expiry") as (client, dsn, schema):
        audit = client.server.app[AUDIT]
        store = client.server.app[STORE].require()
        alice = await login(client, "alice")
        tickets = []
        for i in range(3):
            body = {"subject_id": "alice", **PROD, "resource": {"app": "web", "version": f"2.{i}"}}
            response = await client.post("/api/v1/approvals", json=body, headers=bearer(alice))
            assert response.status == 201, await response.text()
            tickets.append(str((await response.json())["id"]))
        later = time.time() + 30 * 86400
        # Another session holds the chain's head row: the sweep still commits the expiries
        # (its transaction only stages records); sealing them waits for the row.
        holder = await asyncpg.connect(dsn, server_settings={"search_path": schema})
        held = holder.transaction()
        await held.start()
        await holder.execute("SELECT seq FROM audit_head WHERE id = 1 FOR UPDATE")
        sweep = asyncio.create_task(expire_once(store, audit, later))
        try:
            deadline = time.monotonic() + 10
            while [(await store.get_ticket(t)).state for t in tickets] != ["expired"] * 3:
                assert time.monotonic() < deadline, "the expiries waited for the chain's head"
                await asyncio.sleep(0.05)
        finally:
            await held.rollback()
            await holder.close()
        assert await sweep == 3
        chain = await _assert_all_sealed_and_mirrored(audit, mirror, later)
        expired = [r.entry["ticket_id"] for r in chain if r.entry.get("ticket_event") == "expired"]
        assert sorted(expired) == sorted(tickets)
        assert await expire_once(store, audit, later) == 0  # each ticket expires once
