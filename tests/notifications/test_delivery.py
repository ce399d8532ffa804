"""Notifications end to end: the real app, its real store and dispatcher, and a real receiver on
127.0.0.1. Signatures are checked here with hmac directly, not with the service's own code."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from service.storelink import STORE
from tests.auth import bearer, login, step_up
from tests.metrics import Families, scrape, value
from tests.notifications.receiver import Receiver

KEY_OLD, KEY_NEW = b"o" * 32, b"n" * 32
SECRETS = ["whsec_" + base64.b64encode(k).decode() for k in (KEY_OLD, KEY_NEW)]
RESOURCE = {"app": "web", "version": "1.2.3", "note": "<script>alert(1)</script> & <!channel>"}
COMMAND = ["helm", "upgrade", "web", "./chart", "--password", "hunter2"]


@pytest.fixture
async def receiver():
    r = await Receiver().start()
    yield r
    await r.stop()


def notifications(url: str, **extra: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "public_url": "https://cp.example.test/",
        "poll_interval_s": 0.05, "backoff_base_s": 0.05, "backoff_max_s": 0.2,
        "sinks": [
            {"name": "hook", "type": "webhook", "url": f"{url}/hook", "secrets": SECRETS,
             "timeout_s": 2},
            {"name": "chat", "type": "slack", "url": f"{url}/slack", "timeout_s": 2,
             "events": ["approval.requested"], "envs": ["prod"]},
            {"name": "staging-chat", "type": "slack", "url": f"{url}/staging", "timeout_s": 2,
             "envs": ["staging"]},
        ],
    }
    base.update(extra)
    return {"notifications": base}


async def events_ended(client, outcome: str, count: float) -> Families:
    """/metrics once ``count`` events have ended a round with ``outcome`` (the dispatcher counts
    an event just after the store has recorded it, so a reader of the store can be first)."""
    name = "controlplane_notification_events"
    deadline = time.monotonic() + 10
    while True:
        families = await scrape(client)
        if value(families, name, name + "_total", outcome=outcome) >= count \
                or time.monotonic() > deadline:
            return families
        await asyncio.sleep(0.02)


def verify_signature(received, key: bytes) -> bool:
    """Standard Webhooks, independently: HMAC-SHA256 over id.timestamp.body, base64, v1."""
    msg_id, ts = received.headers["webhook-id"], received.headers["webhook-timestamp"]
    mac = hmac.new(key, f"{msg_id}.{ts}.".encode() + received.body, hashlib.sha256).digest()
    expected = "v1," + base64.b64encode(mac).decode()
    return any(hmac.compare_digest(s, expected)
               for s in received.headers["webhook-signature"].split(" "))


async def request_approve_consume(client, before_review: Callable[[], Awaitable[None]] | None = None
                                  ) -> dict[str, Any]:
    """alice requests a ticket, bob approves it, alice runs with it. ``before_review``: awaited
    between the request and the review (the request's notification names its reviewers as of
    its delivery: once bob approved, nobody is left to suggest)."""
    alice = await step_up(client, await login(client, "alice"), "alice")
    created = await client.post("/api/v1/approvals", headers=bearer(alice), json={
        "subject_id": "alice", "env": "prod", "action": "installer.run.execute",
        "resource": RESOURCE, "command": COMMAND, "reason": "release <b>1.2.3</b>"})
    assert created.status == 201, await created.text()
    ticket = await created.json()
    if before_review is not None:
        await before_review()
    bob = await step_up(client, await login(client, "bob"), "bob")
    review = await client.post(f"/api/v1/approvals/{ticket['id']}/reviews",
                               json={"decision": "approve", "reason": "CHG-42"},
                               headers=bearer(bob))
    assert review.status == 200, await review.text()
    run = await client.post("/api/v1/installer/actions", json={
        "task_id": "t-1", "action": "installer.run.execute", "env": "prod", "resource": RESOURCE},
        headers=bearer(alice, **{"Approval-Ticket": ticket["id"], "Approval-Nonce": ticket["nonce"],
                                 "Command-Hash": ticket["command_hash"]}))
    assert run.status == 202, await run.text()
    return ticket


async def test_requested_approved_consumed_arrive_signed(make_client, receiver):
    client = await make_client(notifications(receiver.url))

    async def requested_delivered() -> None:
        await receiver.wait_for(lambda r: len(r.accepted("/hook")) >= 1)

    ticket = await request_approve_consume(client, requested_delivered)
    await receiver.wait_for(lambda r: len(r.accepted("/hook")) >= 3 and r.accepted("/slack"))

    hooks = receiver.accepted("/hook")
    assert [h.json["type"] for h in hooks] == [
        "approval.requested", "approval.approved", "approval.consumed"]
    for hook in hooks:
        # Two active secrets (rotation): a receiver holding either one verifies the message.
        assert verify_signature(hook, KEY_OLD) and verify_signature(hook, KEY_NEW)
        assert not verify_signature(hook, b"x" * 32)
        assert abs(int(hook.headers["webhook-timestamp"]) - time.time()) < 60
        assert hook.headers["Content-Type"].startswith("application/cloudevents+json")
        event = hook.json
        assert event["specversion"] == "1.0" and event["id"] == hook.headers["webhook-id"]
        assert event["subject"] == ticket["id"] and event["source"] == "urn:controlplane"
        assert event["datacontenttype"] == "application/json" and event["time"].endswith("Z")
        data = event["data"]
        assert data["id"] == ticket["id"] and data["resource"] == RESOURCE
        assert data["console_url"] == f"https://cp.example.test/console/tickets/{ticket['id']}"
        # Nothing secret: no nonce (nor its hash), and the command's password masked.
        assert ticket["nonce"] not in hook.body.decode() and "nonce" not in data
        assert "hunter2" not in hook.body.decode()
        assert data["command"] == ["helm", "upgrade", "web", "./chart", "--password", "***"]
        assert data["command_hash"] == ticket["command_hash"]
    assert len({h.json["id"] for h in hooks}) == 3
    requested, approved, consumed = (h.json["data"] for h in hooks)
    assert requested["actor"] == "alice" and requested["state"] == "pending"
    # bob: an approver in sre-approvers. Not dave (an approver, but prod needs sre-approvers),
    # not carol (a viewer), not alice (the requester), not the agent or service, not erin (in
    # sre-approvers by policy data, but no identity).
    assert requested["suggested_reviewers"] == ["bob"]
    assert approved["actor"] == "bob" and approved["review"]["reason"] == "CHG-42"
    assert approved["state"] == "approved" and "suggested_reviewers" not in approved
    assert consumed["state"] == "consumed" and consumed["correlation_id"]

    # The Slack sinks' filters: requests in prod only; staging only (nothing here).
    (chat,) = receiver.accepted("/slack")
    assert not [r for r in receiver.received if r.path == "/staging"]
    message = chat.json
    text = json.dumps(message)
    assert "Approval requested" in message["text"]
    assert "<script>" not in text and "<!channel>" not in text and "&lt;script&gt;" in text
    assert "hunter2" not in text and "helm" in text
    assert "Suggested reviewers: bob" in text
    buttons = [b for b in message["blocks"] if b["type"] == "actions"]
    assert buttons[0]["elements"][0]["url"].endswith(f"/console/tickets/{ticket['id']}")

    store = client.server.app[STORE].require()
    await settled(store)
    events = await store.list_outbox(limit=10)
    assert [e.state for e in events] == ["delivered"] * 3


async def settled(store, timeout_s: float = 5.0) -> None:
    """Until no outbox event is pending (the dispatcher records after the receiver answers)."""
    deadline = time.monotonic() + timeout_s
    while any(e.state == "pending" for e in await store.list_outbox(limit=500)):
        assert time.monotonic() < deadline, "outbox events still pending"
        await asyncio.sleep(0.05)


async def test_retried_after_500s_and_delivered_once_per_id(make_client, receiver):
    receiver.fail_first = 3
    client = await make_client(notifications(receiver.url, sinks=[
        {"name": "hook", "type": "webhook", "url": f"{receiver.url}/hook", "secrets": SECRETS[:1],
         "timeout_s": 2}]))
    ticket = await request_approve_consume(client)
    await receiver.wait_for(lambda r: len(r.accepted("/hook")) >= 3)
    hooks = [h for h in receiver.received if h.path == "/hook"]
    assert [h.status for h in hooks[:3]] == [500, 500, 500]
    # The de-duplicating receiver's view: every id accepted exactly once, same id on retries.
    accepted = Counter(h.headers["webhook-id"] for h in receiver.accepted("/hook"))
    assert len(accepted) == 3 and set(accepted.values()) == {1}
    retried = {h.headers["webhook-id"] for h in hooks[:3]}
    assert retried <= set(accepted)
    assert [h.json["type"] for h in receiver.accepted("/hook")] == [
        "approval.requested", "approval.approved", "approval.consumed"]
    store = client.server.app[STORE].require()
    await settled(store)
    first = next(e for e in await store.list_outbox(limit=10) if e.type == "approval.requested")
    assert first.state == "delivered" and first.attempts == 4
    (delivery,) = await store.outbox_deliveries(first.id)
    assert delivery.state == "delivered" and delivery.attempts == 4
    assert ticket["id"] == first.ticket_id
    # /metrics: each attempt per sink, and what each round did with its event.
    families = await events_ended(client, "delivered", 3)
    deliveries = "controlplane_notification_deliveries"
    assert value(families, deliveries, deliveries + "_total", sink="hook", result="failed") == 3
    assert value(families, deliveries, deliveries + "_total", sink="hook",
                 result="delivered") == 3
    events = "controlplane_notification_events"
    assert value(families, events, events + "_total", outcome="retried") == 3
    assert value(families, events, events + "_total", outcome="delivered") == 3
    assert value(families, events, events + "_total", outcome="dead") == 0


async def test_redirects_are_refused_and_dead_lettered(make_client, receiver):
    receiver.status = 302
    client = await make_client(notifications(receiver.url, max_age_s=0.3, sinks=[
        {"name": "hook", "type": "webhook", "url": f"{receiver.url}/hook", "secrets": SECRETS[:1],
         "timeout_s": 2}]))
    alice = await login(client, "alice")
    created = await client.post("/api/v1/approvals", headers=bearer(alice), json={
        "subject_id": "alice", "env": "prod", "action": "installer.run.execute",
        "resource": RESOURCE})
    assert created.status == 201
    store = client.server.app[STORE].require()

    async def dead() -> list[Any]:
        return [e for e in await store.list_outbox(failed=True) if e.state == "dead"]

    deadline = time.monotonic() + 10
    while not await dead() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    (event,) = await dead()
    events = "controlplane_notification_events"
    assert value(await events_ended(client, "dead", 1), events, events + "_total",
                 outcome="dead") == 1
    assert "redirect refused" in (event.last_error or "")
    assert str(receiver.url) not in (event.last_error or "")  # the URL is a secret
    # Nothing followed the redirect: every request reached the sink's own path.
    assert {r.path for r in receiver.received} == {"/hook"}
    assert len(receiver.received) >= 2  # retried before giving up


async def test_a_slow_sink_times_out_and_is_retried(make_client, receiver):
    receiver.delay_s = 1.0
    client = await make_client(notifications(receiver.url, sinks=[
        {"name": "hook", "type": "webhook", "url": f"{receiver.url}/hook", "secrets": SECRETS[:1],
         "timeout_s": 0.2}]))
    alice = await login(client, "alice")
    created = await client.post("/api/v1/approvals", headers=bearer(alice), json={
        "subject_id": "alice", "env": "prod", "action": "installer.run.execute",
        "resource": RESOURCE})
    assert created.status == 201
    store = client.server.app[STORE].require()
    deadline = time.monotonic() + 10
    while not (failing := await store.list_outbox(failed=True)):
        assert time.monotonic() < deadline, "no failed attempt recorded"
        await asyncio.sleep(0.05)
    assert failing[0].state == "pending" and "no answer within 0.2 s" in failing[0].last_error


async def test_an_endless_answer_is_cut_at_the_cap(make_client, receiver):
    receiver.endless = True
    client = await make_client(notifications(receiver.url, sinks=[
        {"name": "hook", "type": "webhook", "url": f"{receiver.url}/hook", "secrets": SECRETS[:1],
         "timeout_s": 3, "max_response_bytes": 100_000}]))
    alice = await login(client, "alice")
    created = await client.post("/api/v1/approvals", headers=bearer(alice), json={
        "subject_id": "alice", "env": "prod", "action": "installer.run.execute",
        "resource": RESOURCE})
    assert created.status == 201
    store = client.server.app[STORE].require()
    await settled(store, timeout_s=10)
    (event,) = await store.list_outbox(limit=5)
    # Delivered (a 2xx) at the first attempt: reading stopped at the cap; had it waited for the
    # answer that never ends, the 3 s timeout would have failed the attempt.
    assert event.state == "delivered" and event.attempts == 1


async def test_without_sinks_events_are_settled_with_no_deliveries(make_client):
    """No sink configured: the dispatcher finishes the events in bulk (``settle_outbox``), with
    the outcome a delivery round would record: delivered, one attempt, no delivery records."""
    client = await make_client({"notifications": {"poll_interval_s": 0.05, "sinks": []}})
    ticket = await request_approve_consume(client)
    store = client.server.app[STORE].require()
    await settled(store)
    events = [e for e in await store.list_outbox(limit=10) if e.ticket_id == ticket["id"]]
    assert sorted(e.type for e in events) == [
        "approval.approved", "approval.consumed", "approval.requested"]
    for event in events:
        assert event.state == "delivered" and event.attempts == 1 and event.finished_at
        assert await store.outbox_deliveries(event.id) == []
    families = await events_ended(client, "settled", 3)
    events_family = "controlplane_notification_events"
    assert value(families, events_family, events_family + "_total", outcome="settled") == 3
    assert value(families, "controlplane_notification_deliveries",
                 "controlplane_notification_deliveries_total") == 0


async def test_a_command_line_password_is_masked_in_webhook_and_slack_bodies(make_client, receiver):
    """The space-separated ``--password VALUE`` form of a command line, and a quoted value, reach
    neither the webhook nor the Slack message; the rest of the command does."""
    client = await make_client(notifications(receiver.url))
    alice = await login(client, "alice")
    line = "mysql --host db --password hunter2 -e 'select 1' --api-key 'k3y k3y'"
    created = await client.post("/api/v1/approvals", headers=bearer(alice), json={
        "subject_id": "alice", "env": "prod", "action": "installer.run.execute",
        "resource": {"app": "web", "version": "1.2.3"}, "command": line})
    assert created.status == 201, await created.text()
    await receiver.wait_for(lambda r: r.accepted("/hook") and r.accepted("/slack"))
    (hook,), (chat,) = receiver.accepted("/hook"), receiver.accepted("/slack")
    for body in (hook.body.decode(), json.dumps(chat.json)):
        assert "hunter2" not in body and "k3y" not in body, body
        assert "mysql --host db --password ***" in body
    assert hook.json["data"]["command"] == "mysql --host db --password *** -e 'select 1' --api-key ***"


async def test_a_policy_change_request_carries_the_change(make_client, receiver, tmp_path):
    """Issue 30 (2): the notification of a policy.publish request carries who wrote the change
    and why, its diff summary against the running revision and its impact (webhook data and the
    chat message)."""
    from service.authz.revisions import Bundle
    from tests.authz.revisions import keypair, published, store_keys, variant

    key, public = keypair(tmp_path)
    client = await make_client({**notifications(receiver.url),
                                "policies": {"store": store_keys(public)}})
    alice = await step_up(client, await login(client, "alice"), "alice")
    bundle: Bundle = variant("notify the reviewers")
    refused = await client.post("/api/v1/policy/revisions", headers=bearer(alice),
                                json=published(key, bundle, "CHG-5 <!channel> tighten"))
    assert refused.status == 403
    r = await client.post("/api/v1/approvals", headers=bearer(alice), json={
        "subject_id": "alice", "env": "prod", "action": "policy.publish",
        "resource": {"revision": bundle.revision_id(), "digest": bundle.digest}})
    assert r.status == 201, await r.text()
    await receiver.wait_for(lambda r: r.accepted("/hook") and r.accepted("/slack"))
    (hook,) = receiver.accepted("/hook")
    change = hook.json["data"]["policy_change"]
    assert (change["revision"], change["author"], change["message"]) == (
        bundle.revision_id(), "alice", "CHG-5 <!channel> tighten")
    assert change["diff"]["files"] == [
        {"file": "authz.rego", "status": "changed", "added": 2, "removed": 0}]
    assert change["impact_summary"].startswith("no decision log is configured")
    (chat,) = receiver.accepted("/slack")
    text = json.dumps(chat.json)
    assert "*Policy change:*" in text and "CHG-5 &lt;!channel&gt; tighten" in text
    assert "1 files, +2 -0 lines" in text
