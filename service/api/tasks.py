"""Tasks: read state, read step events (JSON pages or a live server-sent-events stream),
and executors' progress reports. A task is not an approval: nothing here touches tickets."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from ..chain import Outcome, Run, Target, Write, protected
from ..config import CONFIG
from ..errors import NotFound
from ..store.base import TASK_STATES, Store, TaskRecord, Tx
from ..storelink import STORE
from ..streams import STREAMS, StreamWrite, event_stream_response, pump
from ..tasks.tasks import EventView, next_state, task_view
from .queries import query_int, query_known, query_page_limit, query_str

routes = web.RouteTableDef()

#: How often a live stream looks for new events, and how long it may stay open. Heartbeats,
#: the session re-check and the caps are configured (``server.streams``).
SSE_POLL_S = 0.25
SSE_MAX_S = 300.0


async def _task(store: Store | Tx, request: web.Request) -> TaskRecord:
    task_id = request.match_info["id"]
    task = await store.get_task(task_id) if len(task_id) <= 128 else None
    if task is None:
        raise NotFound("no such task", code="task_not_found")
    return task


async def _target(request: web.Request, body: Any) -> Target:
    task = await _task(request.app[STORE].require(), request)
    # Tasks span environments (each event names its own), so reading one is authorized as the
    # strictest environment.
    return Target(resource={"task_id": task.id}, env=request.app[CONFIG].environments.strictest(),
                  id=task.id, owner=task.created_by, record=task)


async def _list_target(request: web.Request, body: Any) -> Target:
    return Target.collection("tasks", request.app[CONFIG].environments.strictest())


@routes.get("/api/v1/tasks")
@protected("tasks.read", target=_list_target)
async def list_tasks(run: Run) -> Outcome:
    """Tasks in one state, oldest first: executors find the pending runs to claim here."""
    query_known(run.request, ("state", "limit"))
    state = query_str(run.request, "state", choices=TASK_STATES) or "pending"
    limit = query_page_limit(run.request, default=50, high=200)
    tasks = await run.store.list_tasks(state, limit=limit)
    return Outcome(200, {"items": [task_view(t) for t in tasks]}, audit={"state": state})


@routes.get("/api/v1/tasks/{id}")
@protected("tasks.read", target=_target)
async def read_task(run: Run) -> Outcome:
    """State, progress, result and timestamps."""
    task: TaskRecord = run.target.record
    return Outcome(200, task_view(task), audit={"task_id": task.id})


@routes.get("/api/v1/tasks/{id}/events")
@protected("tasks.read", target=_target)
async def task_events(run: Run) -> Outcome:
    """Events after ``after_seq`` as JSON, or a live SSE stream with ``Accept: text/event-stream``
    (resumable with ``Last-Event-ID``)."""
    request, store = run.request, run.store
    task_id = request.match_info["id"]
    if "text/event-stream" in request.headers.get("Accept", ""):
        last = request.headers.get("Last-Event-ID", "")
        after = int(last) if last.isdigit() and len(last) < 12 else query_int(
            request, "after_seq", default=0, low=0, high=10**11)
        # Over a cap this raises 429 too_many_streams (audited like any refusal); the slot is
        # held until this request's handling ends, however it ends.
        request.app[STREAMS].acquire(run.principal.subject_id)
        return Outcome(200, None, audit={"task_id": task_id, "stream": True},
                       stream=lambda: _stream(request, store, task_id, after))
    after = query_int(request, "after_seq", default=0, low=0, high=10**11)
    limit = query_page_limit(request, default=100, high=1000)
    events = await store.list_events(task_id, after_seq=after, limit=limit)
    items = [EventView(e).as_dict() for e in events]
    return Outcome(200, {
        "task_id": task_id,
        "items": items,
        "next_after_seq": events[-1].seq if len(events) == limit else None,
    }, audit={"task_id": task_id})


async def _stream(request: web.Request, store: Store, task_id: str, after: int) -> web.StreamResponse:
    """Events as they are appended, until the task ends (``event: end``), the session ends
    (``event: end`` with ``reason``), or the stream's limits end it (``streams.pump``; a client
    reconnects with ``Last-Event-ID``)."""

    async def poll(write: StreamWrite) -> bytes | None:
        nonlocal after
        events = await store.list_events(task_id, after_seq=after, limit=100)
        task = await store.get_task(task_id) if not events else None
        for event in events:
            payload = json.dumps(EventView(event).as_dict(), separators=(",", ":"))
            await write(f"id: {event.seq}\nevent: {event.kind}\ndata: {payload}\n\n".encode())
            after = event.seq
        return b"{}" if task is not None and task.state in ("succeeded", "failed") else None

    return await pump(request, event_stream_response(request), poll,
                      label=f"event stream of task {task_id}", poll_s=SSE_POLL_S, max_s=SSE_MAX_S)


@routes.post("/api/v1/tasks/{id}/events")
@protected("tasks.report", target=_target, body="task-event.schema.json")
async def report_event(run: Write) -> Outcome:
    """Executors report started / progress / succeeded / failed; state follows from events.
    The first report claims the task for its executor: another executor's report answers 409
    ``task_claimed``, a second ``started`` 409 ``task_state_conflict``."""
    task = await _task(run.tx, run.request)
    body = run.body
    reporter = run.principal.subject_id
    change = next_state(task, reporter, body["kind"], body.get("progress"), body.get("result"))
    data = {k: body[k] for k in ("step", "progress", "message", "result") if k in body}
    data["correlation_id"] = run.correlation_id
    event = await run.tx.append_event(
        task.id, body["kind"], run.principal.subject_id, data, run.now,
        state=change.state, progress=change.progress, result=change.result, claimant=reporter,
    )
    return Outcome(201, EventView(event).as_dict(),
                   audit={"task_id": task.id, "event_seq": event.seq, "task_state": change.state})
