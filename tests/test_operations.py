"""Operations: a rejected policy revision degrades authz status but never readiness; startup
failures are one structured line and exit 2; one supervisor per port; worker process titles."""

from __future__ import annotations

import shutil
from pathlib import Path

from service.appkeys import ENGINE
from tests.servers import REPO

BROKEN = "\npackage controlplane.authz\n\ndecision := {\n"


def _policies(tmp_path: Path) -> Path:
    root = tmp_path / "policies"
    shutil.copytree(REPO / "policies", root)
    return root


def _metric(text: str, name: str) -> float:
    line = next(x for x in text.splitlines() if x.startswith(name + " "))
    return float(line.rsplit(" ", 1)[1])


async def test_rejected_revision_keeps_readiness_and_degrades_authz(make_client, tmp_path):
    root = _policies(tmp_path)
    client = await make_client({"policies": {"dir": str(root), "reload_interval_s": 0}})
    engine = client.app[ENGINE]
    serving = engine.revision
    ok = 'controlplane_policy_reload_total{result="ok"}'
    rejected = 'controlplane_policy_reload_total{result="rejected"}'
    before = await (await client.get("/metrics")).text()
    assert _metric(before, ok) == 1.0 and _metric(before, rejected) == 0.0

    (root / "authz.rego").write_text(BROKEN)
    assert not engine.reload().ok

    assert (await client.get("/readyz")).status == 200
    status = await (await client.get("/api/v1/authz/status")).json()
    assert status["status"] == "degraded" and status["serving"] is True
    assert status["revision"] == serving
    assert status["error"].startswith("compile: authz.rego:4:")  # file:line:col
    assert status["reloads"] == {"ok": 1, "rejected": 1}
    info = await (await client.get("/api/v1/system/info")).json()
    assert info["status"] == "degraded"
    assert info["components"]["authz"]["status"] == "degraded"
    assert info["components"]["policies"]["status"] == "ready"
    after = await (await client.get("/metrics")).text()
    assert _metric(after, rejected) == 1.0 and _metric(after, ok) == 1.0


async def test_no_revision_at_all_is_not_ready(make_client, tmp_path):
    root = _policies(tmp_path)
    (root / "authz.rego").write_text(BROKEN)
    client = await make_client({"policies": {"dir": str(root), "reload_interval_s": 0}})
    response = await client.get("/readyz")
    assert response.status == 503
    assert (await response.json())["components"] == {"policies": "degraded"}
