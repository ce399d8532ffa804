"""A ticket's live event stream: the ticket first, each change, the end once it is settled."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from service.app import create_app
from service.config import CONFIG
from service.streams import STREAMS
from tests.auth import bearer, login, step_up
from tests.problems import assert_problem
from tests.store import pg

STREAM = {"Accept": "text/event-stream"}
PROD = {"env": "prod", "action": "installer.run.execute", "resource": {"app": "web", "version": "1.2.3"}}


async def create_ticket(client: TestClient, token: str, **overrides: Any) -> dict[str, Any]:
    body = {"subject_id": "alice", **PROD, **overrides}
    response = await client.post("/api/v1/approvals", json=body, headers=bearer(token))
    assert response.status == 201, await response.text()
    return dict(await response.json())


def parse(text: str) -> list[tuple[str, Any]]:
    """(event, data) of every dispatched event; comments (heartbeats) skipped."""
    events = []
    for block in text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines()
                      if line and not line.startswith(":"))
        if "data" in fields:
            events.append((fields.get("event", "message"), json.loads(fields["data"])))
    return events


async def read_all(response: Any, timeout: float = 10) -> list[tuple[str, Any]]:
    return parse(await asyncio.wait_for(response.text(), timeout))


async def next_event(response: Any, timeout: float = 10) -> tuple[str, Any]:
    """The next dispatched event (heartbeats skipped), read up to its end only."""
    while True:
        block = await asyncio.wait_for(response.content.readuntil(b"\n\n"), timeout)
        events = parse(block.decode())
        if events:
            return events[0]


async def test_stream_sends_the_ticket_then_the_approval_and_ends(client):
    alice = await login(client, "alice")
    ticket = await create_ticket(client, alice)
    bob = await step_up(client, await login(client, "bob"), "bob")
    response = await client.get(f"/api/v1/approvals/{ticket['id']}/events", headers=bearer(alice, **STREAM))
    assert response.status == 200
    assert response.headers["Content-Type"].startswith("text/event-stream")
    assert response.headers["Cache-Control"] == "no-store"
    assert response.headers["X-Correlation-ID"]
    kind, first = await next_event(response)
    assert kind == "ticket" and first["id"] == ticket["id"] and first["state"] == "pending"
    assert "nonce" not in first and first["reviews"] == []

    review = await client.post(f"/api/v1/approvals/{ticket['id']}/reviews",
                               json={"decision": "approve", "reason": "CHG-1"}, headers=bearer(bob))
    assert review.status == 200
    rest = await read_all(response)
    assert [kind for kind, _ in rest] == ["ticket", "end"]
    approved = rest[0][1]
    assert approved["state"] == "approved" and approved["reviews"][0]["reviewer"] == "bob"
    assert rest[1][1] == {"reason": "settled", "state": "approved"}


async def test_reject_and_revoke_end_the_stream(client):
    alice = await login(client, "alice")
    bob = await step_up(client, await login(client, "bob"), "bob")
    rejected, revoked = await create_ticket(client, alice), await create_ticket(client, alice)
    streams = [await client.get(f"/api/v1/approvals/{t['id']}/events", headers=bearer(alice, **STREAM))
               for t in (rejected, revoked)]
    for response in streams:
        assert (await next_event(response))[1]["state"] == "pending"
    assert (await client.post(f"/api/v1/approvals/{rejected['id']}/reviews",
                              json={"decision": "reject", "reason": "not now"},
                              headers=bearer(bob))).status == 200
    assert (await client.post(f"/api/v1/approvals/{revoked['id']}/revoke", json={},
                              headers=bearer(alice))).status == 200
    for response, state in zip(streams, ("rejected", "revoked"), strict=True):
        events = await read_all(response)
        assert [e[1].get("state") for e in events] == [state, state]
        assert events[-1] == ("end", {"reason": "settled", "state": state})


async def test_a_settled_ticket_is_sent_once_and_the_stream_ends(client):
    alice = await login(client, "alice")
    ticket = await create_ticket(client, alice)
    await client.post(f"/api/v1/approvals/{ticket['id']}/revoke", json={}, headers=bearer(alice))
    response = await client.get(f"/api/v1/approvals/{ticket['id']}/events", headers=bearer(alice, **STREAM))
    events = await read_all(response)
    assert [kind for kind, _ in events] == ["ticket", "end"] and events[0][1]["state"] == "revoked"


@pytest.fixture(params=["sqlite", "postgres"])
async def store_overrides(request: pytest.FixtureRequest) -> AsyncIterator[dict[str, Any]]:
    if request.param == "sqlite":
        yield {}
        return
    async with pg.temp_schema("cp_ticket_events") as (dsn, schema):
        yield {"store": {"backend": "postgres", "postgres": {"dsn": dsn, "schema": schema}}}


async def test_a_change_made_through_another_app_instance_shows(make_client, store_overrides):
    """Two app instances on one store, as two workers or replicas: the stream reads the store."""
    client = await make_client(store_overrides)
    other = TestClient(TestServer(create_app(client.server.app[CONFIG])))
    async with other:
        alice = await login(client, "alice")
        ticket = await create_ticket(client, alice)
        response = await client.get(f"/api/v1/approvals/{ticket['id']}/events",
                                    headers=bearer(alice, **STREAM))
        assert (await next_event(response))[1]["state"] == "pending"
        bob = await login(other, "bob")
        bob = await step_up(other, bob, "bob")
        review = await other.post(f"/api/v1/approvals/{ticket['id']}/reviews",
                                  json={"decision": "approve"}, headers=bearer(bob))
        assert review.status == 200
        events = await read_all(response)
        assert events[-1] == ("end", {"reason": "settled", "state": "approved"})
        assert events[0][1]["reviews"][0]["reviewer"] == "bob"
    await client.close()


async def test_without_event_stream_accept_the_current_ticket(client):
    alice = await login(client, "alice")
    ticket = await create_ticket(client, alice)
    response = await client.get(f"/api/v1/approvals/{ticket['id']}/events", headers=bearer(alice))
    assert response.status == 200
    body = await response.json()
    assert body["id"] == ticket["id"] and body["state"] == "pending" and "nonce" not in body


async def test_chain_refusals(client):
    alice = await login(client, "alice")
    ticket = await create_ticket(client, alice)
    path = f"/api/v1/approvals/{ticket['id']}/events"
    await assert_problem(await client.get(path, headers=STREAM), 401, "unauthenticated")
    missing = await client.get("/api/v1/approvals/tkt_" + "0" * 32 + "/events",
                               headers=bearer(alice, **STREAM))
    await assert_problem(missing, 404, "ticket_not_found")
    # Only principals the policy lets read approvals: agents may, an unknown role may not.
    agent = await login(client, "agent-7")
    assert (await client.get(path, headers=bearer(agent))).status == 200


async def test_streams_are_capped_and_give_their_slot_back(make_client):
    client = await make_client({"server": {"streams": {"max_per_principal": 1, "max_total": 5}}})
    alice = await login(client, "alice")
    ticket = await create_ticket(client, alice)
    path = f"/api/v1/approvals/{ticket['id']}/events"
    first = await client.get(path, headers=bearer(alice, **STREAM))
    assert first.status == 200
    over = await client.get(path, headers=bearer(alice, **STREAM))
    await assert_problem(over, 429, "too_many_streams")
    assert int(over.headers["Retry-After"]) >= 1
    first.close()
    for _ in range(40):
        if client.server.app[STREAMS].open_for("alice") == 0:
            break
        await asyncio.sleep(0.05)
    again = await client.get(path, headers=bearer(alice, **STREAM))
    assert again.status == 200
    again.close()


async def test_logout_ends_the_stream(make_client):
    client = await make_client({"server": {"streams": {"session_check_s": 0.2, "heartbeat_s": 0.3}}})
    alice = await login(client, "alice")
    ticket = await create_ticket(client, alice)
    response = await client.get(f"/api/v1/approvals/{ticket['id']}/events", headers=bearer(alice, **STREAM))
    await next_event(response)
    assert (await client.delete("/api/v1/authn/sessions/current", headers=bearer(alice))).status == 204
    text = await asyncio.wait_for(response.text(), 10)
    assert parse(text)[-1] == ("end", {"reason": "session_ended"})
