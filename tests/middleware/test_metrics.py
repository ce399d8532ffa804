"""/metrics of the real app: every metric an operator alerts on, with fixed label sets only."""

from __future__ import annotations

import asyncio
import re
import shutil

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from service.audit.log import AUDIT
from service.authz.engine import ENGINE
from service.authz.reload import POLICY_FOLLOWER
from service.middleware import metrics as metrics_module
from service.middleware.metrics import (
    APPROVAL_OUTCOMES,
    DECISION_RESULTS,
    EXPORTED,
    LOGIN_FAILURE_REASONS,
    METRICS,
    NOTIFICATION_OUTCOMES,
    RELOAD_RESULTS,
    STORE_GAUGES_TTL_S,
)
from tests.auth import PASSWORDS, bearer, login, step_up
from tests.metrics import scrape, value
from tests.servers import REPO
from tests.tickets import RESOURCE, installer_body, ticket_headers

SUBJECTS = ("alice", "bob", "carol", "ci-bot", "agent-7")


async def test_metrics_exposes_every_operator_metric(client):
    app = client.server.app
    alice = await step_up(client, await login(client, "alice"), "alice")
    # a decision: require_approval for prod -> 403 approval_required
    assert (await client.post("/api/v1/installer/actions", json=installer_body(),
                              headers=bearer(alice))).status == 403
    # a ticket: created, approved by bob, consumed by alice's run
    created = await client.post("/api/v1/approvals", headers=bearer(alice), json={
        "subject_id": "alice", "env": "prod", "action": "installer.run.execute",
        "resource": RESOURCE, "reason": "release"})
    assert created.status == 201
    ticket = await created.json()
    bob = await step_up(client, await login(client, "bob"), "bob")
    assert (await client.post(f"/api/v1/approvals/{ticket['id']}/reviews",
                              json={"decision": "approve"}, headers=bearer(bob))).status == 200
    run = await client.post("/api/v1/installer/actions", json=installer_body(),
                            headers=ticket_headers(alice, ticket))
    assert run.status in (200, 201, 202), await run.text()
    # a second, still pending ticket
    assert (await client.post("/api/v1/approvals", headers=bearer(alice), json={
        "subject_id": "alice", "env": "prod", "action": "installer.run.execute",
        "resource": RESOURCE})).status == 201
    # a failed login
    assert (await client.post("/api/v1/authn/sessions", json={
        "subject_id": "carol", "password": PASSWORDS["carol"] + "x"})).status == 401

    families = await scrape(client)
    for name in EXPORTED:
        family = name.removesuffix("_total")
        assert family in families, name

    assert value(families, "controlplane_policy_revision_info",
                  revision=app[ENGINE].revision) == 1.0
    assert value(families, "controlplane_policy_reload", "controlplane_policy_reload_total",
                  result="ok") == 1.0
    assert value(families, "controlplane_policy_last_reload_success_timestamp_seconds") > 0
    assert value(families, "controlplane_decisions", "controlplane_decisions_total",
                  result="require_approval") >= 2
    assert value(families, "controlplane_decision_duration_seconds",
                  "controlplane_decision_duration_seconds_count") >= 2
    assert value(families, "controlplane_approvals_pending") == 1.0
    assert value(families, "controlplane_approval_oldest_pending_age_seconds") >= 0
    for outcome in ("created", "approved", "consumed"):
        assert value(families, "controlplane_approvals", "controlplane_approvals_total",
                      outcome=outcome) >= 1, outcome
    assert value(families, "controlplane_approvals", "controlplane_approvals_total",
                  outcome="created") == 2
    assert value(families, "controlplane_audit_head_seq") >= 4
    assert value(families, "controlplane_audit_append_failures",
                  "controlplane_audit_append_failures_total") == 0
    assert value(families, "controlplane_login_failures", "controlplane_login_failures_total",
                  reason="bad_password") == 1.0
    assert value(families, "controlplane_store_up") == 1.0

    # Fixed label sets, and never a subject id, token or resource value.
    allowed = {
        "controlplane_policy_reload": {"result": set(RELOAD_RESULTS)},
        "controlplane_decisions": {"result": set(DECISION_RESULTS), "cached": {"true", "false"}},
        "controlplane_approvals": {"outcome": set(APPROVAL_OUTCOMES)},
        "controlplane_login_failures": {"reason": set(LOGIN_FAILURE_REASONS)},
        "controlplane_notification_events": {"outcome": set(NOTIFICATION_OUTCOMES)},
    }
    for family, samples in families.items():
        for _, labels, _ in samples:
            for key, label_value in labels.items():
                if family in allowed and key in allowed[family]:
                    assert label_value in allowed[family][key], (family, key, label_value)
                where = (family, key, label_value)
                assert label_value not in SUBJECTS and label_value != ticket["id"], where
                assert not re.search(r"web|1\.2\.3|Bearer|eyJ", label_value), where


