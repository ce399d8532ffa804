"""``GET /api/v1/audit/checkpoints`` against the real app: the checkpoints the service signs as it
records, paged like the records, for ``audit.read`` only; a checkpoint that cannot be written
never fails the request whose record is committed."""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from service.audit.checkpoint import from_doc, signature_ok
from service.audit.keys import AuditKeys
from service.audit.log import AUDIT
from service.config import CONFIG
from tests.auth import bearer, bound_policies, login
from tests.problems import assert_problem

REPO = Path(__file__).resolve().parent.parent.parent


def admin_policies(tmp_path: Path) -> str:
    """The shipped policies with carol (a viewer) made an admin: only admins read audit."""
    return bound_policies(tmp_path, {"carol": ["admin"]})


def sql(db: Path, statement: str) -> None:
    with sqlite3.connect(db, timeout=30) as conn:
        conn.execute(statement)


async def checkpoints(client: Any, token: str, query: str = "") -> dict[str, Any]:
    response = await client.get(f"/api/v1/audit/checkpoints{query}", headers=bearer(token))
    assert response.status == 200, await response.text()
    body: dict[str, Any] = await response.json()
    return body


async def until_checkpointed(client: Any, seq: int) -> None:
    store = client.server.app[AUDIT].store
    for _ in range(1000):  # written in the background, after the commit (20 s at most)
        latest = await store.latest_audit_checkpoint()
        if latest is not None and latest.seq >= seq:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"no checkpoint at or after {seq}")


async def test_checkpoints_are_signed_paged_and_for_admins_only(make_client, tmp_path):
    client = await make_client({"policies": {"dir": admin_policies(tmp_path)},
                                "audit": {"checkpoint_records": 1}})
    carol = await login(client, "carol")
    for _ in range(4):
        assert (await client.get("/api/v1/audit/records?limit=1", headers=bearer(carol))).status == 200
    head, _ = await client.server.app[AUDIT].store.audit_head()
    await until_checkpointed(client, head)
    page = await checkpoints(client, carol)
    items = page["items"]
    assert items and page["next_after_seq"] is None
    seqs = [item["seq"] for item in items]
    assert seqs == sorted(set(seqs)) and seqs[-1] >= head
    keys = AuditKeys.load(client.server.app[CONFIG].audit.keys_dir).public_keys()
    records = {r.seq: r.hash async for r in client.server.app[AUDIT].records()}
    for item in items:
        checkpoint = from_doc(item)  # an item is an anchor as it stands
        assert signature_ok(checkpoint, keys[checkpoint.kid])
        assert records[checkpoint.seq] == checkpoint.head_hash
    first = await checkpoints(client, carol, "?limit=1")
    assert first["items"] == items[:1] and first["next_after_seq"] == seqs[0]
    rest = await checkpoints(client, carol, f"?after_seq={seqs[0]}")
    # (reading is recorded, and checkpointed, too: later pages only grow)
    assert rest["items"][:len(items) - 1] == items[1:]

    alice = await login(client, "alice")
    response = await client.get("/api/v1/audit/checkpoints", headers=bearer(alice))
    await assert_problem(response, 403, "denied")
    response = await client.get("/api/v1/audit/checkpoints")
    await assert_problem(response, 401, "unauthenticated")
    response = await client.get("/api/v1/audit/checkpoints?limit=0", headers=bearer(carol))
    await assert_problem(response, 422, "invalid_query")


async def test_a_failed_checkpoint_write_never_fails_the_request(
    make_client, tmp_path, caplog: pytest.LogCaptureFixture
):
    sink = tmp_path / "audit.jsonl"
    client = await make_client({"audit": {"checkpoint_records": 1, "jsonl_path": str(sink)}})
    db = client.server.app[CONFIG].store.sqlite_path
    await asyncio.to_thread(sql, db, "CREATE TRIGGER no_checkpoints BEFORE INSERT ON "
                            "audit_checkpoints BEGIN SELECT RAISE(ABORT, 'checkpoint disk full'); END")
    alice = await login(client, "alice")
    with caplog.at_level(logging.WARNING, logger="controlplane.audit"):
        for _ in range(3):
            response = await client.get("/api/v1/approvals", headers=bearer(alice))
            assert response.status == 200
        for _ in range(1000):
            if any("audit checkpoint not written" in r.getMessage() for r in caplog.records):
                break
            await asyncio.sleep(0.02)
    assert any("audit checkpoint not written" in r.getMessage() for r in caplog.records)
    assert await client.server.app[AUDIT].store.latest_audit_checkpoint() is None
    # The records were committed and mirrored all the same; once the store takes checkpoints
    # again, the next one covers them.
    await asyncio.to_thread(sql, db, "DROP TRIGGER no_checkpoints")  # the loop keeps serving
    assert (await client.get("/api/v1/approvals", headers=bearer(alice))).status == 200
    head, _ = await client.server.app[AUDIT].store.audit_head()
    await until_checkpointed(client, head)
    stored = [c.seq async for c in client.server.app[AUDIT].checkpoints()]
    for _ in range(250):  # the checkpoint is mirrored after it is stored
        lines = [json.loads(line) for line in sink.read_text().splitlines()]
        if [line["seq"] for line in lines if "sig" in line] == stored:
            break
        await asyncio.sleep(0.02)
    assert [line["seq"] for line in lines if "hash" in line] == list(range(1, head + 1))
    assert [line["seq"] for line in lines if "sig" in line] == stored and stored[-1] == head
