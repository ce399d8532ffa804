"""Ticket expiry: unreviewed and unused tickets past their clocks become ``expired``.

Each expiry is an audit record written in the same transaction as the state change. The sweep
runs in every worker; the store's conditional UPDATE expires each ticket exactly once.
"""

from __future__ import annotations

from .. import clock
from ..audit.log import AuditLog
from ..store.base import AuditRecord, Store

__all__ = ["SYSTEM_PRINCIPAL", "expire_once"]

#: Who the audit record says expired a ticket.
SYSTEM_PRINCIPAL = {"subject_id": "system", "kind": "service", "session_id": None}


async def expire_once(store: Store, audit: AuditLog, now: float) -> int:
    """Expire every ticket whose clock ran out by ``now``; returns how many."""
    records: list[AuditRecord] = []
    async with store.transaction() as tx:
        for ticket in await tx.expire_tickets(now):
            records.append(await audit.append(
                {"at": clock.iso(now), "action": "approvals.expire", "principal": SYSTEM_PRINCIPAL,
                 "ticket_id": ticket.id, "ticket_event": "expired", "env": ticket.env,
                 "resource_hash": ticket.resource_hash, "outcome": "executed"},
                tx,
            ))
    for record in records:
        await audit.mirror(record)
    return len(records)
