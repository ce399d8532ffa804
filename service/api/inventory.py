"""Read-only visibility of databases and object storage, from the configured inventory.

No query, no connection, no upload or delete, no provider control: these handlers only echo
what operators declared in ``inventory.*``, minus credential references.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ..keys import CONFIG

routes = web.RouteTableDef()


def _listing(items: Any) -> dict[str, Any]:
    if items is None:
        return {"status": "placeholder", "items": []}
    return {"status": "ready", "items": [item.public() for item in items]}


@routes.get("/api/v1/databases")
async def list_databases(request: web.Request) -> web.Response:
    """The database inventory (``placeholder`` + ``[]`` when none is configured)."""
    return web.json_response(_listing(request.app[CONFIG].inventory.databases))


@routes.get("/api/v1/storage/objects")
async def list_storage(request: web.Request) -> web.Response:
    """The object-storage inventory (``placeholder`` + ``[]`` when none is configured)."""
    return web.json_response(_listing(request.app[CONFIG].inventory.storage))
