"""Collects every module's routes into the application (the route table lives here, in one list).

Every route is either ``@protected`` (it runs the chain with a catalogue action) or ``@public``
(status, health, AuthN self-service, JWKS, the legacy shell); a test walks the table and fails
on a route that is neither.
"""

from __future__ import annotations

from aiohttp import web

from . import (
    approval_events,
    approvals,
    audit,
    authn,
    compose,
    federation,
    installer,
    inventory,
    legacy,
    openapi,
    policy_revisions,
    system,
    tasks,
)

_MODULES = (
    system,
    authn,
    federation,
    approvals,
    approval_events,
    installer,
    tasks,
    audit,
    compose,
    inventory,
    legacy,
    policy_revisions,
    openapi,
)


def add_routes(app: web.Application) -> None:
    """Register every API module's ``RouteTableDef``."""
    for module in _MODULES:
        app.router.add_routes(module.routes)
