"""The request's store deadline: a request waits on the store ``store.timeout_s`` in all.

Its session check, its reads and writes and its audit record (also the record of a failure)
all come out of one budget (``service.deadline``), so a request is answered within one store
deadline of waiting even when the store stalls in the middle of it.
"""

from __future__ import annotations

from aiohttp import web
from aiohttp.typedefs import Handler

from .. import deadline
from ..config import CONFIG


def setup_deadline(app: web.Application) -> None:
    """Install the deadline middleware (outer: every store call of the request is inside it)."""

    @web.middleware
    async def deadline_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        """Give the request one store deadline for all its store calls."""
        budget = deadline.begin(request.app[CONFIG].store.timeout_s)
        try:
            return await handler(request)
        finally:
            deadline.end(budget)

    app.middlewares.append(deadline_middleware)
