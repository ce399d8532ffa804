"""Shadow evaluation in the running service (policies.candidate_dir): the divergence metric
counts exactly the diverging requests, authz/status shows the candidate, and a broken candidate
never affects serving. (In tests/conftest.py's IN_PROCESS_VETTING: the app vets revisions in-process,
as the other app tests do; tests/authz/test_engine.py covers child-process vetting.)"""

from __future__ import annotations

import asyncio
import io
import json
import shutil

from service.authz.decisionlog import DECISION_LOG, read_records
from service.authz.engine import ENGINE
from service.authz.shadow import SHADOW
from service.cli.policy import run
from tests.auth import bearer, login
from tests.authz.conftest import REPO, candidate_without_carols_role
from tests.metrics import shadow_divergence


async def test_shadow_counts_exactly_the_diverging_requests(make_client, tmp_path):
    candidate = candidate_without_carols_role(tmp_path / "candidate")
    log_path = tmp_path / "decisions.jsonl"
    client = await make_client({"policies": {"candidate_dir": str(candidate)},
                                "decision_log": {"path": str(log_path)}})
    app = client.server.app
    shadow = app[SHADOW]
    assert shadow.wait_idle(30)
    carol, alice = await login(client, "carol"), await login(client, "alice")
    for _ in range(3):
        for token in (carol, alice):
            response = await client.get("/api/v1/storage/objects", headers=bearer(token))
            assert response.status == 200  # the live decision serves, whatever the candidate
    assert shadow.wait_idle(30)
    assert await shadow_divergence(client, "allow", "deny") == 3.0  # carol's three reads, not alice's
    status = await (await client.get("/api/v1/authz/status")).json()
    assert status["shadow"]["revision"] != app[ENGINE].revision
    assert status["shadow"]["state"] == "ready"
    assert status["shadow"]["evaluated"] == 6 and status["shadow"]["diverged"] == 3
    assert status["shadow"]["divergences"] == {"allow->deny": 3}
    assert status["decision_log"]["dropped"] == 0

    # The chain's decisions reached the decision log with their inputs, and replaying that log
    # against the same candidate lists exactly carol's three reads.
    sink = app[DECISION_LOG]
    for _ in range(200):
        if sink.written >= 6:
            break
        await asyncio.sleep(0.02)
    records = [r for _, r in read_records(log_path)]
    assert [r["input"]["principal"]["subject_id"] for r in records] == ["carol", "alice"] * 3
    assert all(r["correlation_id"] and r["result"]["decision"] == "allow" for r in records)
    out = io.StringIO()
    assert run(["replay", "--log", str(log_path), "--policies", str(candidate),
                "--format", "json"], out, io.StringIO()) == 1
    report = json.loads(out.getvalue())
    assert [c["subject"] for c in report["changes"]] == ["carol"] * 3
    assert {c["ref"] for c in report["changes"]} == {
        r["decision_id"] for r in records if r["input"]["principal"]["subject_id"] == "carol"}


async def test_a_broken_candidate_never_affects_serving(make_client, tmp_path):
    candidate = tmp_path / "candidate"
    shutil.copytree(REPO / "policies", candidate, ignore=shutil.ignore_patterns("compose"))
    (candidate / "authz.rego").write_text("package controlplane.authz\ndecision := {\n")
    client = await make_client({"policies": {"candidate_dir": str(candidate)}})
    shadow = client.server.app[SHADOW]
    assert shadow.wait_idle(30)
    carol = await login(client, "carol")
    assert (await client.get("/api/v1/storage/objects", headers=bearer(carol))).status == 200
    assert shadow.wait_idle(30)
    status = await (await client.get("/api/v1/authz/status")).json()
    assert status["status"] == "ready" and status["shadow"]["state"] == "rejected"
    assert "authz.rego" in status["shadow"]["error"]
    assert status["shadow"]["evaluated"] == 0


async def test_only_requests_decisions_are_logged_not_the_workflows_what_ifs(make_client, tmp_path):
    """A ticket request asks the policy what the ticketed action would need (a decision on
    installer.run.execute that no request made): the decision log records the request's own
    decision, approvals.create, and nothing else."""
    log_path = tmp_path / "decisions.jsonl"
    client = await make_client({"decision_log": {"path": str(log_path)}})
    alice = await login(client, "alice")
    created = await client.post("/api/v1/approvals", headers=bearer(alice), json={
        "subject_id": "alice", "env": "prod", "action": "installer.run.execute",
        "resource": {"app": "web"}})
    assert created.status == 201
    sink = client.server.app[DECISION_LOG]
    for _ in range(200):  # every decision of the request was queued before it answered
        if sink.written >= 1 and sink.status()["queued"] == 0:
            break
        await asyncio.sleep(0.02)
    records = [r for _, r in read_records(log_path)]
    assert [r["input"]["action"] for r in records] == ["approvals.create"]
    assert records[0]["correlation_id"] == created.headers["X-Correlation-ID"]
