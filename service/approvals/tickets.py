"""Approval tickets: creation, review with separation of duties and group quorum, views.

The store applies each transition atomically; this module decides what the transition is.
Rules enforced in code, whatever the policy's ``approval`` object says:
- the ticket's subject and its requester can never review it; agents and services never review;
- a reviewer counts once; a quorum is ``quorum`` distinct approvers, and when the policy lists
  ``require_groups``, at least one approval from EACH of those groups (the group a review
  counted for is stored with it);
- any reject rejects the ticket.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..clock import iso as _iso
from ..store.base import ReviewRecord, TicketRecord
from .binding import hash_nonce, new_nonce, resource_hash
from .command import is_command, masked
from .summary import resource_summary

__all__ = [
    "NotEligibleReviewer",
    "Requirements",
    "ReviewOutcome",
    "decide_review",
    "new_ticket",
    "requirements",
    "ticket_view",
]


class NotEligibleReviewer(Exception):
    """The principal may not review this ticket; ``code`` says which rule refused it."""

    def __init__(self, code: str, detail: str):
        super().__init__(detail)
        self.code = code
        self.detail = detail


@dataclass(frozen=True)
class Requirements:
    """What a ticket needs before it is approved, from the policy's ``approval`` object."""

    quorum: int
    require_groups: tuple[str, ...]
    reviewer_roles: tuple[str, ...]
    ttl_s: int
    pending_ttl_s: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "quorum": self.quorum,
            "require_groups": list(self.require_groups),
            "reviewer_roles": list(self.reviewer_roles),
            "ttl_s": self.ttl_s,
            "pending_ttl_s": self.pending_ttl_s,
        }


def requirements(
    approval: Mapping[str, Any] | None, *, default_ttl_s: int, default_pending_ttl_s: int
) -> Requirements:
    """Read the policy's ``approval`` object defensively (bad values fall back to safe defaults)."""
    approval = approval or {}

    def positive_int(key: str, default: int, low: int, high: int) -> int:
        value = approval.get(key)
        if isinstance(value, bool) or not isinstance(value, int):
            return default
        return min(max(value, low), high)

    def strings(key: str) -> tuple[str, ...]:
        value = approval.get(key)
        if not isinstance(value, list):
            return ()
        return tuple(sorted({v for v in value if isinstance(v, str) and v}))

    groups = strings("require_groups") or strings("groups")
    quorum = positive_int("quorum", 1, 1, 10)
    return Requirements(
        # Each required group contributes a distinct approver, so the quorum is at least that many.
        quorum=max(quorum, len(groups)),
        require_groups=groups,
        reviewer_roles=strings("reviewer_roles"),
        ttl_s=positive_int("ttl_s", default_ttl_s, 30, 86400),
        pending_ttl_s=positive_int("pending_ttl_s", default_pending_ttl_s, 30, 604800),
    )


def new_ticket(
    *,
    subject_id: str,
    env: str,
    resource: Any,
    action: str,
    command_hash: str | None,
    reason: str | None,
    requested_by: str,
    req: Requirements,
    now: float,
    command: Any = None,
) -> tuple[TicketRecord, str]:
    """A pending ticket and its nonce (returned to the creator once; only its hash is stored).
    The command is kept masked (``command.masked``): its hash, taken by the caller over the
    exact command, is the binding; a secret value in it is never stored."""
    nonce = new_nonce()
    ticket = TicketRecord(
        id="tkt_" + uuid.uuid4().hex,
        subject_id=subject_id,
        env=env,
        resource=resource,
        resource_hash=resource_hash(resource),
        action=action,
        command_hash=command_hash,
        nonce_hash=hash_nonce(nonce),
        state="pending",
        requested_by=requested_by,
        reason=reason,
        created_at=now,
        pending_until=now + req.pending_ttl_s,
        approved_at=None,
        expires_at=None,
        consumed_at=None,
        consumed_correlation_id=None,
        closed_by=None,
        approval=req.as_dict(),
        reviews=(),
        command=masked(command) if is_command(command) else command,
    )
    return ticket, nonce


@dataclass(frozen=True)
class ReviewOutcome:
    review: ReviewRecord
    new_state: str | None  # approved | rejected | None (still pending)
    approved_expires_at: float | None


