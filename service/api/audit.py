"""The audit log, read-only and paged (``audit.read``: admins in the shipped policy)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ..appkeys import CONFIG
from ..chain import Outcome, Run, Target, protected
from .queries import query_int

routes = web.RouteTableDef()


async def _target(request: web.Request, body: Any) -> Target:
    return Target(resource={"collection": "audit"}, env=request.app[CONFIG].environments.strictest())


@routes.get("/api/v1/audit/records")
@protected("audit.read", target=_target)
async def audit_records(run: Run) -> Outcome:
    """Records after ``after_seq`` (ascending), at most ``limit``."""
    request = run.request
    after = query_int(request, "after_seq", default=0, low=0, high=10**12)
    limit = query_int(request, "limit", default=100, low=1, high=1000)
    records = await run.store.audit_range(after_seq=after, limit=limit)
    items = [{"seq": r.seq, "prev_hash": r.prev_hash, "hash": r.hash, **r.entry} for r in records]
    return Outcome(200, {
        "items": items,
        "next_after_seq": records[-1].seq if len(records) == limit else None,
    })
