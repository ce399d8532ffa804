"""Security headers on every response, error responses included."""

from __future__ import annotations

from aiohttp import hdrs, web
from aiohttp.typedefs import Handler
from multidict import istr

_ALWAYS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    # The API serves JSON only: nothing may be framed, scripted or loaded from a response.
    "Content-Security-Policy": "default-src 'none'; frame-ancestors 'none'",
    "Cross-Origin-Resource-Policy": "same-origin",
}


#: Replaces aiohttp's default ``Server: Python/3.x aiohttp/3.x``: versions help nobody but an
#: attacker matching known vulnerabilities.
SERVER = "controlplane"


async def _server_header(request: web.Request, response: web.StreamResponse) -> None:
    # on_response_prepare runs for every response this app prepares (streamed, raised HTTP
    # errors and router 404s included); aiohttp only fills Server in when it is missing.
    response.headers["Server"] = SERVER


def setup_headers(app: web.Application) -> None:
    """Install the headers middleware (outside ``problems``, so problem responses get them too).

    Alone, without ``problems``, an HTTP error a handler raises passes this middleware as an
    exception: ``Server`` is then set as aiohttp prepares it (``on_response_prepare``). The
    service's request layers (``middleware.layers``) answer every exception themselves and need
    no signal: a receiver on it costs every response a coroutine (~4% of the authorized read).
    """
    app.on_response_prepare.append(_server_header)

    @web.middleware
    async def headers_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        """Add security headers; API responses are never cached (they may carry tokens)."""
        response = await handler(request)
        if not response.prepared:  # streamed responses set their headers before preparing
            apply_security_headers(request, response)
        return response

    app.middlewares.append(headers_middleware)


def edge_headers() -> dict[str, str]:
    """The headers of a response the HTTP edge writes before any middleware ran (a request
    head that could not be parsed or is over the limits): Server, security, no-store."""
    return {"Server": SERVER, **_ALWAYS, "Cache-Control": "no-store"}


#: ``_ALWAYS`` with its names as ``istr``: a case-insensitive multidict looks a plain ``str``
#: name up by folding its case first, every time (half the cost of these headers).
_ALWAYS_ISTR = tuple((istr(name), value) for name, value in _ALWAYS.items())


def apply_security_headers(request: web.Request, response: web.StreamResponse) -> None:
    """``Server: controlplane`` and the security headers on a response not prepared yet (the
    middleware's, and what handlers that prepare a streamed response themselves call: SSE);
    API responses are never cached (they may carry tokens)."""
    headers = response.headers
    headers[hdrs.SERVER] = SERVER  # aiohttp would name its and Python's versions
    setdefault = headers.setdefault  # (each header unless the response set its own)
    for name, value in _ALWAYS_ISTR:
        setdefault(name, value)
    if request.path.startswith("/api/"):
        headers[hdrs.CACHE_CONTROL] = "no-store"
