"""The unsigned tail of the audit chain, rewritten in the database while the service runs.

Records written after the newest signed checkpoint are vouched for by no signature yet. Someone
with write access to the database (and not the audit key) edits one and recomputes the chain
after it. The service must not chain its next record onto that forged head, nor sign a
checkpoint over it (which would launder the rewrite): the run fails closed (503
``audit_unavailable``), the worker raises its alarm (metric, log event, readiness), and
``cpctl audit verify --anchor <mirror>`` names the record the mirror still holds as it was.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from service import clock
from service.audit.log import AUDIT
from service.audit.record import seal
from service.config import CONFIG
from tests.auth import bearer, login
from tests.problems import assert_problem

REPO = Path(__file__).resolve().parent.parent.parent


def rewrite_tail(db: Path, at: int) -> None:
    """Edit record ``at`` (deny what was allowed) and recompute every hash from it to the head,
    as the chain lets anyone do, with a plain connection of one's own."""
    with sqlite3.connect(db, timeout=30) as conn:
        rows = conn.execute("SELECT seq, prev_hash, entry FROM audit_log WHERE seq >= ? "
                            "ORDER BY seq", (at,)).fetchall()
        prev = rows[0][1]
        for seq, _, text in rows:
            entry = json.loads(text)
            if seq == at:
                entry = {**entry, "outcome": "denied", "status": 403}
            digest = seal(seq, prev, entry)
            conn.execute("UPDATE audit_log SET prev_hash = ?, hash = ?, entry = ? WHERE seq = ?",
                         (prev, digest, json.dumps(entry), seq))
            prev = digest
        conn.execute("UPDATE audit_head SET hash = ? WHERE id = 1", (prev,))


def cpctl_verify(state: Path, *argv: str) -> tuple[int, dict[str, Any]]:
    """``cpctl audit verify --json`` as an operator runs it, against the service's state dir."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTROLPLANE_")}
    env["CONTROLPLANE_STATE_DIR"] = str(state)
    done = subprocess.run([sys.executable, "-m", "service", "audit", "verify", "--json", *argv],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    return done.returncode, json.loads(done.stdout)


async def test_a_rewritten_unsigned_tail_is_refused_and_never_signed(
    make_client: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    mirror = tmp_path / "audit.jsonl"
    client = await make_client({"audit": {"jsonl_path": str(mirror), "checkpoint_records": 1000,
                                          "checkpoint_interval_s": 3600}})
    app = client.server.app
    audit, state = app[AUDIT], app[CONFIG].state_dir
    alice = await login(client, "alice")
    for _ in range(3):
        assert (await client.get("/api/v1/approvals", headers=bearer(alice))).status == 200
    assert audit.observer is not None
    signed = await audit.observer.checkpoint(clock.now())  # the newest signed checkpoint
    assert signed is not None
    for _ in range(3):  # the unsigned tail
        assert (await client.get("/api/v1/approvals", headers=bearer(alice))).status == 200
    head, _ = await audit.store.audit_head()
    assert head > signed.seq + 1

    await asyncio.to_thread(rewrite_tail, app[CONFIG].store.sqlite_path, signed.seq + 1)
    with caplog.at_level(logging.ERROR, logger="controlplane.audit"):
        response = await client.get("/api/v1/approvals", headers=bearer(alice))
        await assert_problem(response, 503, "audit_unavailable")
        # Refused, not laundered: nothing was chained onto the forged head, nothing signed.
        assert (await audit.store.audit_head())[0] == head
        assert await audit.observer.checkpoint(clock.now()) is None
        response = await client.post("/api/v1/approvals", json={
            "subject_id": "alice", "env": "prod", "action": "installer.run.execute",
            "resource": {"app": "web", "version": "9.9.9"}}, headers=bearer(alice))
        await assert_problem(response, 503, "audit_unavailable")
    alarms = [r for r in caplog.records
              if getattr(r, "fields", {}).get("event") == "audit.chain_tampered"]
    assert len(alarms) == 1, [r.getMessage() for r in caplog.records]
    assert alarms[0].fields["seq"] == head  # type: ignore[attr-defined]

    response = await client.get("/readyz")
    body = await assert_problem(response, 503, "not_ready")
    assert body["components"] == {"audit": "degraded"}
    info = await (await client.get("/api/v1/system/info")).json()
    assert info["components"]["audit"]["status"] == "degraded"
    metrics = await (await client.get("/metrics")).text()
    assert "controlplane_audit_chain_ok 0.0" in metrics
    assert "controlplane_audit_integrity_failures_total 1.0" in metrics
    await client.close()  # the last checkpoint on shutdown must not sign the forged head either
    latest = await _latest_checkpoint(app[CONFIG].store.sqlite_path)
    assert latest == signed.seq

    code, result = cpctl_verify(state)
    assert code == 3 and result["verified_head"]["seq"] == signed.seq  # unsigned: unverifiable
    code, result = cpctl_verify(state, "--anchor", str(mirror))
    assert code == 1, result
    assert result["break"] == {"seq": signed.seq + 1, "reason": "mirror_mismatch"}


async def _latest_checkpoint(db: Path) -> int:
    def read() -> int:
        with sqlite3.connect(db, timeout=30) as conn:
            return int(conn.execute("SELECT COALESCE(MAX(seq), 0) FROM audit_checkpoints")
                       .fetchone()[0])
    return await asyncio.to_thread(read)
