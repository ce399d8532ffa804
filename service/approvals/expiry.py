"""Ticket expiry: unreviewed and unused tickets past their clocks become ``expired``.

Each expiry is an audit record written in the same transaction as the state change. The sweep
runs in every worker; the store's conditional UPDATE expires each ticket exactly once.
"""

from __future__ import annotations

import logging
from typing import Any

from .. import clock
from ..audit.log import AuditLog
from ..audit.recording import settle_committed
from ..store.base import AuditRecord, Store

__all__ = ["SYSTEM_PRINCIPAL", "expire_once"]

log = logging.getLogger("controlplane.approvals")

#: Who the audit record says expired a ticket.
SYSTEM_PRINCIPAL = {"subject_id": "system", "kind": "service", "session_id": None}


async def expire_once(store: Store, audit: AuditLog, now: float) -> int:
    """Expire every ticket whose clock ran out by ``now``; returns how many.

    Where the store stages audit records (PostgreSQL), the sweep's transaction stages them like
    a run's and they are sealed after COMMIT: the transaction never holds the chain's head."""
    records: list[AuditRecord] = []
    staged: list[tuple[int, dict[str, Any]]] = []
    async with store.transaction() as tx:
        expired = await tx.expire_tickets(now)
        for ticket in expired:
            entry = {"at": clock.iso(now), "action": "approvals.expire",
                     "principal": SYSTEM_PRINCIPAL, "ticket_id": ticket.id,
                     "ticket_event": "expired", "env": ticket.env,
                     "resource_hash": ticket.resource_hash, "outcome": "executed"}
            if audit.stages:
                staged.append((await audit.stage(entry, tx), entry))
            else:
                records.append(await audit.append(entry, tx))
    # Committed: each expiry is logged once (the store's conditional UPDATE expired it here).
    for ticket in expired:
        log.info("approval ticket expired", extra={"fields": {
            "event": "approval.ticket_expired", "ticket_id": ticket.id, "action": ticket.action,
            "env": ticket.env, "subject_id": ticket.subject_id}})
    for record in records:
        await audit.mirror(record)
    for staging_id, entry in staged:
        await settle_committed(audit, staging_id, entry)  # the sealer mirrors it
    return len(expired)
