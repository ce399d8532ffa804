"""Correlation ids: accept a well-formed ``X-Correlation-ID`` or make one; echo it on every response."""

from __future__ import annotations

import re
import uuid

from aiohttp import web
from aiohttp.typedefs import Handler

from ..appkeys import CORRELATION_ID
from ..logs import correlation_id_var

HEADER = "X-Correlation-ID"
_VALID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def correlation_id_for(value: str | None) -> str:
    """The caller's id when well-formed (<= 128 chars of ``[A-Za-z0-9._:-]``), else a new UUID4."""
    if value is not None and _VALID.fullmatch(value):
        return value
    return str(uuid.uuid4())


def setup_correlation(app: web.Application) -> None:
    """Install the correlation middleware (outermost: everything inside may log with the id)."""

    @web.middleware
    async def correlation_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        """Attach the correlation id to the request, the logging context and the response."""
        cid = correlation_id_for(request.headers.get(HEADER))
        request[CORRELATION_ID] = cid
        token = correlation_id_var.set(cid)
        try:
            response = await handler(request)
        finally:
            correlation_id_var.reset(token)
        if not response.prepared:
            response.headers[HEADER] = cid
        return response

    app.middlewares.append(correlation_middleware)
