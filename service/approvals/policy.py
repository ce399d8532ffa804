"""What the approval workflow asks the policy: the one place handlers reach the engine.

- ``ticket_requirements``: when a ticket is requested, the policy is asked the question the
  executing request will ask (the subject who will run it, the action, the resource, the env),
  through the chain's own AuthZ stage; a ``deny`` refuses the ticket, and the decision's
  ``approval`` object says what the ticket needs (quorum, groups, roles, ttl).
- ``reviewer_facts``: a reviewer's roles and groups from policy data, as the policy sees them
  deciding the review (never from tokens: hard rule 2).
- ``review_target``: what a review (or read, or revoke) of a ticket acts on, for the chain.
- ``suggested_reviewers``: who could approve a ticket now, by the review endpoint's own rules
  (the policy's decision on ``approvals.review``, then ``tickets.decide_review``: humans only,
  never the subject or requester, reviewer roles, the groups still missing).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..authz import actions
from ..authz.decide import decide
from ..authz.engine import PolicyEngine
from ..config import Config
from ..errors import PolicyDenied, SchemaValidationFailed
from ..run import Target
from ..store.base import TicketRecord
from .tickets import NotEligibleReviewer, Requirements, decide_review, requirements

__all__ = ["Candidate", "ReviewerFacts", "review_target", "reviewer_facts", "suggested_reviewers",
           "ticket_requirements"]


def _stepped_up(subject_id: str, kind: str) -> dict[str, object]:
    # A subject as it will present itself to act: authenticated and stepped up (production
    # tickets are only redeemed and reviewed with a fresh step-up), its session unknown yet.
    return {
        "subject_id": subject_id, "kind": kind, "session_id": None,
        "auth_time": None, "authn_method": None,
        "step_up": {"verified": True, "at": None, "age_s": None},
    }


def ticket_requirements(
    engine: PolicyEngine,
    config: Config,
    *,
    subject_id: str,
    subject_kind: str,
    action: str,
    target: Target,
    command_hash: str | None,
    correlation_id: str,
    subject_idp_groups: Sequence[str] = (),
) -> Requirements:
    """What a ticket for ``subject_id`` doing ``action`` on ``target`` must satisfy;
    ``PolicyDenied`` (403 ``subject_denied``) when the policy would deny the action itself, and
    422 ``approval_not_required`` when it would allow it without a ticket (such a ticket could
    never be redeemed, and would only sit in the approvers' queue)."""
    subject = _stepped_up(subject_id, subject_kind)
    if subject_idp_groups:
        # A person signed in through OIDC asking for their own ticket: the IdP groups of their
        # session, which bind roles as they will when the ticket is redeemed.
        subject["idp_groups"] = list(subject_idp_groups)
    decision = decide(engine, config.environments, subject, actions.get(action), target,
                      {"correlation_id": correlation_id, "command_hash": command_hash})
    if decision.decision == "deny":
        raise PolicyDenied(
            "the subject may not perform the action this ticket is for",
            code="subject_denied", reasons=list(decision.reasons),
        )
    if decision.decision != "require_approval":
        raise SchemaValidationFailed(
            f"{action} in {target.env} needs no approval for {subject_id}: run it without a "
            "ticket", code="approval_not_required",
            errors=[{"pointer": "/env", "message": "the action needs no approval here"}],
        )
    return requirements(
        decision.approval,
        default_ttl_s=config.approvals.default_ttl_s,
        default_pending_ttl_s=config.approvals.pending_ttl_s,
    )


@dataclass(frozen=True, slots=True)
class ReviewerFacts:
    roles: Sequence[str]
    groups: Sequence[str]


def reviewer_facts(
    engine: PolicyEngine, subject_id: str, action: str, idp_groups: Sequence[str] = ()
) -> ReviewerFacts:
    """``subject_id``'s roles and groups in the serving revision, for deciding ``action`` (with
    the roles its OIDC session's IdP groups are bound to)."""
    facts = engine.facts(subject_id, action, idp_groups)
    return ReviewerFacts(tuple(facts["roles"]), tuple(facts["groups"]))


def review_target(ticket: TicketRecord) -> Target:
    """What a request about ``ticket`` (read, review, revoke) acts on: owned by its subject."""
    return Target(
        resource=ticket.resource,
        env=ticket.env,
        id=ticket.id,
        owner=ticket.subject_id,
        attributes={"target_action": ticket.action, "requested_by": ticket.requested_by},
        record=ticket,
    )


@dataclass(frozen=True, slots=True)
class Candidate:
    """Someone who might review: a subject id and the kind of principal it is."""

    subject_id: str
    kind: str


def suggested_reviewers(
    engine: PolicyEngine,
    config: Config,
    candidates: Iterable[Candidate],
    ticket: TicketRecord,
    now: float,
) -> list[str]:
    """The candidates whose approval the review endpoint would accept now, sorted.

    The same two gates a review passes: the policy allows ``approvals.review`` of the ticket
    to the candidate (stepped up), and ``decide_review`` finds no rule against them. A pending
    ticket only: nobody can review a closed one.
    """
    if ticket.state != "pending":
        return []
    action, target = actions.get("approvals.review"), review_target(ticket)
    found: list[str] = []
    for candidate in candidates:
        decision = decide(engine, config.environments,
                          _stepped_up(candidate.subject_id, candidate.kind), action, target,
                          {"correlation_id": "suggested-reviewers", "command_hash": None})
        if decision.decision != "allow":
            continue
        facts = reviewer_facts(engine, candidate.subject_id, "approvals.review")
        try:
            decide_review(ticket, reviewer=candidate.subject_id, reviewer_kind=candidate.kind,
                          reviewer_roles=facts.roles, reviewer_groups=facts.groups,
                          decision="approve", reason=None, now=now)
        except NotEligibleReviewer:
            continue
        found.append(candidate.subject_id)
    return sorted(found)
