"""Collects every module's routes into the application (the route table lives here, in one list)."""

from __future__ import annotations

from aiohttp import web

from . import inventory, legacy, system

_MODULES = (system, inventory, legacy)


def add_routes(app: web.Application) -> None:
    """Register every API module's ``RouteTableDef``."""
    for module in _MODULES:
        app.router.add_routes(module.routes)
