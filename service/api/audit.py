"""The audit log and its signed checkpoints, read-only and paged (``audit.read``: admins in the
shipped policy)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ..audit.checkpoint import to_doc
from ..chain import Outcome, Run, Target, protected
from ..config import CONFIG
from .queries import query_int, query_page_limit

routes = web.RouteTableDef()


async def _target(request: web.Request, body: Any) -> Target:
    return Target.collection("audit", request.app[CONFIG].environments.strictest())


@routes.get("/api/v1/audit/records")
@protected("audit.read", target=_target)
async def audit_records(run: Run) -> Outcome:
    """Records after ``after_seq`` (ascending), at most ``limit``."""
    request = run.request
    after = query_int(request, "after_seq", default=0, low=0, high=10**12)
    limit = query_page_limit(request, default=100, high=1000)
    records = await run.store.audit_range(after_seq=after, limit=limit)
    items = [{"seq": r.seq, "prev_hash": r.prev_hash, "hash": r.hash, **r.entry} for r in records]
    return Outcome(200, {
        "items": items,
        "next_after_seq": records[-1].seq if len(records) == limit else None,
    })


@routes.get("/api/v1/audit/checkpoints")
@protected("audit.read", target=_target)
async def audit_checkpoints(run: Run) -> Outcome:
    """Signed checkpoints after ``after_seq`` (ascending), at most ``limit``; each item is an
    anchor as it stands (``cpctl audit verify --anchor``)."""
    request = run.request
    after = query_int(request, "after_seq", default=0, low=0, high=10**12)
    limit = query_page_limit(request, default=100, high=1000)
    checkpoints = await run.store.audit_checkpoints(after_seq=after, limit=limit)
    return Outcome(200, {
        "items": [to_doc(c) for c in checkpoints],
        "next_after_seq": checkpoints[-1].seq if len(checkpoints) == limit else None,
    })
