"""A run that presents a ticket on PostgreSQL reads its session with the ticket and its task
(``middleware.authn.confirm``, ``Store.get_run_read``): one statement where two were. The
answers must be the ones the session check in the middleware gives (SQLite still checks it
there): the same 401 for a session that is not live, a 401 before a 400 for a bad body, the
same principal in the audit record, and nothing consumed by a refused run."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from tests.auth import bearer, login, step_up
from tests.problems import assert_problem
from tests.tickets import approved_ticket as approved_app_ticket
from tests.tickets import audit_entries, installer_body, ticket_headers


@pytest.fixture
def client(client_on_each_store: TestClient) -> TestClient:
    return client_on_each_store


async def _ticket_state(client: TestClient, ticket: dict[str, Any]) -> str:
    bob = await login(client, "bob")
    response = await client.get(f"/api/v1/approvals/{ticket['id']}", headers=bearer(bob))
    assert response.status == 200, await response.text()
    return str((await response.json())["state"])


async def test_a_run_with_a_ticket_is_recorded_for_its_caller(client):
    alice = await step_up(client, await login(client, "alice"), "alice")
    ticket = await approved_app_ticket(client, alice)
    response = await client.post("/api/v1/installer/actions", json=installer_body(),
                                 headers=ticket_headers(alice, ticket))
    assert response.status == 202, await response.text()
    entry = (await audit_entries(client))[-1]
    assert entry["action"] == "installer.run.execute" and entry["outcome"] == "executed"
    assert entry["principal"]["subject_id"] == "alice"
    assert entry["principal"]["kind"] == "human"
    assert entry["ticket_consumed"] is True
    assert await _ticket_state(client, ticket) == "consumed"


async def test_a_revoked_session_presenting_a_ticket_is_refused_and_consumes_nothing(client):
    alice = await step_up(client, await login(client, "alice"), "alice")
    ticket = await approved_app_ticket(client, alice)
    assert (await client.delete("/api/v1/authn/sessions/current",
                                headers=bearer(alice))).status == 204
    response = await client.post("/api/v1/installer/actions", json=installer_body(),
                                 headers=ticket_headers(alice, ticket))
    await assert_problem(response, 401, "session_revoked")
    entry = (await audit_entries(client))[-1]
    assert entry["action"] == "installer.run.execute" and entry["status"] == 401
    assert entry["principal"]["subject_id"] is None  # anonymous, as the middleware leaves it
    assert "ticket_consumed" not in entry
    assert await _ticket_state(client, ticket) == "approved"


@pytest.mark.parametrize(("body", "status"), [(b"{not json", 400), (b'{"task_id": 5}', 422)],
                         ids=["malformed", "invalid"])
async def test_a_bad_body_is_a_401_for_a_revoked_session_and_a_4xx_for_a_live_one(
        client, body, status):
    alice = await step_up(client, await login(client, "alice"), "alice")
    ticket = await approved_app_ticket(client, alice)
    headers = ticket_headers(alice, ticket, **{"Content-Type": "application/json"})
    live = await client.post("/api/v1/installer/actions", data=body, headers=headers)
    assert live.status == status, await live.text()
    entry = (await audit_entries(client))[-1]
    assert entry["status"] == status and entry["principal"]["subject_id"] == "alice"
    assert (await client.delete("/api/v1/authn/sessions/current",
                                headers=bearer(alice))).status == 204
    revoked = await client.post("/api/v1/installer/actions", data=body, headers=headers)
    await assert_problem(revoked, 401, "session_revoked")
    assert await _ticket_state(client, ticket) == "approved"


async def test_an_unknown_ticket_is_a_binding_mismatch_not_an_oracle(client):
    alice = await step_up(client, await login(client, "alice"), "alice")
    ticket = {"id": "tkt_" + "0" * 32, "nonce": "n" * 32}
    response = await client.post("/api/v1/installer/actions", json=installer_body(),
                                 headers=ticket_headers(alice, ticket))
    await assert_problem(response, 403, "ticket_binding_mismatch")


async def test_a_ticket_without_a_fresh_step_up_asks_for_one(client):
    alice = await login(client, "alice")
    stepped = await step_up(client, await login(client, "alice"), "alice")
    ticket = await approved_app_ticket(client, stepped)
    response = await client.post("/api/v1/installer/actions", json=installer_body(),
                                 headers=ticket_headers(alice, ticket))
    assert response.status == 401, await response.text()
    assert "insufficient_user_authentication" in response.headers["WWW-Authenticate"]
    assert await _ticket_state(client, ticket) == "approved"
