"""Publishing, listing, activating and rolling back policy revisions over HTTP, through the chain."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from service.authz.activations import ActivationSigner, activation_keys, verify_activation
from service.authz.revisions import Bundle
from service.storelink import STORE
from tests.auth import bearer, login, step_up
from tests.authz.revisions import keypair, published, store_keys, variant
from tests.problems import assert_problem

REPO = Path(__file__).resolve().parents[2]
NON_PRODUCTION = {"environments": {"dev": {"production": False}, "staging": {"production": False}}}


async def audit_actions(client: Any) -> list[tuple[str, str]]:
    store = client.server.app[STORE].require()
    return [(r.entry["action"], r.entry["outcome"]) for r in await store.audit_range(0, 1000)]


async def test_fleet_publish_list_activate_and_roll_back(make_client, tmp_path):
    key, public = keypair(tmp_path)
    client = await make_client({**NON_PRODUCTION,
                                "policies": {"store": store_keys(public)}})
    alice = await login(client, "alice")
    # The shipped policies (vetted once per test session) and one variant of them.
    first, second = Bundle.from_dir(REPO / "policies"), variant("two")

    r = await client.post("/api/v1/policy/revisions", json=published(key, first),
                          headers=bearer(alice))
    assert r.status == 201, await r.text()
    one = await r.json()
    assert one["id"] == first.revision_id() and one["digest"] == first.digest
    assert (one["author"], one["message"], one["active"]) == ("alice", "tighten reads", False)
    again = await client.post("/api/v1/policy/revisions", json=published(key, first),
                              headers=bearer(alice))
    assert again.status == 200  # the same content: stored once
    r = await client.post("/api/v1/policy/revisions", json=published(key, second, "second"),
                          headers=bearer(alice))
    two = await r.json()

    nothing = await client.post("/api/v1/policy/rollback", json={}, headers=bearer(alice))
    await assert_problem(nothing, 409, "no_rollback_target")
    for rev in (one, two):
        r = await client.post("/api/v1/policy/activation",
                              json={"revision": rev["id"], "reason": "roll out"},
                              headers=bearer(alice))
        assert r.status == 200, await r.text()
    activated = await r.json()
    assert (activated["revision"], activated["previous"], activated["kind"]) == (
        two["id"], one["id"], "activate")

    back = await client.post("/api/v1/policy/rollback", json={"reason": "bad"},
                             headers=bearer(alice))
    assert back.status == 200, await back.text()
    assert (await back.json())["revision"] == one["id"]

    carol = await login(client, "carol")  # a viewer reads the list, cannot change it
    listing = await (await client.get("/api/v1/policy/revisions", headers=bearer(carol))).json()
    assert listing["active"]["revision"] == one["id"] and listing["active"]["kind"] == "rollback"
    assert [(i["id"], i["active"]) for i in listing["items"]] == [
        (two["id"], False), (one["id"], True)]
    assert [a["seq"] for a in listing["activations"]] == [3, 2, 1]
    denied = await client.post("/api/v1/policy/activation", json={"revision": two["id"]},
                               headers=bearer(carol))
    await assert_problem(denied, 403, "denied")
    missing = await client.post("/api/v1/policy/activation",
                                json={"revision": "sha256:0000000000000000"},
                                headers=bearer(alice))
    await assert_problem(missing, 404, "policy_revision_not_found")


async def test_publish_refuses_what_no_replica_would_load(make_client, tmp_path):
    key, public = keypair(tmp_path)
    client = await make_client({**NON_PRODUCTION,
                                "policies": {"store": store_keys(public)}})
    alice = await login(client, "alice")
    untrusted = published(Ed25519PrivateKey.generate())
    tampered = published(key)  # signed content, then a module changed
    tampered["bundle"]["modules"]["authz.rego"] += "\n# changed after signing\n"
    base = Bundle.from_dir(REPO / "policies")
    broken = published(key, Bundle(  # signed, but it does not compile
        {**base.modules, "authz.rego": "package controlplane.authz\nx := \n"}, base.data))
    for body, code, reason in ((untrusted, "policy_signature_invalid", "untrusted_key"),
                               (tampered, "policy_signature_invalid", "digest_mismatch"),
                               (broken, "policy_rejected", None)):
        r = await client.post("/api/v1/policy/revisions", json=body, headers=bearer(alice))
        problem = await assert_problem(r, 422, code)
        assert problem.get("reason") == reason
    store = client.server.app[STORE].require()
    assert await store.list_policy_revisions() == []


async def test_production_fleet_needs_an_approved_ticket(make_client, tmp_path):
    """Default environments (prod is production): publish and activate are production
    mutations: without a ticket 403 approval_required, one audit record each."""
    key, public = keypair(tmp_path)
    client = await make_client({"policies": {"store": store_keys(public)}})
    alice = await step_up(client, await login(client, "alice"), "alice")
    body = published(key)
    refused = await client.post("/api/v1/policy/revisions", json=body, headers=bearer(alice))
    await assert_problem(refused, 403, "approval_required")
    assert await audit_actions(client) == [("policy.publish", "approval_required")]
    store = client.server.app[STORE].require()
    assert await store.list_policy_revisions() == []

    # With an approved ticket bound to {revision, digest}, it is published.
    bundle = Bundle.from_doc(body["bundle"])
    resource = {"revision": bundle.revision_id(), "digest": bundle.digest}
    ticket = await _approved(client, alice, "policy.publish", resource)
    ok = await client.post("/api/v1/policy/revisions", json=body, headers=bearer(
        alice, **{"Approval-Ticket": ticket["id"], "Approval-Nonce": ticket["nonce"]}))
    assert ok.status == 201, await ok.text()

    before = len(await audit_actions(client))
    refused = await client.post("/api/v1/policy/activation",
                                json={"revision": resource["revision"]}, headers=bearer(alice))
    await assert_problem(refused, 403, "approval_required")
    assert (await audit_actions(client))[before:] == [("policy.activate", "approval_required")]
    assert await store.active_policy() is None


async def _approved(client: Any, alice: str, action: str, resource: Any) -> dict[str, Any]:
    r = await client.post("/api/v1/approvals", headers=bearer(alice), json={
        "subject_id": "alice", "env": "prod", "action": action, "resource": resource,
        "reason": "policy change"})
    assert r.status == 201, await r.text()
    ticket = await r.json()
    bob = await step_up(client, await login(client, "bob"), "bob")
    review = await client.post(f"/api/v1/approvals/{ticket['id']}/reviews",
                               json={"decision": "approve"}, headers=bearer(bob))
    assert review.status == 200, await review.text()
    return dict(ticket)


async def test_activations_are_signed_audited_and_need_the_activation_key(make_client, tmp_path):
    """Issue 30 (3): every activation and rollback is stored signed by the replica's activation
    key and audited with what was signed; a replica without the key activates nothing (503)."""
    key, public = keypair(tmp_path)
    keys = store_keys(public)
    client = await make_client({**NON_PRODUCTION, "policies": {"store": keys}})
    alice = await login(client, "alice")
    revisions = []
    for note in ("one", "two"):
        r = await client.post("/api/v1/policy/revisions", json=published(key, variant(note)),
                              headers=bearer(alice))
        revisions.append((await r.json())["id"])
        r = await client.post("/api/v1/policy/activation", json={"revision": revisions[-1]},
                              headers=bearer(alice))
        assert r.status == 200, await r.text()
    r = await client.post("/api/v1/policy/rollback", json={}, headers=bearer(alice))
    assert r.status == 200, await r.text()
    signer = ActivationSigner.from_file(Path(keys["activation_key"]))
    trusted = activation_keys((), signer)
    store = client.server.app[STORE].require()
    history = await store.policy_activations()
    assert [(a.seq, a.kind) for a in history] == [(3, "rollback"), (2, "activate"),
                                                   (1, "activate")]
    for a in history:
        assert verify_activation(a, trusted) is None  # signed; no ticket needed here
    audited = [r.entry for r in await store.audit_range(0, 1000)
               if r.entry["action"] == "policy.activate"]
    assert [(e["outcome"], e["seq"], e["kind"], e["activation_kid"]) for e in audited] == [
        ("executed", 1, "activate", signer.kid), ("executed", 2, "activate", signer.kid),
        ("executed", 3, "rollback", signer.kid)]

    bare = await make_client({**NON_PRODUCTION,
                              "policies": {"store": {"trusted_keys": [str(public)]}}})
    bob = await login(bare, "alice")
    r = await bare.post("/api/v1/policy/revisions", json=published(key, variant("three")),
                        headers=bearer(bob))
    r = await bare.post("/api/v1/policy/activation", json={"revision": (await r.json())["id"]},
                        headers=bearer(bob))
    await assert_problem(r, 503, "policy_activation_key_missing")
    assert len(await bare.server.app[STORE].require().policy_activations()) == len(history)


async def test_rollback_right_after_the_first_activation_returns_to_directory_mode(
        make_client, tmp_path):
    """Issue 30 (4): no 409 no_rollback_target after the first activation: the rollback is a
    signed activation of no revision (every replica runs its policies.dir again)."""
    key, public = keypair(tmp_path)
    client = await make_client({**NON_PRODUCTION, "policies": {"store": store_keys(public)}})
    alice = await login(client, "alice")
    r = await client.post("/api/v1/policy/revisions", json=published(key, variant("only")),
                          headers=bearer(alice))
    only = (await r.json())["id"]
    r = await client.post("/api/v1/policy/activation", json={"revision": only},
                          headers=bearer(alice))
    assert r.status == 200, await r.text()
    back = await client.post("/api/v1/policy/rollback", json={"reason": "back to files"},
                             headers=bearer(alice))
    assert back.status == 200, await back.text()
    body = await back.json()
    assert (body["revision"], body["previous"], body["kind"]) == (None, only, "rollback")
    again = await client.post("/api/v1/policy/rollback", json={}, headers=bearer(alice))
    assert again.status == 200, await again.text()  # and forward again to the revision
    assert (await again.json())["revision"] == only


async def test_a_publish_ticket_shows_its_change_and_replayed_impact(make_client, tmp_path):
    """Issue 30 (2): before approval, the reviewer of a policy.publish ticket reads the signed
    message and author, the vetting, the diff against the running revision and the recent
    decisions replayed against the candidate (carol's viewer role revoked: her allowed reads
    would be denied)."""
    from tests.authz.conftest import candidate_without_carols_role

    key, public = keypair(tmp_path)
    log_path = tmp_path / "decisions.jsonl"
    client = await make_client({"policies": {"store": store_keys(public)},
                                "decision_log": {"path": str(log_path)}})
    alice = await step_up(client, await login(client, "alice"), "alice")
    carol = await login(client, "carol")
    for _ in range(3):
        assert (await client.get("/api/v1/databases", headers=bearer(carol))).status == 200
    deadline = time.monotonic() + 10
    while not log_path.exists() or log_path.read_text().count("\n") < 3:
        assert time.monotonic() < deadline, "the decision log was not written"
        await asyncio.sleep(0.05)

    bundle = Bundle.from_dir(candidate_without_carols_role(tmp_path / "candidate"))
    body = published(key, bundle, "revoke carol's viewer role")
    refused = await client.post("/api/v1/policy/revisions", json=body, headers=bearer(alice))
    await assert_problem(refused, 403, "approval_required")
    r = await client.post("/api/v1/approvals", headers=bearer(alice), json={
        "subject_id": "alice", "env": "prod", "action": "policy.publish",
        "resource": {"revision": bundle.revision_id(), "digest": bundle.digest}})
    assert r.status == 201, await r.text()
    ticket = await r.json()

    bob = await login(client, "bob")
    r = await client.get(f"/api/v1/approvals/{ticket['id']}/change", headers=bearer(bob))
    assert r.status == 200, await r.text()
    change = await r.json()
    assert (change["revision"], change["source"], change["author"], change["message"]) == (
        bundle.revision_id(), "proposed", "alice", "revoke carol's viewer role")
    assert change["vetting"]["passed"] is True
    assert change["diff"]["files"] == [
        {"file": "data/bindings.yaml", "status": "changed", "added": 1, "removed": 1}]
    assert "-  carol: {roles: [viewer]}" in change["diff"]["text"]
    impact = change["impact"]
    assert impact["available"] is True and impact["total"] >= 3
    carol_denied = impact["groups"]["allow->deny"]
    assert carol_denied["count"] >= 3
    assert {e["subject"] for e in carol_denied["examples"]} == {"carol"}
    assert change["impact_summary"].startswith(f"{impact['changed']} of {impact['total']} "
                                               "recent decisions would change: allow->deny")

    other = await client.post("/api/v1/approvals", headers=bearer(alice), json={
        "subject_id": "alice", "env": "prod", "action": "installer.run.execute",
        "resource": {"app": "web"}})
    r = await client.get(f"/api/v1/approvals/{(await other.json())['id']}/change",
                         headers=bearer(bob))
    await assert_problem(r, 404, "no_policy_change")


async def test_a_publish_the_policy_denies_keeps_no_candidate(make_client, tmp_path):
    """A candidate is kept for its ticket's reviewers only once AuthZ let the publish through:
    carol (a viewer, denied policy.publish) leaves nothing in the store; alice (who needs a
    ticket) leaves the candidate her reviewers read."""
    key, public = keypair(tmp_path)
    client = await make_client({"policies": {"store": store_keys(public)}})
    store = client.server.app[STORE].require()
    bundle = Bundle.from_dir(REPO / "policies")
    body = published(key, bundle, "same policy, re-signed")
    revision = bundle.revision_id()
    carol = await login(client, "carol")
    await assert_problem(await client.post("/api/v1/policy/revisions", json=body,
                                           headers=bearer(carol)), 403, "denied")
    assert await store.get_policy_candidate(revision) is None
    alice = await step_up(client, await login(client, "alice"), "alice")
    await assert_problem(await client.post("/api/v1/policy/revisions", json=body,
                                           headers=bearer(alice)), 403, "approval_required")
    kept = await store.get_policy_candidate(revision)
    assert kept is not None and kept.published_by == "alice"
