"""Domain events (issue 14, item 8): each logged once, structured, with a stable ``event`` name,
and the lines of one request sharing its correlation id."""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import sqlite3
from typing import Any

import pytest

from service import clock, storelink
from service.approvals.expiry import expire_once
from service.audit.log import AUDIT
from service.authz.engine import ENGINE
from service.config import CONFIG
from service.storelink import STORE
from tests.auth import bearer, login, step_up
from tests.conftest import json_log_lines
from tests.servers import REPO
from tests.tickets import RESOURCE, approved_ticket, installer_body, ticket_headers

SECRET = "events-Secret-Value-7"


def events(caplog: pytest.LogCaptureFixture, prefix: str = "") -> list[dict[str, Any]]:
    """The ``fields`` of every record that names an event starting with ``prefix``."""
    found = []
    for record in caplog.records:
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict) and str(fields.get("event", "")).startswith(prefix):
            found.append({**fields, "_logger": record.name, "_level": record.levelname})
    return found


def names(caplog: pytest.LogCaptureFixture, prefix: str) -> list[str]:
    return [e["event"] for e in events(caplog, prefix)]


async def test_starting_logs_the_activated_policy_revision_once(make_client, caplog):
    caplog.set_level(logging.INFO)
    client = await make_client()
    activated = [e for e in events(caplog) if e["event"] == "policy.revision_activated"]
    assert len(activated) == 1
    assert activated[0]["revision"] == client.server.app[ENGINE].revision


async def test_a_ticket_is_requested_approved_and_consumed_one_line_each(client, caplog):
    caplog.set_level(logging.INFO)
    alice = await step_up(client, await login(client, "alice"), "alice")
    ticket = await approved_ticket(client, alice)
    response = await client.post("/api/v1/installer/actions", json=installer_body(),
                                 headers=ticket_headers(alice, ticket, **{
                                     "X-Correlation-ID": "run-cid-1"}))
    assert response.status == 202, await response.text()
    assert names(caplog, "approval.") == [
        "approval.ticket_requested", "approval.ticket_approved", "approval.ticket_consumed"]
    requested, approved, consumed = events(caplog, "approval.")
    assert requested["ticket_id"] == approved["ticket_id"] == consumed["ticket_id"] == ticket["id"]
    assert requested["principal"] == "alice" and requested["ticket_action"] == "installer.run.execute"
    assert approved["principal"] == "bob" and approved["state"] == "approved"
    assert consumed["action"] == "installer.run.execute" and consumed["env"] == "prod"
    assert ticket["nonce"] not in caplog.text


async def test_a_rejected_and_a_revoked_ticket(client, caplog):
    caplog.set_level(logging.INFO)
    alice = await step_up(client, await login(client, "alice"), "alice")
    bob = await step_up(client, await login(client, "bob"), "bob")
    created = []
    for _ in range(2):
        response = await client.post("/api/v1/approvals", headers=bearer(alice), json={
            "subject_id": "alice", "env": "prod", "action": "installer.run.execute",
            "resource": RESOURCE})
        assert response.status == 201
        created.append(await response.json())
    rejected = await client.post(f"/api/v1/approvals/{created[0]['id']}/reviews",
                                 json={"decision": "reject", "reason": "no"}, headers=bearer(bob))
    assert rejected.status == 200
    revoked = await client.post(f"/api/v1/approvals/{created[1]['id']}/revoke",
                                headers=bearer(alice))
    assert revoked.status == 200
    assert names(caplog, "approval.") == [
        "approval.ticket_requested", "approval.ticket_requested", "approval.ticket_rejected",
        "approval.ticket_revoked"]


async def test_an_expired_ticket_is_logged_once(client, caplog):
    caplog.set_level(logging.INFO)
    alice = await step_up(client, await login(client, "alice"), "alice")
    response = await client.post("/api/v1/approvals", headers=bearer(alice), json={
        "subject_id": "alice", "env": "prod", "action": "installer.run.execute",
        "resource": RESOURCE})
    ticket = await response.json()
    store, audit = client.server.app[STORE].require(), client.server.app[AUDIT]
    later = clock.now() + 30 * 86400
    assert await expire_once(store, audit, later) == 1
    assert await expire_once(store, audit, later) == 0
    expired = events(caplog, "approval.ticket_expired")
    assert [e["ticket_id"] for e in expired] == [ticket["id"]]


