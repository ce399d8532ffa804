"""The execution chain through the real app, real SQLite store and the shipped policies."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest
import yaml

from service import clock
from service.approvals.binding import resource_hash
from service.approvals.command import command_hash
from service.approvals.expiry import expire_once
from service.audit.log import AUDIT
from service.authn.sessions import AUTHENTICATOR
from service.authz.engine import ENGINE
from service.config import CONFIG
from service.store.base import ThrottleRule
from service.storelink import STORE
from tests.auth import bearer, bound_policies, login, step_up
from tests.problems import assert_problem
from tests.tickets import RESOURCE, approved_ticket, audit_entries, installer_body, ticket_headers

REPO = Path(__file__).resolve().parent.parent


async def test_readme_story_end_to_end(client):
    """alice -> approval_required -> ticket -> bob approves -> alice executes -> replay 409."""
    alice = await step_up(client, await login(client, "alice"), "alice")
    first = await client.post("/api/v1/installer/actions", json=installer_body(),
                              headers=bearer(alice))
    required = await assert_problem(first, 403, "approval_required")
    bindings = required["bindings"]
    assert bindings["subject_id"] == "alice" and bindings["env"] == "prod"
    assert bindings["action"] == "installer.run.execute"
    assert bindings["resource_hash"] == resource_hash(RESOURCE)

    created = await client.post("/api/v1/approvals", headers=bearer(alice), json={
        "subject_id": "alice", "env": "prod", "action": "installer.run.execute",
        "resource": bindings["resource"], "resource_hash": bindings["resource_hash"]})
    assert created.status == 201
    ticket = await created.json()
    assert ticket["state"] == "pending" and ticket["reviews"] == []
    assert ticket["resource_hash"] == resource_hash(RESOURCE)
    assert len(ticket["nonce"]) >= 22  # >= 128 bits, URL-safe base64
    for key in ("id", "subject_id", "env", "resource", "action", "command_hash", "nonce",
                "requested_by", "created_at", "expires_at", "quorum", "reviews"):
        assert key in ticket

    # The nonce is shown once: not on read.
    read = await (await client.get(f"/api/v1/approvals/{ticket['id']}", headers=bearer(alice))).json()
    assert "nonce" not in read

    bob = await step_up(client, await login(client, "bob"), "bob")
    review = await client.post(f"/api/v1/approvals/{ticket['id']}/reviews",
                               json={"decision": "approve", "reason": "change approved"},
                               headers=bearer(bob))
    assert review.status == 200
    approved = await review.json()
    assert approved["state"] == "approved" and approved["expires_at"]

    executed = await client.post("/api/v1/installer/actions", json=installer_body(),
                                 headers=ticket_headers(alice, ticket))
    assert executed.status == 202, await executed.text()
    event = (await executed.json())["event"]
    assert event["ticket_id"] == ticket["id"] and event["seq"] == 1
    assert event["kind"] == "installer.run.requested" and event["actor"] == "alice"
    assert event["correlation_id"] == executed.headers["X-Correlation-ID"]

    replay = await client.post("/api/v1/installer/actions", json=installer_body(),
                               headers=ticket_headers(alice, ticket))
    await assert_problem(replay, 409, "ticket_consumed")

    # The audit chain verifies and holds each step, in order.
    count, broken = await client.server.app[AUDIT].verify()
    assert broken is None and count >= 6
    steps = [(e["action"], e["outcome"]) for e in await audit_entries(client)]
    assert steps == [
        ("installer.run.execute", "approval_required"),
        ("approvals.create", "executed"),
        ("approvals.read", "executed"),
        ("approvals.review", "executed"),
        ("installer.run.execute", "executed"),
        ("installer.run.execute", "rejected"),
    ]
    consumed = (await audit_entries(client))[4]
    assert consumed["ticket_id"] == ticket["id"] and consumed["ticket_consumed"] is True
    assert consumed["principal"]["subject_id"] == "alice"
    for entry in await audit_entries(client):
        assert "nonce" not in entry and "token" not in str(entry).lower()


async def test_prod_mutation_without_step_up_is_401_rfc9470_and_executes_nothing(client):
    alice = await login(client, "alice")
    response = await client.post("/api/v1/installer/actions", json=installer_body(),
                                 headers=bearer(alice))
    await assert_problem(response, 401, "step_up_required")
    challenge = response.headers["WWW-Authenticate"]
    assert 'error="insufficient_user_authentication"' in challenge and "max_age=" in challenge
    assert await client.server.app[STORE].require().get_task("task-1") is None


async def test_dev_mutation_follows_policy_without_ticket(client):
    alice = await login(client, "alice")
    response = await client.post("/api/v1/installer/actions", json=installer_body("dev"),
                                 headers=bearer(alice))
    assert response.status == 202
    assert response.headers["Content-Type"] == "application/json; charset=utf-8"
    assert (await response.json())["event"]["ticket_id"] is None


async def test_policy_deny_is_403_with_reason_codes(client):
    carol = await login(client, "carol")
    response = await client.post("/api/v1/installer/actions", json=installer_body("dev"),
                                 headers=bearer(carol))
    body = await assert_problem(response, 403, "denied")
    assert body["reasons"] and all(isinstance(r, str) for r in body["reasons"])
    assert (await audit_entries(client))[-1]["outcome"] == "denied"


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param({}, id="no-credentials"),
        pytest.param({"Authorization": "Bearer not.a.token"}, id="garbage-token"),
        pytest.param({"Authorization": "Basic YWxpY2U6eA=="}, id="wrong-scheme"),
    ],
)
async def test_protected_routes_need_a_principal(client, headers):
    response = await client.post("/api/v1/installer/actions", json=installer_body("dev"),
                                 headers=headers)
    body = await assert_problem(response, 401, body_code(headers))
    assert body["status"] == 401
    entry = (await audit_entries(client))[-1]
    assert entry["outcome"] == "unauthenticated" and entry["principal"]["kind"] == "anonymous"


def body_code(headers: dict[str, str]) -> str:
    return "token_malformed" if headers.get("Authorization", "").startswith("Bearer") else "unauthenticated"


async def test_binding_mismatch_names_fields_and_consumes_nothing(client):
    alice = await step_up(client, await login(client, "alice"), "alice")
    ticket = await approved_ticket(client, alice)
    other = installer_body(resource={"app": "web", "version": "9.9.9"})
    response = await client.post("/api/v1/installer/actions", json=other,
                                 headers=ticket_headers(alice, ticket))
    body = await assert_problem(response, 403, "ticket_binding_mismatch")
    assert body["fields"] == ["resource_hash"]
    staging = installer_body(env="staging")
    # staging is not production: the policy allows alice without a ticket; nothing to bind.
    assert (await client.post("/api/v1/installer/actions", json=staging,
                              headers=bearer(alice))).status == 202
    stored = await client.server.app[STORE].require().get_ticket(ticket["id"])
    assert stored.state == "approved"
    ok = await client.post("/api/v1/installer/actions", json=installer_body(),
                           headers=ticket_headers(alice, ticket))
    assert ok.status == 202


async def test_wrong_nonce_is_a_mismatch_and_consumes_nothing(client):
    alice = await step_up(client, await login(client, "alice"), "alice")
    ticket = await approved_ticket(client, alice)
    forged = dict(ticket, nonce="A" * 43)
    response = await client.post("/api/v1/installer/actions", json=installer_body(),
                                 headers=ticket_headers(alice, forged))
    body = await assert_problem(response, 403, "ticket_binding_mismatch")
    assert body["fields"] == ["nonce"]
    assert (await client.server.app[STORE].require().get_ticket(ticket["id"])).state == "approved"


async def test_ticket_of_another_subject_is_a_mismatch(client):
    alice = await step_up(client, await login(client, "alice"), "alice")
    ticket = await approved_ticket(client, alice)
    bob = await step_up(client, await login(client, "bob"), "bob")
    response = await client.post("/api/v1/installer/actions", json=installer_body(),
                                 headers=ticket_headers(bob, ticket))
    # bob has no installer grant at all: the policy refuses before any ticket is looked at.
    await assert_problem(response, 403, "denied")


async def test_command_hash_binding(client):
    alice = await step_up(client, await login(client, "alice"), "alice")
    ticket = await approved_ticket(client, alice, command="helm upgrade web ./chart --version 1.2.3")
    missing = await client.post("/api/v1/installer/actions", json=installer_body(),
                                headers=ticket_headers(alice, ticket))
    body = await assert_problem(missing, 403, "ticket_binding_mismatch")
    assert body["fields"] == ["command_hash"]
    wrong = await client.post("/api/v1/installer/actions", json=installer_body(),
                              headers=ticket_headers(alice, ticket,
                                                     **{"Command-Hash": command_hash("rm -rf /")}))
    await assert_problem(wrong, 403, "ticket_binding_mismatch")
    right = await client.post(
        "/api/v1/installer/actions", json=installer_body(),
        headers=ticket_headers(alice, ticket, **{
            "Command-Hash": command_hash("helm upgrade web ./chart --version 1.2.3")}))
    assert right.status == 202


@pytest.mark.parametrize(
    "extra",
    [
        pytest.param({"Approval-Ticket": "tkt_" + "0" * 32}, id="ticket-without-nonce"),
        pytest.param({"Approval-Ticket": "../../etc", "Approval-Nonce": "x" * 20}, id="bad-id"),
        pytest.param({"Command-Hash": "md5:abc"}, id="bad-command-hash"),
    ],
)
async def test_malformed_approval_headers_are_400(client, extra):
    alice = await step_up(client, await login(client, "alice"), "alice")
    response = await client.post("/api/v1/installer/actions", json=installer_body(),
                                 headers=bearer(alice, **extra))
    assert response.status == 400
    assert (await response.json())["code"] in {"invalid_ticket_headers", "invalid_command_hash"}


async def test_installer_action_only_accepts_its_action(client):
    alice = await login(client, "alice")
    body = installer_body("dev") | {"action": "installer.run.destroy"}
    response = await client.post("/api/v1/installer/actions", json=body, headers=bearer(alice))
    problem = await assert_problem(response, 422, "schema_validation_failed")
    assert problem["errors"] == [{"pointer": "/action",
                                  "message": 'must be "installer.run.execute"'}]


async def test_installer_correlation_id_defaults_and_can_be_given(client):
    alice = await login(client, "alice")
    given = installer_body("dev") | {"correlation_id": "deploy-77"}
    response = await client.post("/api/v1/installer/actions", json=given, headers=bearer(alice))
    assert (await response.json())["event"]["correlation_id"] == "deploy-77"


async def test_separation_of_duties_requester_cannot_review(client):
    alice = await step_up(client, await login(client, "alice"), "alice")
    created = await client.post("/api/v1/approvals", headers=bearer(alice), json={
        "subject_id": "alice", "env": "prod", "action": "installer.run.execute",
        "resource": RESOURCE})
    ticket = await created.json()
    response = await client.post(f"/api/v1/approvals/{ticket['id']}/reviews",
                                 json={"decision": "approve"}, headers=bearer(alice))
    assert response.status == 403
    agent = await login(client, "agent-7")
    response = await client.post(f"/api/v1/approvals/{ticket['id']}/reviews",
                                 json={"decision": "approve"}, headers=bearer(agent))
    assert response.status == 403
    assert (await client.server.app[STORE].require().get_ticket(ticket["id"])).state == "pending"


async def test_prod_review_needs_step_up(client):
    alice = await login(client, "alice")
    created = await client.post("/api/v1/approvals", headers=bearer(alice), json={
        "subject_id": "alice", "env": "prod", "action": "installer.run.execute",
        "resource": RESOURCE})
    ticket = await created.json()
    bob = await login(client, "bob")
    response = await client.post(f"/api/v1/approvals/{ticket['id']}/reviews",
                                 json={"decision": "approve"}, headers=bearer(bob))
    await assert_problem(response, 401, "step_up_required")


async def test_reject_then_review_again_is_409(client):
    alice = await login(client, "alice")
    created = await client.post("/api/v1/approvals", headers=bearer(alice), json={
        "subject_id": "alice", "env": "prod", "action": "installer.run.execute",
        "resource": RESOURCE})
    ticket = await created.json()
    bob = await step_up(client, await login(client, "bob"), "bob")
    rejected = await client.post(f"/api/v1/approvals/{ticket['id']}/reviews",
                                 json={"decision": "reject", "reason": "not now"},
                                 headers=bearer(bob))
    assert (await rejected.json())["state"] == "rejected"
    again = await client.post(f"/api/v1/approvals/{ticket['id']}/revoke", headers=bearer(alice))
    await assert_problem(again, 409, "state_conflict")


async def test_revoked_ticket_cannot_be_used(client):
    alice = await step_up(client, await login(client, "alice"), "alice")
    ticket = await approved_ticket(client, alice)
    revoked = await client.post(f"/api/v1/approvals/{ticket['id']}/revoke", headers=bearer(alice))
    assert (await revoked.json())["state"] == "revoked"
    response = await client.post("/api/v1/installer/actions", json=installer_body(),
                                 headers=ticket_headers(alice, ticket))
    await assert_problem(response, 409, "ticket_revoked")


async def test_agent_must_bind_a_command_hash(client):
    agent = await login(client, "agent-7")
    response = await client.post("/api/v1/approvals", headers=bearer(agent), json={
        "subject_id": "agent-7", "env": "dev", "action": "installer.run.execute",
        "resource": RESOURCE})
    await assert_problem(response, 422, "command_hash_required")


async def test_client_resource_hash_must_match(client):
    alice = await login(client, "alice")
    response = await client.post("/api/v1/approvals", headers=bearer(alice), json={
        "subject_id": "alice", "env": "prod", "action": "installer.run.execute",
        "resource": RESOURCE, "resource_hash": "sha256:" + "0" * 64})
    await assert_problem(response, 422, "resource_hash_mismatch")


async def test_operator_cannot_request_for_someone_else(client):
    alice = await login(client, "alice")
    response = await client.post("/api/v1/approvals", headers=bearer(alice), json={
        "subject_id": "carol", "env": "prod", "action": "installer.run.execute",
        "resource": RESOURCE})
    await assert_problem(response, 403, "denied")


async def test_approval_list_is_a_paged_reviewer_queue(client):
    alice = await login(client, "alice")
    for version in range(3):
        await client.post("/api/v1/approvals", headers=bearer(alice), json={
            "subject_id": "alice", "env": "prod", "action": "installer.run.execute",
            "resource": {"app": "web", "version": str(version)}})
    bob = await login(client, "bob")
    page = await (await client.get("/api/v1/approvals?state=pending&limit=2",
                                   headers=bearer(bob))).json()
    assert len(page["items"]) == 2 and page["next_cursor"]
    rest = await (await client.get(f"/api/v1/approvals?state=pending&cursor={page['next_cursor']}",
                                   headers=bearer(bob))).json()
    assert len(rest["items"]) == 1
    assert all("nonce" not in t for t in page["items"] + rest["items"])
    bad = await client.get("/api/v1/approvals?state=bogus", headers=bearer(bob))
    await assert_problem(bad, 422, "invalid_query")


async def test_unknown_ticket_is_404(client):
    bob = await login(client, "bob")
    response = await client.get("/api/v1/approvals/tkt_" + "f" * 32, headers=bearer(bob))
    await assert_problem(response, 404, "ticket_not_found")


async def test_without_repository_approvals_503_and_prod_fails_closed(make_client):
    client = await make_client({"approvals": {"store": "none"}})
    alice = await step_up(client, await login(client, "alice"), "alice")
    response = await client.post("/api/v1/approvals", headers=bearer(alice), json={
        "subject_id": "alice", "env": "prod", "action": "installer.run.execute",
        "resource": RESOURCE})
    await assert_problem(response, 503, "approval_repository_unavailable")
    response = await client.post("/api/v1/installer/actions", json=installer_body(),
                                 headers=bearer(alice))
    await assert_problem(response, 503, "approval_repository_unavailable")
    assert await client.server.app[STORE].require().get_task("task-1") is None
    # dev still follows the policy.
    dev = await client.post("/api/v1/installer/actions", json=installer_body("dev"),
                            headers=bearer(alice))
    assert dev.status == 202


async def test_audit_that_cannot_be_written_means_the_mutation_did_not_happen(client):
    alice = await step_up(client, await login(client, "alice"), "alice")
    ticket = await approved_ticket(client, alice)
    db = client.server.app[CONFIG].store.sqlite_path
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TRIGGER no_audit BEFORE INSERT ON audit_log "
                     "BEGIN SELECT RAISE(ABORT, 'audit disk full'); END")
    response = await client.post("/api/v1/installer/actions", json=installer_body(),
                                 headers=ticket_headers(alice, ticket))
    body = await assert_problem(response, 503, "audit_unavailable")
    assert "disk full" not in str(body)
    store = client.server.app[STORE].require()
    assert (await store.get_ticket(ticket["id"])).state == "approved"
    assert await store.get_task("task-1") is None
    # The consumption's outbox event rolled back with it (the approval's is there).
    types = [e.type for e in await store.list_outbox(limit=50)]
    assert "approval.consumed" not in types and "approval.approved" in types


async def test_audit_records_are_for_admins_only(client):
    carol = await login(client, "carol")
    response = await client.get("/api/v1/audit/records", headers=bearer(carol))
    await assert_problem(response, 403, "denied")


async def test_admin_reads_the_audit_log(make_client, tmp_path):
    client = await make_client({"policies": {"dir": bound_policies(tmp_path, {"carol": ["admin"]})}})
    carol = await login(client, "carol")
    assert (await client.get("/api/v1/databases", headers=bearer(carol))).status == 200
    response = await client.get("/api/v1/audit/records?limit=5", headers=bearer(carol))
    assert response.status == 200
    items = (await response.json())["items"]
    assert items[0]["seq"] == 1 and items[0]["prev_hash"] == "sha256:" + "0" * 64


async def test_every_route_is_protected_or_public(client):
    """No handler of its own making: a route is in the chain with a catalogue action, a console
    page that runs its actions through the chain, or public."""
    from service.authz import actions

    unmarked = []
    for route in client.server.app.router.routes():
        if route.method == "HEAD":
            continue
        handler = route.handler
        protection = getattr(handler, "protection", None)
        console_actions = getattr(handler, "console_actions", None)
        if protection is not None:
            assert protection.action.name in actions.ACTIONS
        elif console_actions is not None:
            # A console page: the cookie names who calls, and each action it takes runs the chain.
            assert set(console_actions) <= set(actions.ACTIONS)
        elif not getattr(handler, "public", False):
            unmarked.append(f"{route.method} {route.resource.canonical}")
    assert unmarked == []


async def test_group_quorum_over_http_needs_each_group(make_client, tmp_path):
    """A policy asking one SRE AND one security approval: bob alone leaves the ticket pending."""
    policies = tmp_path / "policies"
    shutil.copytree(REPO / "policies", policies)
    envs = policies / "data" / "environments.yaml"
    doc = yaml.safe_load(envs.read_text())
    doc["approval"]["environments"]["prod"].update(quorum=2,
                                                   require_groups=["sre-approvers", "security"])
    envs.write_text(yaml.safe_dump(doc))
    # The shipped Rego tests pin the shipped quorum; this copy is a different policy.
    (policies / "authz_test.rego").unlink()
    bindings = policies / "data" / "bindings.yaml"
    doc = yaml.safe_load(bindings.read_text())
    doc["bindings"]["carol"] = {"roles": ["approver"]}
    doc["groups"]["security"] = ["carol"]
    bindings.write_text(yaml.safe_dump(doc))
    client = await make_client({"policies": {"dir": str(policies)}})
    alice = await step_up(client, await login(client, "alice"), "alice")
    created = await client.post("/api/v1/approvals", headers=bearer(alice), json={
        "subject_id": "alice", "env": "prod", "action": "installer.run.execute",
        "resource": RESOURCE})
    ticket = await created.json()
    assert ticket["quorum"] == 2
    bob = await step_up(client, await login(client, "bob"), "bob")
    after_bob = await (await client.post(f"/api/v1/approvals/{ticket['id']}/reviews",
                                         json={"decision": "approve"}, headers=bearer(bob))).json()
    assert after_bob["state"] == "pending"
    assert after_bob["reviews"][0]["group"] == "sre-approvers"
    carol = await step_up(client, await login(client, "carol"), "carol")
    after_carol = await (await client.post(f"/api/v1/approvals/{ticket['id']}/reviews",
                                           json={"decision": "approve"},
                                           headers=bearer(carol))).json()
    assert after_carol["state"] == "approved"
    assert [r["group"] for r in after_carol["reviews"]] == ["sre-approvers", "security"]


async def test_audit_jsonl_mirror_copies_committed_records(make_client, tmp_path):
    sink = tmp_path / "audit.jsonl"
    client = await make_client({"audit": {"jsonl_path": str(sink)}})
    carol = await login(client, "carol")
    await client.get("/api/v1/databases", headers=bearer(carol))
    await client.post("/api/v1/installer/actions", json=installer_body("dev"), headers=bearer(carol))
    lines = [json.loads(line) for line in sink.read_text().splitlines()]
    assert [(r["seq"], r["action"], r["outcome"]) for r in lines] == [
        (1, "databases.list", "executed"), (2, "installer.run.execute", "denied")]
    assert lines[1]["prev_hash"] == lines[0]["hash"]
    assert sink.stat().st_mode & 0o077 == 0


async def test_a_ticket_redeemed_by_a_read_is_consumed_too(client):
    """A policy may ask a ticket for a read; the ticket is still single-use."""
    from types import MappingProxyType

    from service.authz.decision import Decision

    engine = client.server.app[ENGINE]
    real = engine.decide

    def decide(doc, **kwargs):
        if doc["action"] == "databases.list":
            return Decision("require_approval", ("sensitive_read",), MappingProxyType({}), "test")
        return real(doc, **kwargs)

    alice = await step_up(client, await login(client, "alice"), "alice")
    bob = await step_up(client, await login(client, "bob"), "bob")
    engine.decide = decide
    try:
        # Asked while the policy requires a ticket for the read (else: approval_not_required).
        created = await client.post("/api/v1/approvals", headers=bearer(alice), json={
            "subject_id": "alice", "env": "prod", "action": "databases.list",
            "resource": {"collection": "databases"}})
        ticket = await created.json()
        await client.post(f"/api/v1/approvals/{ticket['id']}/reviews",
                          json={"decision": "approve"}, headers=bearer(bob))
        first = await client.get("/api/v1/databases?env=prod", headers=ticket_headers(alice, ticket))
        again = await client.get("/api/v1/databases?env=prod", headers=ticket_headers(alice, ticket))
    finally:
        engine.decide = real
    assert first.status == 200
    await assert_problem(again, 409, "ticket_consumed")
    assert (await client.server.app[STORE].require().get_ticket(ticket["id"])).state == "consumed"


async def test_ticket_requirements_are_decided_on_the_executing_requests_resource_kind(client):
    """Creating a ticket asks the policy about the target action with the same resource kind
    the executing request will present (both come from the action catalogue)."""
    engine = client.server.app[ENGINE]
    real = engine.decide
    seen: dict[str, set[str]] = {}

    def spy(doc, **kwargs):
        seen.setdefault(doc["action"], set()).add(doc["resource"]["kind"])
        return real(doc, **kwargs)

    engine.decide = spy
    try:
        alice = await step_up(client, await login(client, "alice"), "alice")
        await client.post("/api/v1/approvals", headers=bearer(alice), json={
            "subject_id": "alice", "env": "prod", "action": "installer.run.execute",
            "resource": RESOURCE})
        await client.post("/api/v1/installer/actions", json=installer_body(), headers=bearer(alice))
    finally:
        engine.decide = real
    assert seen["installer.run.execute"] == {"installer_run"}
    assert seen["approvals.create"] == {"approval_ticket"}


async def test_sweep_expires_tickets_with_audit_and_purges_housekeeping_rows(client):
    alice = await step_up(client, await login(client, "alice"), "alice")
    response = await client.post(
        "/api/v1/approvals",
        json={"subject_id": "alice", "env": "prod", "action": "installer.run.execute",
              "resource": RESOURCE, "reason": "never reviewed"},
        headers=bearer(alice),
    )
    assert response.status == 201
    ticket = await response.json()
    now = clock.now()
    store = client.server.app[STORE].require()
    window = client.server.app[CONFIG].authn.failure_window_s
    await store.reserve_attempt([ThrottleRule("stale", window, 5)], now - 10 * window)
    await store.reserve_attempt([ThrottleRule("mallory", window, 5)], now)
    assert await store.claim_once("test", "stale", now - 1, now - 100) is True

    await expire_once(store, client.server.app[AUDIT], now + 30 * 86400)
    await client.server.app[AUTHENTICATOR].purge(now + 30 * 86400)  # past every pending/approval ttl

    assert (await store.get_ticket(ticket["id"])).state == "expired"
    expiries = [e for e in await audit_entries(client) if e.get("ticket_event") == "expired"]
    assert [e["ticket_id"] for e in expiries] == [ticket["id"]]
    # the sweep ran "30 days later": every failure, claim and session was past keeping
    assert await store.count_failures("mallory", now, window) == 0
    later = now + 30 * 86400
    assert await store.purge_expired(later, later - window, later) == (0, 0, 0)
    # alice's token has not expired yet by the real clock, but its session is gone: refused
    refused = await client.get(f"/api/v1/approvals/{ticket['id']}", headers=bearer(alice))
    assert refused.status == 401 and (await refused.json())["code"] == "session_inactive"
    count, broken = await client.server.app[AUDIT].verify()
    assert broken is None and count >= 1


async def test_refused_redemptions_are_audited_with_the_presented_ticket_id(client):
    """A presented ticket that is refused (mismatched, consumed) is named in the run's record."""
    alice = await step_up(client, await login(client, "alice"), "alice")
    ticket = await approved_ticket(client, alice)
    mismatched = installer_body(resource={"app": "web", "version": "9.9.9"})
    refused = await client.post("/api/v1/installer/actions", json=mismatched,
                                headers=ticket_headers(alice, ticket))
    await assert_problem(refused, 403, "ticket_binding_mismatch")
    ok = await client.post("/api/v1/installer/actions", json=installer_body(),
                           headers=ticket_headers(alice, ticket))
    assert ok.status == 202
    replayed = await client.post("/api/v1/installer/actions", json=installer_body(),
                                 headers=ticket_headers(alice, ticket))
    await assert_problem(replayed, 409, "ticket_consumed")
    runs = [e for e in await audit_entries(client) if e["action"] == "installer.run.execute"]
    assert [(e["outcome"], e.get("error"), e.get("ticket_id")) for e in runs] == [
        ("rejected", "ticket_binding_mismatch", ticket["id"]),
        ("executed", None, ticket["id"]),
        ("rejected", "ticket_consumed", ticket["id"]),
    ]
    assert [e.get("ticket_consumed") for e in runs] == [None, True, None]
