"""A mutation's audit record on PostgreSQL, through the real app: staged in the run's
transaction, sealed into the chain before the answer is sent, mirrored, nothing left staged."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from service.appkeys import AUDIT
from tests.auth import bearer, login
from tests.store import pg

PROD = {"env": "prod", "action": "installer.run.execute", "resource": {"app": "web", "version": "1.2.3"}}


async def test_mutation_records_are_in_the_chain_when_answered(make_client, tmp_path: Path):
    mirror = tmp_path / "audit.jsonl"
    async with pg.temp_schema("cp_audit_staging") as (dsn, schema):
        client = await make_client({
            "store": {"backend": "postgres", "postgres": {"dsn": dsn, "schema": schema}},
            "audit": {"jsonl_path": str(mirror)},
        })
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
        chain = [r async for r in audit.records()]
        created = [r.entry["ticket_id"] for r in chain if r.entry.get("ticket_event") == "created"]
        assert sorted(created) == sorted(tickets)  # each exactly once
        assert await audit.verify() == (len(chain), None)
        assert await audit.store.audit_staged(time.time() + 3600) == (0, None)
        mirrored = [json.loads(line) for line in mirror.read_text().splitlines()]
        assert sorted(d["seq"] for d in mirrored if "purpose" not in d) == [r.seq for r in chain]
        await client.close()
