"""Read-only inventory: placeholder without configuration, ready with it, no credentials out."""

from __future__ import annotations

import pytest

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
    response = await client.get(path)
    assert response.status == 200
    assert await response.json() == {"status": "placeholder", "items": []}


async def test_databases_ready_with_inventory(make_client):
    client = await make_client(INVENTORY)
    body = await (await client.get("/api/v1/databases")).json()
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
    response = await client.get("/api/v1/storage/objects")
    body = await response.json()
    assert body["status"] == "ready"
    assert [item["name"] for item in body["items"]] == ["artifacts"]
    text = await response.text()
    assert "vault" not in text and "s3.internal" not in text and "credentials" not in text
