"""A ticket's live events (server-sent events): the ticket each time it changes, until settled.

Requesters wait on it (``cpctl approval request --wait``, ``cpctl installer run``), consoles
show live queues with it. Every stream reads the ticket from the store, never from process
state, so a review made on any worker or replica shows within one poll.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from ..approvals.review import TICKET_READ
from ..approvals.tickets import ticket_view
from ..chain import Outcome, Run, protected_as
from ..store.base import Store, TicketRecord
from ..streams import STREAMS, StreamWrite, event_stream_response, pump

routes = web.RouteTableDef()

#: How often a live stream reads its ticket again, and how long one may stay open (a client
#: reconnects after that and gets the current ticket first). Heartbeats, the session re-check
#: and the caps are configured (``server.streams``).
SSE_POLL_S = 0.5
SSE_MAX_S = 300.0

#: After sending the ticket in one of these states the stream ends (``event: end``). 'approved'
#: is one: it is what a requester waits for, even though consumption may follow.
SETTLED_STATES = frozenset({"approved", "rejected", "expired", "revoked", "consumed"})


@routes.get("/api/v1/approvals/{id}/events")
@protected_as(TICKET_READ)
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
    the stream's limits end it (``streams.pump``)."""
    sent: dict[str, Any] | None = None
    polls = 0

    async def poll(write: StreamWrite) -> bytes | None:
        nonlocal sent, polls
        # The first poll sends the ticket the chain has just read; later ones read it again.
        current = ticket if polls == 0 else await store.get_ticket(ticket.id)
        polls += 1
        if current is None:  # removed from the store while watched
            return b'{"reason":"ticket_not_found"}'
        view = ticket_view(current)
        if view != sent:
            await write(b"event: ticket\ndata: " + _json(view) + b"\n\n")
            sent = view
        if current.state in SETTLED_STATES:
            return _json({"reason": "settled", "state": current.state})
        return None

    return await pump(request, event_stream_response(request), poll,
                      label=f"event stream of ticket {ticket.id}", poll_s=SSE_POLL_S,
                      max_s=SSE_MAX_S)


def _json(doc: Any) -> bytes:
    # One ASCII line: JSON escapes newlines (and everything else) inside strings, so a data
    # field never splits.
    return json.dumps(doc, separators=(",", ":")).encode("ascii")
