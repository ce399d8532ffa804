"""GET /api/v1/authz/status and hot reload through the running app."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

from tests.auth import bearer, login

REPO = Path(__file__).resolve().parents[2]


async def wait_for(predicate, timeout: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.1)


async def test_status_is_ready_and_leaks_no_policy(client):
    carol = await login(client, "carol")
    await client.get("/api/v1/databases", headers=bearer(carol))
    status = await (await client.get("/api/v1/authz/status")).json()
    assert status["status"] == "ready"
    assert status["revision"].startswith("sha256:") and status["module_count"] >= 1
    text = json.dumps(status)
    for secret in ("carol", "bindings", "package controlplane", "operator"):
        assert secret not in text


async def test_broken_revision_is_rejected_and_the_old_one_keeps_serving(make_client, tmp_path):
    policies = tmp_path / "policies"
    shutil.copytree(REPO / "policies", policies, ignore=shutil.ignore_patterns("compose"))
    shutil.copytree(REPO / "policies" / "compose", policies / "compose")
    client = await make_client({"policies": {"dir": str(policies), "reload_interval_s": 0.2}})
    before = (await (await client.get("/api/v1/authz/status")).json())["revision"]

    (policies / "broken.rego").write_text("package controlplane.broken\n\nx := {\n")

    async def degraded() -> bool:
        status = await (await client.get("/api/v1/authz/status")).json()
        return status["status"] == "degraded"

    await wait_for(degraded)
    status = await (await client.get("/api/v1/authz/status")).json()
    assert status["revision"] == before
    assert "compile" in json.dumps(status["last_reload"])
    carol = await login(client, "carol")
    assert (await client.get("/api/v1/databases", headers=bearer(carol))).status == 200

    (policies / "broken.rego").unlink()

    async def ready() -> bool:
        status = await (await client.get("/api/v1/authz/status")).json()
        return status["status"] == "ready"

    await wait_for(ready)
