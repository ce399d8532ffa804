"""What a ticket change tells the world: the ``approval.*`` outbox event of each change.

The store writes one event per change in the transaction of the change (``store.sql.tickets``
calls ``ticket_event``), so there is no event without its change and no change without its event:

| change                                     | event type          | actor            |
|--------------------------------------------|---------------------|------------------|
| ticket created                             | approval.requested  | the requester    |
| review that leaves the ticket pending      | approval.reviewed   | the reviewer     |
| review that reaches quorum                 | approval.approved   | the reviewer     |
| review that rejects                        | approval.rejected   | the reviewer     |
| revoked                                    | approval.revoked    | who revoked it   |
| expired (pending or approved clock ran out)| approval.expired    | ``system``       |
| consumed by the protected action           | approval.consumed   | the ticket's subject |

The payload (``data``) is the ticket as the API shows it (never the nonce: the store keeps only
its hash and the view omits even that) with the command masked (``command.masked``),
plus ``actor``, the ``review`` that caused the change and, for consumption, the consuming
request's ``correlation_id``. Its ``id`` is a fresh UUID that every retry
keeps, so receivers de-duplicate on it.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from ..clock import iso
from ..store.base import OutboxEvent, ReviewRecord, TicketRecord
from .tickets import ticket_view

__all__ = ["EVENT_TYPES", "MAX_EVENT_FIELD_BYTES", "SYSTEM_ACTOR", "ticket_event"]

EVENT_TYPES = (
    "approval.requested",
    "approval.reviewed",
    "approval.approved",
    "approval.rejected",
    "approval.expired",
    "approval.revoked",
    "approval.consumed",
)
#: Who expires tickets.
SYSTEM_ACTOR = "system"


#: The most bytes of JSON a ticket's resource or command may take inside an event.
MAX_EVENT_FIELD_BYTES = 64 * 1024


def _json_bytes(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8"))


def ticket_event(
    kind: str,
    ticket: TicketRecord,
    *,
    actor: str,
    at: float,
    review: ReviewRecord | None = None,
    correlation_id: str | None = None,
) -> OutboxEvent:
    """The outbox event of ``ticket`` (as it is after the change) for a change of ``kind``
    (``requested``, ``reviewed``, ``approved``, ``rejected``, ``expired``, ``revoked``,
    ``consumed``) made by ``actor`` at ``at``."""
    event_type = f"approval.{kind}"
    if event_type not in EVENT_TYPES:
        raise ValueError(f"unknown ticket event {kind!r}")
    view = ticket_view(ticket)  # the command masked
    # An event must never make its change fail: a resource or command that would not fit the
    # store's bound on one JSON value next to the rest is left out (its hash stays; the ticket
    # API shows it in full), marked ``<field>_omitted``.
    for name in ("resource", "command"):
        if _json_bytes(view[name]) > MAX_EVENT_FIELD_BYTES:
            view[name] = None
            view[f"{name}_omitted"] = True
    # The ticket's fields at the top level: the resource sits exactly as deep as in the request
    # that created the ticket, so any resource a ticket can hold, its event can hold too.
    data: dict[str, Any] = {**view, "actor": actor}
    if review is not None:
        data["review"] = {"reviewer": review.reviewer, "decision": review.decision,
                          "group": review.group, "reason": review.reason, "at": iso(review.at)}
    if correlation_id is not None:
        data["correlation_id"] = correlation_id
    return OutboxEvent(
        id=str(uuid.uuid4()),
        type=event_type,
        ticket_id=ticket.id,
        env=ticket.env,
        at=at,
        data=data,
        next_attempt_at=at,
        window_start=at,
    )
