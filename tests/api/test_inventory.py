"""Read-only inventory: placeholder without configuration, ready with it, no credentials out."""

from __future__ import annotations

import pytest

from tests.auth import bearer, login
from tests.problems import assert_problem

INVENTORY = {
    "inventory": {
        "databases": [
            {
                "name": "orders",
                "engine": "postgresql",
                "env": "prod",
                "region": "eu-west-1",
                "description": "order service primary",
                "tags": {"team": "payments"},
                "credentials_ref": "vault:secret/data/orders",
                "dsn": "postgresql://orders:pw-orders-123@orders-db/orders",
            }
        ],
        "storage": [
            {
                "name": "artifacts",
                "provider": "s3",
                "env": "dev",
                "credentials_ref": {"vault": "secret/data/s3"},
                "endpoint": "https://s3.internal",
            }
        ],
    }
}


@pytest.mark.parametrize("path", ["/api/v1/databases", "/api/v1/storage/objects"])
async def test_placeholder_without_inventory(client, path):
    token = await login(client, "carol")
    response = await client.get(path, headers=bearer(token))
    assert response.status == 200
    assert await response.json() == {"status": "placeholder", "items": []}


@pytest.mark.parametrize("path", ["/api/v1/databases", "/api/v1/storage/objects"])
async def test_inventory_needs_a_caller(client, path):
    await assert_problem(await client.get(path), 401, "unauthenticated")


@pytest.mark.parametrize("subject", ["carol", "alice", "ci-bot", "agent-7"])
async def test_every_dev_identity_may_list(make_client, subject):
    client = await make_client(INVENTORY)
    token = await login(client, subject)
    body = await (await client.get("/api/v1/databases", headers=bearer(token))).json()
    assert body["status"] == "ready"


async def test_env_filter_narrows_the_listing(make_client):
    client = await make_client(INVENTORY)
    token = await login(client, "carol")
    body = await (await client.get("/api/v1/databases?env=dev", headers=bearer(token))).json()
    assert body == {"status": "ready", "items": []}
    response = await client.get("/api/v1/databases?env=NOT%20AN%20ENV", headers=bearer(token))
    await assert_problem(response, 422, "invalid_query")


async def test_databases_ready_with_inventory(make_client):
    client = await make_client(INVENTORY)
    token = await login(client, "carol")
    body = await (await client.get("/api/v1/databases", headers=bearer(token))).json()
    assert body["status"] == "ready"
    assert body["items"] == [
        {
            "name": "orders",
            "engine": "postgresql",
            "env": "prod",
            "region": "eu-west-1",
            "description": "order service primary",
            "tags": {"team": "payments"},
        }
    ]


async def test_storage_ready_with_inventory_and_no_credentials(make_client):
    client = await make_client(INVENTORY)
    token = await login(client, "carol")
    response = await client.get("/api/v1/storage/objects", headers=bearer(token))
    body = await response.json()
    assert body["status"] == "ready"
    assert [item["name"] for item in body["items"]] == ["artifacts"]
    text = await response.text()
    assert "vault" not in text and "s3.internal" not in text and "credentials" not in text
