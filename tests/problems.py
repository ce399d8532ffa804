"""Assertions shared by HTTP tests: every error is a complete RFC 9457 problem."""

from __future__ import annotations

from typing import Any

from aiohttp import ClientResponse

PROBLEM_FIELDS = {"type", "title", "status", "detail", "code", "correlation_id"}


async def assert_problem(response: ClientResponse, status: int, code: str) -> dict[str, Any]:
    """The response is problem+json with ``status`` and ``code``, and echoes the correlation id."""
    assert response.status == status, await response.text()
    assert response.content_type == "application/problem+json"
    body = await response.json(content_type=None)
    assert PROBLEM_FIELDS <= body.keys(), body
    assert body["status"] == status
    assert body["code"] == code, body
    assert body["type"].endswith(code)
    assert body["correlation_id"] == response.headers["X-Correlation-ID"]
    for marker in ("Traceback", 'File "', "/work/", "site-packages"):
        assert marker not in await response.text()
    return body
