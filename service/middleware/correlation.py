"""Correlation ids: accept a well-formed ``X-Correlation-ID`` or make one; echo it on every response."""

from __future__ import annotations

import os
import re

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
    return new_uuid4()


#: Random bytes for ids, read from the OS 4 KiB at a time (a getrandom call per request was
#: ~1 us of it); emptied in a forked child, which must not repeat its parent's ids. Called on
#: the event loop's thread only (the request layers).
_POOL_BYTES = 4096


class _Pool:
    __slots__ = ("buf", "used")

    def __init__(self) -> None:
        self.empty()

    def empty(self) -> None:
        self.buf, self.used = b"", 0


_pool = _Pool()


def _random16() -> bytes:
    pool = _pool
    used = pool.used
    if used + 16 > len(pool.buf):
        pool.buf, used = os.urandom(_POOL_BYTES), 0
    pool.used = used + 16
    return pool.buf[used:used + 16]


os.register_at_fork(after_in_child=_pool.empty)


def new_uuid4() -> str:
    """``str(uuid.uuid4())``, formatted without the ``UUID`` object (a third of its cost; one
    per request that brings no id): 122 random bits, the version and variant bits set."""
    raw = bytearray(_random16())
    raw[6] = (raw[6] & 0x0F) | 0x40  # version 4
    raw[8] = (raw[8] & 0x3F) | 0x80  # the RFC 4122 variant
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


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
