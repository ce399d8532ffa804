"""Raw HTTP/1.1 on a socket, for what a well-behaved client cannot send (a broken ``Authorization``
header, a head that never completes): send bytes, read the answer until close, parse it, and check
a problem answer in its raw form."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp.test_utils import TestServer

# A JWS-shaped fake access token; what follows the break must never be seen again.
TOKEN = "eyJhbGciOiJFZERTQSIsImtpZCI6ImsxIn0.eyJzdWIiOiJhbGljZSIsInNpZCI6IngifQ.c2lnbmF0dXJlLXNlY3JldA"
TAIL = TOKEN[40:]



async def exchange(server: TestServer, data: bytes, timeout: float = 10) -> bytes:
    """Send ``data`` on a fresh connection; everything the server answers until it closes."""
    reader, writer = await asyncio.open_connection(server.host, server.port)
    writer.write(data)
    await writer.drain()
    try:
        return await asyncio.wait_for(reader.read(), timeout)
    finally:
        writer.close()


def parse(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(lines[0].split()[1]), headers, body


def assert_problem(raw: bytes, status: int, code: str) -> dict[str, Any]:
    got, headers, body = parse(raw)
    assert got == status, raw[:300]
    assert headers["content-type"].startswith("application/problem+json")
    assert headers["server"] == "controlplane"
    assert headers["x-content-type-options"] == "nosniff"
    doc: dict[str, Any] = json.loads(body)
    assert doc["status"] == status and doc["code"] == code
    assert doc["correlation_id"] == headers["x-correlation-id"]
    return doc


def broken_authorization(sep: bytes) -> bytes:
    return (b"GET /api/v1/authn/sessions/current HTTP/1.1\r\nHost: x\r\n"
            b"Authorization: Bearer " + TOKEN[:40].encode() + sep + TAIL.encode() + b"\r\n\r\n")
