"""The chain vouches for the members it writes into a run's entry (``recording.OWN``), so
``record.prepare`` copies them without walking them. Against the real app, on both stores:
every record a run writes is prepared exactly as the full walk prepares it (the same entry,
text and canonical verdict), for runs that read, mutate, redeem a ticket, are refused or fail
on their input; what the Execute step adds is still walked."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from service.audit import log as audit_log
from service.audit.record import prepare
from service.audit.recording import OWN
from service.redaction import is_secret_field
from service.store.base import CheckedEntry
from tests.auth import bearer, login, step_up
from tests.tickets import approved_ticket, installer_body, ticket_headers


@pytest.fixture
def client(client_on_each_store: TestClient) -> TestClient:
    return client_on_each_store


def test_no_member_the_chain_vouches_for_names_a_secret():
    assert not [name for name in OWN if is_secret_field(name)]


async def test_every_run_is_prepared_as_the_full_walk_prepares_it(client, monkeypatch):
    prepared: list[tuple[frozenset[str], dict[str, Any]]] = []

    def checked(entry: dict[str, Any], known: Any = frozenset()) -> dict[str, Any]:
        copied, walked = prepare(entry, known), prepare(entry)
        assert type(copied) is type(walked) and copied == walked, entry
        assert list(copied) == list(walked)
        if type(walked) is CheckedEntry:
            assert (copied.text, copied.canonical) == (walked.text, walked.canonical), entry
        if known:
            prepared.append((frozenset(known), dict(copied)))
        return copied

    monkeypatch.setattr(audit_log, "prepare", checked)
    carol, alice = await login(client, "carol"), await login(client, "alice")
    assert (await client.get("/api/v1/databases", headers=bearer(carol))).status == 200
    assert (await client.get("/api/v1/databases?env=dev", headers=bearer(carol))).status == 200
    assert (await client.get("/api/v1/databases")).status == 401
    assert (await client.post("/api/v1/approvals", json={
        "subject_id": "carol", "env": "prod", "action": "installer.run.execute",
        "resource": {"app": "web"}}, headers=bearer(carol))).status == 403
    alice = await step_up(client, alice, "alice")
    ticket = await approved_ticket(client, alice)  # a mutation whose Execute step adds members
    response = await client.post("/api/v1/installer/actions", json=installer_body(),
                                 headers=ticket_headers(alice, ticket))
    assert response.status == 202, await response.text()
    response = await client.post("/api/v1/installer/actions", data=b"{not json",
                                 headers=bearer(alice, **{"Content-Type": "application/json"}))
    assert response.status == 400

    assert prepared, "no run passed the members it vouches for"
    executed = [entry for _, entry in prepared if entry.get("outcome") == "executed"]
    assert any(entry.get("ticket_consumed") for entry in executed)
    # The Execute step's own members were walked, never vouched for.
    added = [(known, entry) for known, entry in prepared if set(entry) - OWN]
    assert added and all(known <= OWN for known, _ in added)
