"""``Server: controlplane`` on every kind of response the service prepares, set by its request
layers (``apply_security_headers``) rather than an ``on_response_prepare`` receiver: never
aiohttp's default, which names aiohttp's and Python's versions."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from service.app import create_app
from tests.auth import bearer, login
from tests.servers import EdgeTestServer


def assert_server_header(response: Any) -> None:
    assert response.headers["Server"] == "controlplane", response.headers
    assert not any("aiohttp" in v or "Python" in v for v in response.headers.values())


@pytest.mark.parametrize(("method", "path", "status"), [
    ("GET", "/api/v1/system/info", 200),        # a public route
    ("GET", "/healthz", 200),
    ("GET", "/api/v1/databases", 401),          # the chain's problem
    ("GET", "/no-such-route", 404),             # the router's
    ("DELETE", "/api/v1/system/info", 405),
    ("GET", "/console/login", 200),             # a console page
])
async def test_every_kind_of_response_names_no_versions(client, method, path, status):
    response = await client.request(method, path)
    await response.read()
    assert response.status == status
    assert_server_header(response)


async def test_a_malformed_body_and_an_authorized_read_name_no_versions(client):
    token = await login(client, "alice")
    response = await client.post("/api/v1/approvals", data=b"{not json",
                                 headers=bearer(token, **{"Content-Type": "application/json"}))
    assert response.status == 400
    assert_server_header(response)
    response = await client.get("/api/v1/databases", headers=bearer(token))
    assert response.status == 200
    assert_server_header(response)


async def test_a_stream_names_no_versions(client):
    """A live stream is prepared by its handler, before the layers see it."""
    alice = await login(client, "alice")
    created = await client.post("/api/v1/approvals", headers=bearer(alice), json={
        "subject_id": "alice", "env": "prod", "action": "installer.run.execute",
        "resource": {"app": "web", "version": "1.2.3"}})
    assert created.status == 201, await created.text()
    ticket = (await created.json())["id"]
    response = await client.get(f"/api/v1/approvals/{ticket}/events",
                                headers=bearer(alice, Accept="text/event-stream"))
    try:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/event-stream")
        assert_server_header(response)
        await asyncio.wait_for(response.content.readuntil(b"\n\n"), 10)  # it is live
    finally:
        response.close()


async def test_a_raised_redirect_names_no_versions(make_config):
    """The layers let a redirect through as the exception it is (not a problem): its headers
    are set on it before it goes. (No route of the service redirects today; one that did would
    get them.) Served without the contract check: the route is not in the OpenAPI document."""

    async def moved(request: web.Request) -> web.Response:
        raise web.HTTPFound("/api/v1/system/info")

    app = create_app(make_config())
    app.router.add_get("/moved", moved)
    async with TestClient(EdgeTestServer(app)) as client:
        response = await client.get("/moved", allow_redirects=False)
        assert response.status == 302
        assert response.headers["Location"] == "/api/v1/system/info"
        assert_server_header(response)
        assert response.headers["X-Content-Type-Options"] == "nosniff"
