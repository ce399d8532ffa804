"""Read-only visibility of databases and object storage, from the configured inventory.

No query, no connection, no upload or delete, no provider control: these handlers only echo
what operators declared in ``inventory.*``, minus credential references. Both run the chain
(``databases.list`` / ``storage.list``); an ``env`` query parameter narrows the listing and is
what the policy decides on, otherwise the listing spans every environment and is decided as
the strictest one.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ..chain import Outcome, Run, Target, protected
from ..config import CONFIG
from .queries import query_str

routes = web.RouteTableDef()

_ENV = r"[a-z][a-z0-9-]{0,31}"


def _target(collection: str) -> Any:
    async def target(request: web.Request, body: Any) -> Target:
        env = query_str(request, "env", pattern=_ENV)
        return Target.collection(collection, env or request.app[CONFIG].environments.strictest())

    return target


def _listing(items: Any, env: str | None) -> dict[str, Any]:
    if items is None:
        return {"status": "placeholder", "items": []}
    return {"status": "ready",
            "items": [item.public() for item in items if env is None or item.env == env]}


@routes.get("/api/v1/databases")
@protected("databases.list", target=_target("databases"))
async def list_databases(run: Run) -> Outcome:
    """The database inventory (``placeholder`` + ``[]`` when none is configured)."""
    env = query_str(run.request, "env", pattern=_ENV)
    return Outcome(200, _listing(run.config.inventory.databases, env))


@routes.get("/api/v1/storage/objects")
@protected("storage.list", target=_target("storage"))
async def list_storage(run: Run) -> Outcome:
    """The object-storage inventory (``placeholder`` + ``[]`` when none is configured)."""
    env = query_str(run.request, "env", pattern=_ENV)
    return Outcome(200, _listing(run.config.inventory.storage, env))
