"""The headers middleware alone."""

from __future__ import annotations

import pytest
from aiohttp import web

from service.middleware.headers import setup_headers


async def _ok(request: web.Request) -> web.Response:
    return web.json_response({})


@pytest.fixture
async def bare(aiohttp_client):
    app = web.Application()
    setup_headers(app)
    app.router.add_get("/api/v1/x", _ok)
    app.router.add_get("/healthz", _ok)
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
