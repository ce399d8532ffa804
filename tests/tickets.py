"""Going through the chain in app tests: the installer request, its approval-ticket headers, an
approved ticket (requested by the caller's token, approved by bob stepped up) and the audit log's
entries read straight from the store."""

from __future__ import annotations

from typing import Any

from service.approvals.command import command_hash
from service.storelink import STORE
from tests.auth import bearer, login, step_up

RESOURCE = {"app": "web", "version": "1.2.3"}


def installer_body(env: str = "prod", task_id: str = "task-1", resource: Any = None) -> dict[str, Any]:
    return {"task_id": task_id, "action": "installer.run.execute",
            "resource": RESOURCE if resource is None else resource, "env": env}


def ticket_headers(token: str, ticket: dict[str, Any], **extra: str) -> dict[str, str]:
    return bearer(token, **{"Approval-Ticket": ticket["id"], "Approval-Nonce": ticket["nonce"]},
                  **extra)


async def audit_entries(client) -> list[dict[str, Any]]:
    store = client.server.app[STORE].require()
    return [r.entry for r in await store.audit_range(0, 1000)]


async def approved_ticket(client, requester_token: str, *, subject: str = "alice",
                          env: str = "prod", resource: Any = None,
                          command: str | None = None) -> dict[str, Any]:
    """Create a ticket as the requester and have bob (stepped up) approve it."""
    body: dict[str, Any] = {"subject_id": subject, "env": env, "action": "installer.run.execute",
                            "resource": RESOURCE if resource is None else resource,
                            "reason": "release 1.2.3"}
    if command is not None:
        body["command_hash"] = command_hash(command)
    response = await client.post("/api/v1/approvals", json=body, headers=bearer(requester_token))
    assert response.status == 201, await response.text()
    ticket = await response.json()
    bob = await step_up(client, await login(client, "bob"), "bob")
    review = await client.post(f"/api/v1/approvals/{ticket['id']}/reviews",
                               json={"decision": "approve"}, headers=bearer(bob))
    assert review.status == 200, await review.text()
    assert (await review.json())["state"] == "approved"
    return ticket