async def test_audit_append_failures_are_counted(client):
    client.server.app[AUDIT].append_failed()  # what recording does when a record is not written
    families = await scrape(client)
    assert value(families, "controlplane_audit_append_failures",
                  "controlplane_audit_append_failures_total") == 1.0


async def test_store_down_reports_zero(make_client):
    client = await make_client({"store": {"backend": "none"}})
    families = await scrape(client)
    assert value(families, "controlplane_store_up") == 0.0
    assert "controlplane_approvals_pending" in families  # declared, no sample


async def test_login_failure_reasons_are_a_fixed_set(client):
    metrics = client.server.app[METRICS]
    metrics.login_failed("token_replayed")
    metrics.login_failed("token_expired")
    metrics.login_failed("alice")  # an unexpected value never becomes a label
    families = await scrape(client)
    assert value(families, "controlplane_login_failures", "controlplane_login_failures_total",
                  reason="assertion_replayed") == 1.0
    assert value(families, "controlplane_login_failures", "controlplane_login_failures_total",
                  reason="invalid_assertion") == 1.0
    assert value(families, "controlplane_login_failures", "controlplane_login_failures_total",
                  reason="other") == 1.0


async def test_scrapes_share_one_store_reading_a_second(client):
    """/metrics is public: its store reads (pending approvals, audit head) are made at most once
    per STORE_GAUGES_TTL_S per process, whatever the number of scrapes, and are fresh after it."""
    reads = ("controlplane_store_transactions", "controlplane_store_transactions_total")
    first = await scrape(client)
    before = value(first, *reads, kind="read")
    head = value(first, "controlplane_audit_head_seq")
    token = await login(client, "alice")
    read = await client.get("/api/v1/databases", headers=bearer(token))  # audited: the head moves
    assert read.status == 200
    scrapes = await asyncio.gather(*(scrape(client) for _ in range(20)))
    # 20 uncached scrapes would be 40+ reads. The window also holds the login's and the read's
    # own reads and the process's background checks (the store link's ping every second), a
    # handful on a loaded machine: far below one reading per scrape.
    assert max(value(f, *reads, kind="read") for f in scrapes) - before < 10
    assert {value(f, "controlplane_audit_head_seq") for f in scrapes} == {head}  # one reading
    await asyncio.sleep(STORE_GAUGES_TTL_S + 0.1)
    assert value(await scrape(client), "controlplane_audit_head_seq") > head