def decide_review(
    ticket: TicketRecord,
    *,
    reviewer: str,
    reviewer_kind: str,
    reviewer_roles: Sequence[str],
    reviewer_groups: Sequence[str],
    decision: str,
    reason: str | None,
    now: float,
) -> ReviewOutcome:
    """The review record and the transition it causes; ``NotEligibleReviewer`` when refused."""
    if reviewer_kind != "human":
        raise NotEligibleReviewer("reviewer_not_human", "only people can review approval tickets")
    if reviewer == ticket.subject_id:
        raise NotEligibleReviewer("self_review", "the ticket's subject cannot review it")
    if reviewer == ticket.requested_by:
        raise NotEligibleReviewer("self_review", "the ticket's requester cannot review it")
    if any(r.reviewer == reviewer for r in ticket.reviews):
        raise NotEligibleReviewer("duplicate_review", "this reviewer has already reviewed the ticket")
    req = _stored_requirements(ticket)
    if req["reviewer_roles"] and not set(req["reviewer_roles"]) & set(reviewer_roles):
        raise NotEligibleReviewer(
            "reviewer_role_required",
            "the ticket needs a reviewer holding one of: " + ", ".join(req["reviewer_roles"]),
        )
    if decision == "reject":
        review = ReviewRecord(reviewer, "reject", None, reason, now)
        return ReviewOutcome(review, "rejected", None)

    approvals = [r for r in ticket.reviews if r.decision == "approve"]
    covered = {r.group for r in approvals if r.group}
    missing = [g for g in req["require_groups"] if g not in covered]
    group: str | None = None
    if missing:
        mine = [g for g in missing if g in set(reviewer_groups)]
        slots_left = req["quorum"] - len(approvals)
        if not mine and slots_left <= len(missing):
            # Every remaining approval must come from a group still missing one.
            raise NotEligibleReviewer(
                "reviewer_group_required",
                "the ticket still needs an approval from: " + ", ".join(missing),
            )
        group = mine[0] if mine else None
    review = ReviewRecord(reviewer, "approve", group, reason, now)
    approvals.append(review)
    covered = {r.group for r in approvals if r.group}
    done = len(approvals) >= req["quorum"] and all(g in covered for g in req["require_groups"])
    if done:
        return ReviewOutcome(review, "approved", now + req["ttl_s"])
    return ReviewOutcome(review, None, None)


def _stored_requirements(ticket: TicketRecord) -> dict[str, Any]:
    stored = ticket.approval if isinstance(ticket.approval, dict) else {}
    return {
        "quorum": int(stored.get("quorum", 1)),
        "require_groups": list(stored.get("require_groups", [])),
        "reviewer_roles": list(stored.get("reviewer_roles", [])),
        "ttl_s": int(stored.get("ttl_s", 900)),
    }


def ticket_view(ticket: TicketRecord, *, nonce: str | None = None) -> dict[str, Any]:
    """The wire form; the nonce only when given (the creator's 201, nowhere else); the
    command masked (its secret values are no one's to read back, the requester's included)."""
    view: dict[str, Any] = {
        "id": ticket.id,
        "subject_id": ticket.subject_id,
        "env": ticket.env,
        "resource": ticket.resource,
        "resource_summary": resource_summary(ticket.resource),
        "resource_hash": ticket.resource_hash,
        "action": ticket.action,
        "command_hash": ticket.command_hash,
        # Masked here too: a ticket stored before its command was masked on the way in.
        "command": masked(ticket.command) if is_command(ticket.command) else ticket.command,
        "state": ticket.state,
        "requested_by": ticket.requested_by,
        "reason": ticket.reason,
        "created_at": _iso(ticket.created_at),
        "pending_until": _iso(ticket.pending_until),
        "approved_at": _iso(ticket.approved_at),
        "expires_at": _iso(ticket.expires_at),
        "consumed_at": _iso(ticket.consumed_at),
        "closed_at": _iso(ticket.closed_at),
        "closed_by": ticket.closed_by,
        "quorum": _stored_requirements(ticket)["quorum"],
        "approval": ticket.approval,
        "reviews": [
            {"reviewer": r.reviewer, "decision": r.decision, "group": r.group,
             "reason": r.reason, "at": _iso(r.at)}
            for r in ticket.reviews
        ],
    }
    if nonce is not None:
        view["nonce"] = nonce
    return view
