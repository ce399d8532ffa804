"""Withdrawal: a ticket whose creation committed but whose answer (with its nonce) was lost.

Only the creator's 201 ever shows the nonce, and only its hash is stored, so such a ticket can
never be redeemed; left pending it would sit in the approvers' queue for nothing. The worker's
resolver of unknown outcomes (``audit.resolution``) revokes it as ``system``, with an audit
record of its own written in the same transaction; the requester, told ``outcome_unknown``,
requests a new ticket.
"""

from __future__ import annotations

import logging
from typing import Any

from .. import clock
from ..audit.log import AuditLog
from ..audit.recording import settle_committed
from ..store.base import AuditRecord, Conflict, NotFound, Store
from .expiry import SYSTEM_PRINCIPAL

__all__ = ["withdraw_unanswered"]

log = logging.getLogger("controlplane.approvals")


async def withdraw_unanswered(store: Store, audit: AuditLog, ticket_id: str,
                              correlation_id: str) -> bool:
    """Revoke ``ticket_id`` (pending or approved) because its creator never received its nonce;
    False when it is closed already (nothing to do). ``correlation_id``: the creating run's."""
    now = clock.now()
    record: AuditRecord | None = None
    staged: int | None = None
    entry: dict[str, Any] = {}
    try:
        async with store.transaction() as tx:
            ticket = await tx.transition_ticket(ticket_id, ("pending", "approved"), "revoked",
                                                now, "system")
            entry = {"at": clock.iso(now), "action": "approvals.withdraw",
                     "principal": SYSTEM_PRINCIPAL, "cause_correlation_id": correlation_id,
                     "ticket_id": ticket.id, "ticket_event": "revoked", "env": ticket.env,
                     "resource_hash": ticket.resource_hash, "outcome": "executed",
                     "reason": "creation_unanswered"}
            if audit.stages:
                staged = await audit.stage(entry, tx)
            else:
                record = await audit.append(entry, tx)
    except (Conflict, NotFound):
        return False  # revoked, expired or gone meanwhile: nobody can redeem it either way
    log.info("approval ticket withdrawn: its creation's answer was lost", extra={"fields": {
        "event": "approval.ticket_withdrawn", "ticket_id": ticket_id, "env": entry["env"]}})
    if record is not None:
        await audit.mirror(record)
    if staged is not None:
        await settle_committed(audit, staged, entry)
    return True
