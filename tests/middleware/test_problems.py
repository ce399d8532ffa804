"""The problems middleware alone: every exception becomes problem+json, never a trace."""

from __future__ import annotations

import pytest
from aiohttp import web

from service.errors import Conflict, TooManyRequests
from service.middleware.correlation import setup_correlation
from service.middleware.problems import setup_problems
from tests.problems import assert_problem


async def _boom(request: web.Request) -> web.Response:
    raise RuntimeError("secret-dsn postgresql://u:hunter2@db/x in a traceback")


async def _conflict(request: web.Request) -> web.Response:
    raise Conflict("ticket already consumed", code="ticket_consumed")


async def _throttled(request: web.Request) -> web.Response:
    raise TooManyRequests(7)


async def _redirect(request: web.Request) -> web.Response:
    raise web.HTTPFound("/elsewhere")


@pytest.fixture
async def bare(aiohttp_client):
    app = web.Application()
    setup_correlation(app)
    setup_problems(app)
    app.router.add_get("/boom", _boom)
    app.router.add_get("/conflict", _conflict)
    app.router.add_get("/throttled", _throttled)
    app.router.add_get("/redirect", _redirect)
    return await aiohttp_client(app)


async def test_unexpected_exception_is_an_opaque_500(bare, caplog):
    response = await bare.get("/boom")
    body = await assert_problem(response, 500, "internal_error")
    text = await response.text()
    assert "hunter2" not in text and "RuntimeError" not in text
    assert body["correlation_id"]
    # The trace is in our own log, tagged with the correlation id.
    assert any(r.exc_info for r in caplog.records)


async def test_problem_subclass_keeps_status_and_instance_code(bare):
    await assert_problem(await bare.get("/conflict"), 409, "ticket_consumed")


async def test_rate_limit_carries_retry_after(bare):
    response = await bare.get("/throttled")
    await assert_problem(response, 429, "rate_limited")
    assert response.headers["Retry-After"] == "7"


async def test_redirects_are_not_errors(bare):
    response = await bare.get("/redirect", allow_redirects=False)
    assert response.status == 302