async def test_the_load_gauge_stays_0_while_the_policy_is_rejected(make_client, tmp_path):
    """Issue 30 (4): controlplane_policy_load_ok is a state: 0 from the rejection of the
    directory's policy until a good one loads, however many polls see the same bad files (the
    rejected counter moves once)."""
    policies = tmp_path / "policies"
    shutil.copytree(REPO / "policies", policies)
    client = await make_client({"policies": {"dir": str(policies), "reload_interval_s": 0}})
    engine = client.server.app[ENGINE]

    async def load_ok() -> float:
        return value(await scrape(client), "controlplane_policy_load_ok", source="dir")

    assert await load_ok() == 1.0
    good = (policies / "authz.rego").read_text()
    (policies / "authz.rego").write_text(good + "\nbroken := \n")
    assert not (await asyncio.to_thread(engine.reload)).ok
    for _ in range(3):  # the same rejected files, seen again
        await asyncio.to_thread(engine.reload)
        assert await load_ok() == 0.0
    rejected = value(await scrape(client), "controlplane_policy_reload",
                     "controlplane_policy_reload_total", result="rejected")
    assert rejected >= 1
    (policies / "authz.rego").write_text(good + "\n# fixed\n")
    assert (await asyncio.to_thread(engine.reload)).ok
    assert await load_ok() == 1.0


async def test_the_store_follower_gauges_are_read_as_the_status_reads_them(make_client, tmp_path):
    """With ``policies.source: store``, a scrape reads the follower's state when it is made, as
    the status does: not the value the last sync's listeners left, which lags a revision that
    installed on a thread (a status saying ``ready`` and a scrape just after it saying the
    policy is not loaded, seen under load)."""
    public, key = tmp_path / "signing.pub.pem", tmp_path / "activation.pem"
    public.write_bytes(Ed25519PrivateKey.generate().public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    key.write_bytes(Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    client = await make_client({"policies": {"source": "store", "store": {
        "trusted_keys": [str(public)], "activation_key": str(key)}}})
    app = client.server.app
    follower = app[POLICY_FOLLOWER]
    assert follower is not None and follower.load_ok  # nothing activated: the directory serves
    # What a listener left, behind the state it describes.
    app[METRICS].load_state("store", False)
    app[METRICS].converged("sha256:gone", False)
    families = await scrape(client)
    assert value(families, "controlplane_policy_load_ok", source="store") == 1.0
    assert value(families, "controlplane_policy_store_converged") == 1.0


async def test_a_request_writes_no_instrument_until_the_worker_flushes_its_tally(
        make_client, monkeypatch):
    """Per-request events (the request counter, its latency, decisions, store transactions) are
    added up in the worker and written to the instruments once per flush, not once each per
    request; a scrape flushes first, so it counts every request already answered."""
    monkeypatch.setattr(metrics_module, "FLUSH_INTERVAL_S", 3600.0)  # only the scrape flushes
    client = await make_client()
    carol = await login(client, "carol")
    metrics = client.server.app[METRICS]
    metrics.flush()
    child = metrics.requests.labels("GET", "/api/v1/databases", "200")
    before = child._value.get()
    route = {"method": "GET", "route": "/api/v1/databases"}
    latency = "controlplane_http_request_duration_seconds"
    decisions = "controlplane_decision_duration_seconds"
    was = await scrape(client)
    for _ in range(5):
        response = await client.get("/api/v1/databases", headers=bearer(carol))
        assert response.status == 200
    assert child._value.get() == before  # tallied, not yet written
    families = await scrape(client)
    assert value(families, "controlplane_http_requests", "controlplane_http_requests_total",
                 method="GET", route="/api/v1/databases", status="200") == before + 5
    assert child._value.get() == before + 5
    # Each request's latency, and each decision with its latency, written with it: the count,
    # a sum that grew, and every observation in the +Inf bucket and in no fewer finite ones.
    for family, labels in ((latency, route), (decisions, {})):
        count = value(families, family, family + "_count", **labels)
        assert count - value(was, family, family + "_count", **labels) == 5
        assert value(families, family, family + "_sum", **labels) > value(
            was, family, family + "_sum", **labels)
        assert value(families, family, family + "_bucket", le="+Inf", **labels) == count
    assert value(families, "controlplane_decisions", "controlplane_decisions_total",
                 result="allow") - value(was, "controlplane_decisions",
                                         "controlplane_decisions_total", result="allow") == 5
