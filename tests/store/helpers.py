"""Record builders and a reference seal shared by the store tests and their worker processes."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from typing import Any

from service.store import ReviewRecord, SessionRecord, Store, TicketRecord

T0 = 1_700_000_000.0
NONCE_HASH = "sha256:" + "ab" * 32
RESOURCE_HASH = "sha256:" + "cd" * 32
COMMAND_HASH = "sha256:" + "ef" * 32


def ticket(id: str = "t-1", **changes: Any) -> TicketRecord:
    rec = TicketRecord(
        id=id,
        subject_id="alice",
        env="prod",
        resource={"kind": "database", "id": "db-1"},
        resource_hash=RESOURCE_HASH,
        action="databases.restart",
        command_hash=COMMAND_HASH,
        nonce_hash=NONCE_HASH,
        state="pending",
        requested_by="alice",
        reason="maintenance",
        created_at=T0,
        pending_until=T0 + 600,
        approved_at=None,
        expires_at=None,
        consumed_at=None,
        consumed_correlation_id=None,
        closed_by=None,
        approval={"quorum": 1, "groups": ["sre"], "ttl_s": 900},
    )
    return replace(rec, **changes)


def session(id: str = "s-1", **changes: Any) -> SessionRecord:
    rec = SessionRecord(
        id=id,
        subject_id="alice",
        kind="human",
        authn_method="password",
        auth_time=T0,
        created_at=T0,
        expires_at=T0 + 3600,
    )
    return replace(rec, **changes)


def review(reviewer: str = "bob", decision: str = "approve", at: float = T0 + 10) -> ReviewRecord:
    return ReviewRecord(reviewer=reviewer, decision=decision, group="sre", reason=None, at=at)  # type: ignore[arg-type]


def binding(rec: TicketRecord, **changes: Any) -> dict[str, Any]:
    """Keyword arguments for consume_ticket that match ``rec`` (then apply ``changes``)."""
    kw: dict[str, Any] = {
        "nonce_hash": rec.nonce_hash,
        "subject_id": rec.subject_id,
        "env": rec.env,
        "action": rec.action,
        "resource_hash": rec.resource_hash,
        "command_hash": rec.command_hash,
        "now": T0 + 30,
        "correlation_id": "corr-1",
    }
    kw.update(changes)
    return kw


async def approved_ticket(store: Store, id: str = "t-1", **changes: Any) -> TicketRecord:
    """Create a ticket and approve it; usable until ``T0 + 900``."""
    rec = ticket(id, **changes)
    await store.create_ticket(rec)
    return await store.add_review(id, review(), "approved", T0 + 900, T0 + 10)


def seal(seq: int, prev_hash: str, entry: dict[str, Any], text: str | None = None) -> str:
    """A stand-in for the audit module's hashing: binds seq, previous hash and entry (the
    stored text is the store's offer to save an encoding: not needed here)."""
    body = json.dumps([seq, prev_hash, entry], sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(body.encode()).hexdigest()
