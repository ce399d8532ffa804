"""The headers middleware alone."""

from __future__ import annotations

import pytest
from aiohttp import web

from service.middleware.headers import setup_headers


async def _ok(request: web.Request) -> web.Response:
    return web.json_response({})


async def _stream(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse()
    await response.prepare(request)
    await response.write(b"x")
    return response


async def _raises(request: web.Request) -> web.Response:
    raise web.HTTPConflict()


@pytest.fixture
async def bare(aiohttp_client):
    app = web.Application()
    setup_headers(app)
    app.router.add_get("/api/v1/x", _ok)
    app.router.add_get("/healthz", _ok)
    app.router.add_get("/stream", _stream)
    app.router.add_get("/raises", _raises)
    return await aiohttp_client(app)


async def test_api_responses_are_not_cached_and_not_sniffed(bare):
    response = await bare.get("/api/v1/x")
    assert response.headers["Cache-Control"] == "no-store"
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert response.headers["X-Frame-Options"] == "DENY"


async def test_non_api_responses_get_security_headers_without_no_store(bare):
    response = await bare.get("/healthz")
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert "Cache-Control" not in response.headers


@pytest.mark.parametrize("path", ["/api/v1/x", "/healthz", "/stream", "/raises", "/no-such-route"])
async def test_server_header_names_no_versions(bare, path):
    response = await bare.get(path)
    await response.read()
    assert response.headers["Server"] == "controlplane"
    assert not any("aiohttp" in v or "Python" in v for v in response.headers.values())
