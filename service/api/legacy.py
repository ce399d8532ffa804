"""The legacy shell ``POST /api/v1/aidb/query``: a structured migration answer, never a 501.

It runs nothing whatever the body says, and does not even read the body.
"""

from __future__ import annotations

from aiohttp import web

from ..chain import public
from ..errors import LegacyOnly

routes = web.RouteTableDef()

# RFC 9745 Deprecation (a structured date: when the endpoint became deprecated) and RFC 8288 links.
DEPRECATED_SINCE = "@1767225600"  # 2026-01-01T00:00:00Z
MIGRATION = {
    "status": "legacy_only",
    "replacement": {
        "databases": "/api/v1/databases",
        "storage": "/api/v1/storage/objects",
        "description": "/api/v1/openapi.json",
    },
    "note": (
        "Free-form database queries are not part of the control plane. Database visibility is "
        "read-only inventory; data access goes through each database's own tooling under "
        "its own access controls."
    ),
}


@routes.post("/api/v1/aidb/query")
@public
async def aidb_query(request: web.Request) -> web.Response:
    """Always 410 ``legacy_only`` with a ``migration`` object and deprecation headers."""
    raise LegacyOnly(
        "this legacy endpoint executes nothing; use the replacement surfaces named in 'migration'",
        migration=MIGRATION,
        headers={
            "Deprecation": DEPRECATED_SINCE,
            "Link": '</api/v1/databases>; rel="successor-version", '
            '</api/v1/openapi.json>; rel="service-desc"',
        },
    )
