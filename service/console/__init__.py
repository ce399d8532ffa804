"""The web console for approvers and requesters (``/console/``): server-rendered pages, one
small script, a cookie session bound to the store session, CSRF on every form, a strict CSP."""

from __future__ import annotations

from aiohttp import web

from .views import routes

__all__ = ["setup_console"]


def setup_console(app: web.Application) -> None:
    """Add the console's routes (and ``GET /``, which redirects to it)."""
    app.router.add_routes(routes)
