"""Security headers on every response, error responses included."""

from __future__ import annotations

from aiohttp import web
from aiohttp.typedefs import Handler

_ALWAYS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    # The API serves JSON only: nothing may be framed, scripted or loaded from a response.
    "Content-Security-Policy": "default-src 'none'; frame-ancestors 'none'",
    "Cross-Origin-Resource-Policy": "same-origin",
}


def setup_headers(app: web.Application) -> None:
    """Install the headers middleware (outside ``problems``, so problem responses get them too)."""

    @web.middleware
    async def headers_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        """Add security headers; API responses are never cached (they may carry tokens)."""
        response = await handler(request)
        if response.prepared:  # streamed responses set their headers before preparing
            return response
        for name, value in _ALWAYS.items():
            response.headers.setdefault(name, value)
        if request.path.startswith("/api/"):
            response.headers["Cache-Control"] = "no-store"
        return response

    app.middlewares.append(headers_middleware)


def apply_security_headers(request: web.Request, response: web.StreamResponse) -> None:
    """The same headers, for handlers that prepare a streamed response themselves (SSE)."""
    for name, value in _ALWAYS.items():
        response.headers.setdefault(name, value)
    if request.path.startswith("/api/"):
        response.headers["Cache-Control"] = "no-store"
