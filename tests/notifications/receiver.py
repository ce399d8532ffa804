"""A webhook receiver for the tests: a real aiohttp server on 127.0.0.1 that records what it
gets, can answer 500 a few times first, and notices one id delivered twice at once."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    status: int

    @property
    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Receiver:
    """``fail_first``: answer 500 to that many requests per path first; ``delay_s``: hold each
    request that long (so overlapping deliveries of one id would be seen)."""

    fail_first: int = 0
    delay_s: float = 0.0
    status: int = 200
    #: Answer 200 with a body that never ends (a sink must stop reading at its cap).
    endless: bool = False
    received: list[Received] = field(default_factory=list)
    in_flight: Counter[str] = field(default_factory=Counter)
    overlaps: list[str] = field(default_factory=list)
    _served: Counter[str] = field(default_factory=Counter)
    url: str = ""
    _runner: web.AppRunner | None = None
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    async def start(self) -> Receiver:
        app = web.Application()
        app.router.add_post("/{path:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        key = request.headers.get("webhook-id") or body.decode("utf-8", "replace")
        if self.in_flight[key]:
            self.overlaps.append(key)
        self.in_flight[key] += 1
        try:
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            self._served[request.path] += 1
            status = 500 if self._served[request.path] <= self.fail_first else self.status
            self.received.append(Received(request.path, dict(request.headers), body, status))
            self.arrived.set()
            if self.endless:
                return await self._endless(request)
            if 300 <= status < 400:
                raise web.HTTPFound("http://127.0.0.1:9/elsewhere")
            return web.Response(status=status, text="ok" if status < 300 else "no")
        finally:
            self.in_flight[key] -= 1

    async def _endless(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(status=200)
        await response.prepare(request)
        try:
            for _ in range(10_000):  # ~100 s at most, far past any sink timeout in the tests
                await response.write(b"x" * 65536)
                await asyncio.sleep(0.01)
        except (ConnectionResetError, ConnectionError):
            pass
        return response

    def accepted(self, path: str) -> list[Received]:
        return [r for r in self.received if r.path == path and 200 <= r.status < 300]

    async def wait_for(self, predicate: Any, timeout_s: float = 10.0) -> None:
        """Until ``predicate(self)`` holds (or fail after ``timeout_s``)."""
        async with asyncio.timeout(timeout_s):
            while not predicate(self):
                self.arrived.clear()
                with_timeout = asyncio.wait_for(self.arrived.wait(), 0.2)
                try:
                    await with_timeout
                except TimeoutError:
                    pass
