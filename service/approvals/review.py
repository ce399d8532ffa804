"""A ticket as what a request protects, and the review step: one body for every entrance.

The API (``GET``/``POST /api/v1/approvals/{id}...``) and the console's ticket pages and review
form run the same chain with the same declarations (``TICKET_READ``, ``TICKET_REVIEW``) and the
same Execute step (``review_ticket``), so the policy, the review rules (no self-review, people
only, group quorum), step-up and audit cannot differ between them.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ..authn import stepup
from ..authz import actions
from ..authz.engine import ENGINE
from ..config import CONFIG, Config
from ..errors import ApprovalRepositoryUnavailable, NotFound
from ..run import Outcome, Protection, Target, Write
from ..store.base import Store, TicketRecord, Tx
from ..storelink import STORE
from .policy import Reviewer, check_review, review_target
from .tickets import ticket_view

__all__ = [
    "REVIEW_SCHEMA",
    "TICKET_READ",
    "TICKET_REVIEW",
    "load_ticket",
    "require_repository",
    "review_ticket",
    "ticket_target",
]

#: The body of a review: ``{decision, reason?}`` (the console validates its form against it too).
REVIEW_SCHEMA = "approval-review.schema.json"


def require_repository(config: Config) -> None:
    """503 ``approval_repository_unavailable`` when this service keeps no tickets."""
    if not config.approvals.enabled:
        raise ApprovalRepositoryUnavailable(
            "no approval repository is configured (approvals.store: none)"
        )


async def load_ticket(source: Store | Tx, ticket_id: str) -> TicketRecord:
    """The ticket ``ticket_id`` names (404 ``ticket_not_found``: unknown, or too long to be one)."""
    ticket = await source.get_ticket(ticket_id) if len(ticket_id) <= 64 else None
    if ticket is None:
        raise NotFound("no such approval ticket", code="ticket_not_found")
    return ticket


async def ticket_target(request: web.Request, body: Any) -> Target:
    """The ticket the route's ``{id}`` names, as its readers and reviewers see it."""
    require_repository(request.app[CONFIG])
    return review_target(await load_ticket(request.app[STORE].require(), request.match_info["id"]))


#: Reading one ticket (its page, its events, the change it is about).
TICKET_READ = Protection(actions.get("approvals.read"), ticket_target, None)
#: Reviewing one ticket: the API reads the body as JSON; the console, which posts a form, runs
#: it with ``body_schema=None`` and validates the form's fields against ``REVIEW_SCHEMA``.
TICKET_REVIEW = Protection(actions.get("approvals.review"), ticket_target, REVIEW_SCHEMA)


async def review_ticket(run: Write, decision: str, reason: str | None) -> Outcome:
    """The Execute step of ``TICKET_REVIEW``: approve or reject; step-up for production,
    separation of duties and group quorum (``check_review``), then the transition, all in the
    run's transaction. The answer is the ticket as the API shows it."""
    ticket = await load_ticket(run.tx, run.target.id or "")
    if run.config.is_production(ticket.env):
        stepup.require_fresh(run.principal, run.now, run.config.authn.step_up_window_s,
                             "reviewing a production ticket needs a recent step-up authentication")
    principal = run.principal
    outcome = check_review(run.request.app[ENGINE], ticket,
                           Reviewer(principal.subject_id, principal.kind, principal.idp_groups),
                           decision=decision, reason=reason, now=run.now)
    updated = await run.tx.add_review(ticket.id, outcome.review, outcome.new_state,
                                      outcome.approved_expires_at, run.now)
    return Outcome(200, ticket_view(updated), audit={
        "ticket_id": ticket.id,
        "ticket_event": f"review_{decision}",
        "ticket_state": updated.state,
        "review_group": outcome.review.group,
    })
