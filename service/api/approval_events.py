"""A ticket's live events (server-sent events): the ticket each time it changes, until settled.

Requesters wait on it (``cpctl approval request --wait``, ``cpctl installer run``), consoles
show live queues with it. Every stream reads the ticket from the store, never from process
state, so a review made on any worker or replica shows within one poll.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from aiohttp import web

from ..appkeys import STREAMS
from ..approvals.tickets import ticket_view
from ..chain import Outcome, Run, protected
from ..store.base import Store, StoreError, TicketRecord
from ..streams import event_stream_response, session_alive
from .approvals import _ticket_target

routes = web.RouteTableDef()
log = logging.getLogger("controlplane.approvals")

#: How often a live stream reads its ticket again, and how long one may stay open (a client
#: reconnects after that and gets the current ticket first). Heartbeats, the session re-check
#: and the caps are configured (``server.streams``).
SSE_POLL_S = 0.5
SSE_MAX_S = 300.0

#: After sending the ticket in one of these states the stream ends (``event: end``). 'approved'
#: is one: it is what a requester waits for, even though consumption may follow.
SETTLED_STATES = frozenset({"approved", "rejected", "expired", "revoked", "consumed"})


@routes.get("/api/v1/approvals/{id}/events")
@protected("approvals.read", target=_ticket_target)
async def approval_events(run: Run) -> Outcome:
    """With ``Accept: text/event-stream``: ``event: ticket`` with the current ticket, one more
    each time it changes, then ``event: end`` once it is settled. Otherwise the current ticket."""
    ticket: TicketRecord = run.target.record
    request = run.request
    if "text/event-stream" not in request.headers.get("Accept", ""):
        return Outcome(200, ticket_view(ticket), audit={"ticket_id": ticket.id})
    # Over a cap this raises 429 too_many_streams (audited like any refusal); the slot is held
    # until this request's handling ends, however it ends.
    request.app[STREAMS].acquire(run.principal.subject_id)
    store = run.store
    return Outcome(200, None, audit={"ticket_id": ticket.id, "stream": True},
                   stream=lambda: _stream(request, store, ticket))


async def _stream(request: web.Request, store: Store, ticket: TicketRecord) -> web.StreamResponse:
    """The ticket's changes until it is settled or the session ends (both ``event: end``), or
    ``SSE_MAX_S`` passes, the store fails or the server shuts down (the stream just closes: the
    client reconnects). A client that goes away is normal: no error is logged."""
    response = event_stream_response(request)
    try:
        await response.prepare(request)
        end = await _pump(request, response, store, ticket)
        if end is not None:
            await response.write(b"event: end\ndata: " + _json(end) + b"\n\n")
        await response.write_eof()
    except ConnectionError:  # aiohttp's ClientConnectionResetError included
        log.debug("event stream of ticket %s: the client went away", ticket.id)
    return response


async def _pump(request: web.Request, response: web.StreamResponse, store: Store,
                ticket: TicketRecord) -> dict[str, Any] | None:
    """Write the ticket whenever it changes; the ``event: end`` data once the stream should
    end with one, None when it should just close."""
    slots = request.app[STREAMS]
    heartbeat_s, check_s = slots.config.heartbeat_s, slots.config.session_check_s
    loop = asyncio.get_running_loop()
    started = last_beat = last_check = loop.time()
    sent: dict[str, Any] | None = None
    current: TicketRecord | None = ticket
    while not slots.stopping:
        if current is None:  # removed from the store while watched
            return {"reason": "ticket_not_found"}
        view = ticket_view(current)
        if view != sent:
            await response.write(b"event: ticket\ndata: " + _json(view) + b"\n\n")
            sent, last_beat = view, loop.time()
        if current.state in SETTLED_STATES:
            return {"reason": "settled", "state": current.state}
        now = loop.time()
        if now - started >= SSE_MAX_S or request.transport is None or (
                request.transport.is_closing()):
            return None
        if now - last_check >= check_s:
            last_check = now
            if not await session_alive(request):
                return {"reason": "session_ended"}
        if now - last_beat >= heartbeat_s:
            await response.write(b": heartbeat\n\n")
            last_beat = now
        await asyncio.sleep(SSE_POLL_S)
        try:
            current = await store.get_ticket(ticket.id)
        except StoreError:
            log.warning("event stream of ticket %s ended: store unavailable", ticket.id)
            return None
    return None


def _json(doc: Any) -> bytes:
    # One ASCII line: JSON escapes newlines (and everything else) inside strings, so a data
    # field never splits.
    return json.dumps(doc, separators=(",", ":")).encode("ascii")
