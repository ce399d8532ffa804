"""Installer actions (frozen): record the run intent as a step event on the task. Nothing else.

This endpoint takes no task or deploy authority: it creates the task record on first use and
appends one ``installer.run.requested`` event; it never changes a task's state. In production it
runs only with a fresh step-up and a bound, approved ticket, consumed in the same transaction
as the event and its audit record (the chain does that).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ..chain import Outcome, Target, Write, protected
from ..clock import iso
from ..tasks.tasks import INTENT_KIND

routes = web.RouteTableDef()


async def _target(request: web.Request, body: Any) -> Target:
    return Target(resource=body["resource"], env=body["env"], id=body["task_id"])


@routes.post("/api/v1/installer/actions")
@protected("installer.run.execute", target=_target, body="installer-action.schema.json")
async def installer_action(run: Write) -> Outcome:
    """Append the run intent to the task's step events; 202 with the recorded event."""
    body = run.body
    task_id = body["task_id"]
    correlation_id = body.get("correlation_id", run.correlation_id)
    ticket_id = run.ticket.id if run.ticket else None
    await run.tx.ensure_task(task_id, run.principal.subject_id, run.now)
    data = {
        "env": run.target.env,
        "resource_hash": run.target.hash,
        "ticket_id": ticket_id,
        "correlation_id": correlation_id,
        "action": "installer.run.execute",
    }
    event = await run.tx.append_event(task_id, INTENT_KIND, run.principal.subject_id, data, run.now)
    return Outcome(
        202,
        {
            "task_id": task_id,
            "event": {
                "seq": event.seq,
                "kind": event.kind,
                "at": iso(event.at),
                "actor": event.actor,
                "env": run.target.env,
                "resource_hash": run.target.hash,
                "ticket_id": ticket_id,
                "correlation_id": correlation_id,
            },
        },
        headers={"Location": f"/api/v1/tasks/{task_id}"},
        audit={"task_id": task_id, "event_seq": event.seq},
    )
