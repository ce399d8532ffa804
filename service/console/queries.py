"""What the console reads from the store: a reviewer's inbox, a person's requests, a ticket's
audit records. Reads only; every page that shows them ran the chain first.

Who may review a ticket is decided by ``approvals.policy.check_review`` itself, dry-run: the
function the review endpoint applies (people only, no self-review, one review each, reviewer
roles and groups), from the same policy data and the same IdP groups of the session, so the
inbox never offers a ticket the review would refuse for those reasons, and the ticket page
names the role or group that is missing as the API's refusal does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .. import clock
from ..approvals import policy
from ..approvals.policy import Reviewer
from ..approvals.tickets import NotEligibleReviewer
from ..authn.principal import Principal
from ..authz.engine import PolicyEngine
from ..store.base import MAX_PAGE, Store, TicketRecord

__all__ = ["Inbox", "inbox", "my_requests", "review_refusal", "ticket_records"]

#: At most this many pending tickets are considered for an inbox (oldest first among them).
INBOX_PENDING_MAX = 1000
#: Recently decided tickets the reviewer took part in, looked for among this many newest.
INBOX_RECENT_SCAN = 100
INBOX_RECENT_MAX = 10
#: Tickets someone requested for another subject are looked for among this many newest.
REQUESTS_SCAN = MAX_PAGE
#: At most this many audit records are read to find a ticket's (from its creation on).
AUDIT_SCAN_MAX = 20_000
SEARCH_MARGIN = 200


@dataclass(frozen=True)
class Inbox:
    pending: list[TicketRecord]  # reviewable by this person, oldest first
    recent: list[TicketRecord]  # recently closed tickets this person reviewed, newest first


def reviewer(principal: Principal) -> Reviewer:
    """The signed-in person as a reviewer: with the IdP groups of their session."""
    return Reviewer(principal.subject_id, principal.kind, principal.idp_groups)


def review_refusal(engine: PolicyEngine, principal: Principal, ticket: TicketRecord,
                   now: float, decision: str = "reject") -> NotEligibleReviewer | None:
    """Why ``principal`` may not give ``decision`` on ``ticket`` (code and detail), or None.
    "reject" needs every rule but the group quorum, which only an approval has to meet."""
    return policy.review_refusal(engine, ticket, reviewer(principal), now, decision)


async def inbox(store: Store, engine: PolicyEngine, principal: Principal, now: float) -> Inbox:
    """The pending tickets ``principal`` may review (oldest first), and recent ones they reviewed."""
    pending: list[TicketRecord] = []
    cursor: str | None = None
    while len(pending) < INBOX_PENDING_MAX:
        page, cursor = await store.list_tickets(state="pending", limit=MAX_PAGE, before=cursor)
        pending.extend(t for t in page if t.pending_until > now
                       and review_refusal(engine, principal, t, now) is None)
        if cursor is None:
            break
    pending.sort(key=lambda t: (t.created_at, t.id))
    newest, _ = await store.list_tickets(limit=INBOX_RECENT_SCAN)
    recent = [t for t in newest if t.state != "pending"
              and any(r.reviewer == principal.subject_id for r in t.reviews)][:INBOX_RECENT_MAX]
    return Inbox(pending[:INBOX_PENDING_MAX], recent)


async def my_requests(store: Store, principal: Principal, limit: int = 100) -> list[TicketRecord]:
    """Tickets for ``principal`` (as their subject, from an index) and, among the newest
    ``REQUESTS_SCAN`` tickets, those they requested for someone else; newest first."""
    mine, _ = await store.list_tickets(subject_id=principal.subject_id, limit=limit)
    newest, _ = await store.list_tickets(limit=REQUESTS_SCAN)
    found = {t.id: t for t in mine}
    found.update((t.id, t) for t in newest if t.requested_by == principal.subject_id)
    return sorted(found.values(), key=lambda t: (t.created_at, t.id), reverse=True)[:limit]


async def ticket_records(store: Store, ticket: TicketRecord) -> tuple[list[dict[str, Any]], bool]:
    """The audit records that name ``ticket`` (ascending), and whether the search was cut short.

    The log has no index by ticket, so the search starts at the first record written at or
    after the ticket's creation (a binary search on the append-ordered ``at``) and reads at most
    ``AUDIT_SCAN_MAX`` records from there.
    """
    head, _ = await store.audit_head()
    created = clock.iso(ticket.created_at) or ""
    lo, hi = 0, head  # the answer (records after seq `lo`) lies in [0, head]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        probe = await store.audit_range(after_seq=mid - 1, limit=1)
        if probe and str(probe[0].entry.get("at", "")) < created:
            lo = mid
        else:
            hi = mid - 1
    found: list[dict[str, Any]] = []
    # Records are appended in commit order, which may differ a little from their start times:
    # step back a margin so a record committed just around the creation is not skipped.
    after, read = max(0, lo - SEARCH_MARGIN), 0
    while read < AUDIT_SCAN_MAX:
        page = await store.audit_range(after_seq=after, limit=MAX_PAGE)
        for record in page:
            if record.entry.get("ticket_id") == ticket.id:
                found.append({"seq": record.seq, "hash": record.hash, **record.entry})
        read += len(page)
        if len(page) < MAX_PAGE:
            return found, False
        after = page[-1].seq
    return found, True


_STORY = {"created": "requested", "review_approve": "approved (review)",
          "review_reject": "rejected (review)", "revoked": "revoked"}


def timeline(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ticket's story from its records: creation, reviews, consumption, refusals."""
    events = []
    for r in records:
        kind = r.get("ticket_event")
        if kind is None and r.get("ticket_consumed"):
            kind = "consumed"
        if kind is None and r.get("action") in ("approvals.read", "approvals.list"):
            continue  # page views and reads are in the full audit view, not the story
        what = _STORY.get(kind or "", kind or "")
        if kind is None:
            what = f"{r.get('action', '')} presenting the ticket"
        elif kind == "consumed":
            what = f"consumed by {r.get('action', '')}"
        found = r.get("principal")
        principal: dict[str, Any] = found if isinstance(found, dict) else {}
        outcome = r.get("outcome", "")
        if r.get("error"):
            outcome = f"{outcome} ({r['error']})"
        events.append({"seq": r["seq"], "at": r.get("at", ""), "who":
                       principal.get("subject_id") or "anonymous", "what": what,
                       "outcome": f"{outcome} {r.get('status', '')}".strip()})
    return events


def policy_reasons(records: Sequence[dict[str, Any]]) -> list[str]:
    """The policy's reasons recorded when the ticket was requested."""
    for r in records:
        if r.get("ticket_event") == "created" and isinstance(r.get("decision"), dict):
            return [str(x) for x in r["decision"].get("reasons", [])]
    return []