async def test_a_rolled_back_run_logs_no_ticket_event_and_one_audit_failure(client, caplog):
    alice = await step_up(client, await login(client, "alice"), "alice")
    ticket = await approved_ticket(client, alice)
    db = client.server.app[CONFIG].store.sqlite_path
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TRIGGER no_audit BEFORE INSERT ON audit_log "
                     "BEGIN SELECT RAISE(ABORT, 'audit disk full'); END")
    caplog.set_level(logging.INFO)
    response = await client.post("/api/v1/installer/actions", json=installer_body(),
                                 headers=ticket_headers(alice, ticket))
    assert response.status == 503
    assert names(caplog, "approval.") == []  # the consumption rolled back
    failures = events(caplog, "audit.write_failed")
    assert len(failures) >= 1 and all(f["_level"] == "ERROR" for f in failures)
    assert failures[0]["action"] == "installer.run.execute"


async def test_an_unreachable_store_is_logged_once_however_often_it_is_retried(
        make_client, caplog, monkeypatch):
    monkeypatch.setattr(storelink, "CONNECT_RETRY_S", 0.02)
    caplog.set_level(logging.DEBUG, logger="controlplane.store")
    client = await make_client({"store": {"backend": "postgres", "postgres": {
        "dsn": f"postgresql://cp:{SECRET}@127.0.0.1:1/cp"}}})
    await asyncio.sleep(0.3)
    assert (await client.get("/readyz")).status == 503
    unavailable = events(caplog, "store.unavailable")
    assert len(unavailable) >= 2  # retried
    assert [e["_level"] for e in unavailable].count("ERROR") == 1
    assert SECRET not in caplog.text


async def test_a_connected_store_is_logged(make_client, caplog):
    caplog.set_level(logging.INFO, logger="controlplane.store")
    await make_client()
    assert names(caplog, "store.") == ["store.connected"]


async def test_event_lines_are_json_with_the_requests_correlation_id(client):
    with json_log_lines(logging.INFO) as stream:
        alice = await step_up(client, await login(client, "alice"), "alice")
        response = await client.post("/api/v1/approvals", json={
            "subject_id": "alice", "env": "prod", "action": "installer.run.execute",
            "resource": RESOURCE}, headers=bearer(alice, **{"X-Correlation-ID": "cid-events-1"}))
        assert response.status == 201
        for _ in range(100):  # the access line follows the response
            if '"logger": "controlplane.access"' in stream.getvalue().split("cid-events-1")[-1]:
                break
            await asyncio.sleep(0.01)
    docs = [json.loads(line) for line in stream.getvalue().splitlines()]
    mine = [d for d in docs if d.get("correlation_id") == "cid-events-1"]
    kinds = {d["logger"]: d.get("event") for d in mine}
    assert kinds.get("controlplane.approvals") == "approval.ticket_requested"
    assert kinds.get("controlplane.access") == "http.request"
    # The policy decision of that request is in the run's audit record, under the same id,
    # and on no log line of its own (the record is the durable copy; a line would repeat it).
    # (Other decisions of the request, such as the approval the ticket's action needs, are
    # no run's record: they keep their lines, with the request's id.)
    store = client.server.app[STORE].require()
    entries = [r.entry for r in await store.audit_range(0, 1000)
               if r.entry["correlation_id"] == "cid-events-1"]
    assert [e["action"] for e in entries] == ["approvals.create"]
    decision = entries[0]["decision"]
    assert decision["result"] == "allow" and decision["decision_id"]
    assert entries[0]["policy_revision"]
    lines = [d["decision"] for d in mine if d["logger"] == "controlplane.decisions"]
    assert decision["decision_id"] not in [line["decision_id"] for line in lines]
    assert all(line["correlation_id"] == "cid-events-1" for line in lines)


async def test_policy_revisions_activated_and_rejected_are_logged_once_each(
        make_client, tmp_path, caplog):
    root = tmp_path / "policies"
    shutil.copytree(REPO / "policies", root)
    client = await make_client({"policies": {"dir": str(root), "reload_interval_s": 0}})
    engine = client.server.app[ENGINE]
    first = engine.revision
    caplog.set_level(logging.INFO)
    authz = root / "authz.rego"
    authz.write_text(authz.read_text() + "\n# a comment: a new revision\n")
    assert engine.reload().ok
    assert engine.reload().ok  # the same files again: nothing new happened
    authz.write_text(authz.read_text() + "\ndecision := {\n")
    assert not engine.reload().ok
    policy = [e for e in events(caplog, "policy.")]
    assert [e["event"] for e in policy] == ["policy.revision_activated",
                                             "policy.revision_rejected"]
    assert policy[0]["revision"] == engine.revision != first
    assert policy[1]["serving_revision"] == engine.revision
