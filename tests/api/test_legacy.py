"""The legacy shell answers a structured migration problem and runs nothing."""

from __future__ import annotations

import pytest

from tests.problems import assert_problem


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param({"json": {"query": "DROP TABLE users"}}, id="sql"),
        pytest.param({"data": b"not json", "headers": {"Content-Type": "text/plain"}}, id="text"),
        pytest.param({}, id="no-body"),
    ],
)
async def test_aidb_query_is_legacy_only(client, kwargs):
    response = await client.post("/api/v1/aidb/query", **kwargs)
    body = await assert_problem(response, 410, "legacy_only")
    assert body["migration"]["replacement"]["databases"] == "/api/v1/databases"
    assert response.headers["Deprecation"].startswith("@")
    assert 'rel="successor-version"' in response.headers["Link"]


async def test_aidb_query_other_methods_are_405(client):
    response = await client.get("/api/v1/aidb/query")
    await assert_problem(response, 405, "method_not_allowed")
    assert response.headers["Allow"] == "POST"
