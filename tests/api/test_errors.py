"""Each error class through the real application: 400/404/405/413/415/422/500, nothing leaked."""

from __future__ import annotations

import pytest
from aiohttp import web

from service.app import create_app
from service.body import read_json
from tests.problems import assert_problem


async def test_unknown_route_is_404(client):
    await assert_problem(await client.get("/api/v1/no-such-thing"), 404, "not_found")


async def test_wrong_method_is_405_with_allow(client):
    response = await client.delete("/api/v1/system/info")
    await assert_problem(response, 405, "method_not_allowed")
    assert "GET" in response.headers["Allow"]


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH"])
@pytest.mark.parametrize("path", ["/api/v1/databases", "/api/v1/storage/objects"])
async def test_inventory_is_read_only(client, method, path):
    response = await client.request(method, path, json={"name": "x"})
    await assert_problem(response, 405, "method_not_allowed")


# A throw-away route on the real app exercises the body reader and the error mapping
# without depending on any one endpoint's schema.
async def _echo_config_shaped(request: web.Request) -> web.Response:
    return web.json_response(await read_json(request, "config.schema.json"))


async def _crash(request: web.Request) -> web.Response:
    raise KeyError("internal detail /work/secret/path")


@pytest.fixture
async def probe(aiohttp_client, make_config):
    app = create_app(make_config({"server": {"max_body_bytes": 4096}}))
    app.router.add_post("/api/v1/_probe", _echo_config_shaped)
    app.router.add_get("/api/v1/_crash", _crash)
    return await aiohttp_client(app)


async def test_malformed_json_is_400(probe):
    response = await probe.post(
        "/api/v1/_probe", data=b'{"server": ', headers={"Content-Type": "application/json"}
    )
    await assert_problem(response, 400, "malformed_json")


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(b"", id="empty"),
        pytest.param(b"\xff\xfe{}", id="not-utf8"),
        pytest.param(b'{"mode": NaN}', id="nan"),
        pytest.param(b'{"mode": "embedded", "mode": "production"}', id="duplicate-key"),
    ],
)
async def test_other_bad_json_is_400(probe, raw):
    response = await probe.post(
        "/api/v1/_probe", data=raw, headers={"Content-Type": "application/json"}
    )
    await assert_problem(response, 400, "malformed_json")


async def test_deep_nesting_is_422_too_deep(probe):
    response = await probe.post(
        "/api/v1/_probe", data=b"[" * 1800 + b"]" * 1800,
        headers={"Content-Type": "application/json"},
    )
    await assert_problem(response, 422, "too_deep")


async def test_wrong_content_type_is_415(probe):
    response = await probe.post(
        "/api/v1/_probe", data=b"mode=embedded", headers={"Content-Type": "text/plain"}
    )
    await assert_problem(response, 415, "unsupported_media_type")


async def test_body_over_limit_is_413(probe):
    response = await probe.post(
        "/api/v1/_probe",
        data=b'{"state_dir": "' + b"x" * 10_000 + b'"}',
        headers={"Content-Type": "application/json"},
    )
    await assert_problem(response, 413, "payload_too_large")


async def test_schema_failure_is_422_with_json_pointers(probe):
    response = await probe.post(
        "/api/v1/_probe",
        json={"server": {"port": "eighty", "bogus": True}, "inventory": {"databases": [{}]}},
    )
    body = await assert_problem(response, 422, "schema_validation_failed")
    pointers = {e["pointer"] for e in body["errors"]}
    assert {"/server/port", "/server", "/inventory/databases/0"} <= pointers
    # The offending values are described, not echoed.
    assert "eighty" not in await response.text()


async def test_valid_body_passes(probe):
    response = await probe.post("/api/v1/_probe", json={"mode": "embedded"})
    assert response.status == 200
    assert await response.json() == {"mode": "embedded"}


async def test_unexpected_exception_is_500_with_only_the_correlation_id(probe):
    response = await probe.get("/api/v1/_crash", headers={"X-Correlation-ID": "crash-1"})
    body = await assert_problem(response, 500, "internal_error")
    assert body["correlation_id"] == "crash-1"
    assert "KeyError" not in await response.text()
    assert "secret" not in await response.text()


async def test_every_response_echoes_correlation_id(client):
    for path in ("/api/v1/system/info", "/api/v1/nothing", "/healthz"):
        response = await client.get(path, headers={"X-Correlation-ID": "walk-1"})
        assert response.headers["X-Correlation-ID"] == "walk-1"
