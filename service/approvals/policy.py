"""What the approval workflow asks the policy: the one place handlers reach the engine.

- ``ticket_requirements``: when a ticket is requested, the policy is asked the question the
  executing request will ask (the subject who will run it, the action, the resource, the env),
  through the chain's own AuthZ stage; a ``deny`` refuses the ticket, and the decision's
  ``approval`` object says what the ticket needs (quorum, groups, roles, ttl).
- ``reviewer_facts``: a reviewer's roles and groups from policy data, as the policy sees them
  deciding the review (never from tokens: hard rule 2), with the roles the IdP groups of an
  OIDC session are bound to (``group_bindings``).
- ``check_review``: **the one function that decides who may review**, used by the review
  endpoint, the console (inbox, ticket page) and ``suggested_reviewers`` alike: the reviewer's
  facts (IdP groups included), then ``tickets.decide_review`` (humans only, never the subject or
  requester, one review each, reviewer roles, the groups still missing). Its refusal
  (``NotEligibleReviewer``) names the missing role or group, wherever it is shown.
- ``review_target``: what a review (or read, or revoke) of a ticket acts on, for the chain.
- ``suggested_reviewers``: who could approve a ticket now: the policy's decision on
  ``approvals.review`` for them, then ``check_review``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..authn.identities import IdentityDirectory
from ..authz import actions
from ..authz.decide import decide
from ..authz.engine import PolicyEngine
from ..config import Config
from ..errors import PolicyDenied, SchemaValidationFailed
from ..run import Target
from ..store.base import Store, TicketRecord
from .tickets import NotEligibleReviewer, Requirements, ReviewOutcome, decide_review, requirements

__all__ = [
    "Reviewer",
    "ReviewerFacts",
    "check_review",
    "review_refusal",
    "review_target",
    "reviewer_candidates",
    "reviewer_facts",
    "suggested_reviewers",
    "ticket_requirements",
]


def _stepped_up(subject_id: str, kind: str, idp_groups: Sequence[str] = ()) -> dict[str, object]:
    # A subject as it will present itself to act: authenticated and stepped up (production
    # tickets are only redeemed and reviewed with a fresh step-up), its session unknown yet.
    doc: dict[str, object] = {
        "subject_id": subject_id, "kind": kind, "session_id": None,
        "auth_time": None, "authn_method": None,
        "step_up": {"verified": True, "at": None, "age_s": None},
    }
    if idp_groups:
        # A person who signs in through OIDC: their IdP groups bind roles (``group_bindings``).
        doc["idp_groups"] = list(idp_groups)
    return doc


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
    # A person signed in through OIDC asking for their own ticket: the IdP groups of their
    # session bind roles as they will when the ticket is redeemed.
    subject = _stepped_up(subject_id, subject_kind, subject_idp_groups)
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
class Reviewer:
    """Someone who reviews, or might: a subject id, the kind of principal it is, and the IdP
    groups (``<provider>:<group>``) of their OIDC session (for a candidate who is not signed
    in: those their last sign-in asserted)."""

    subject_id: str
    kind: str
    idp_groups: tuple[str, ...] = ()



def check_review(engine: PolicyEngine, ticket: TicketRecord, reviewer: Reviewer, *,
                 decision: str, reason: str | None, now: float) -> ReviewOutcome:
    """Whether ``reviewer`` may give ``decision`` on ``ticket`` now: the review record and the
    transition it causes, or ``NotEligibleReviewer`` (a stable code, and a detail naming the
    role or group that is missing).

    The one decision on who may review: the review endpoint applies it, the console dry-runs
    it (inbox, ticket page) and ``suggested_reviewers`` asks it of each candidate. Roles and
    groups come from the serving policy data, with the roles ``reviewer.idp_groups`` are bound
    to, never from a token.
    """
    facts = reviewer_facts(engine, reviewer.subject_id, "approvals.review", reviewer.idp_groups)
    return decide_review(ticket, reviewer=reviewer.subject_id, reviewer_kind=reviewer.kind,
                         reviewer_roles=facts.roles, reviewer_groups=facts.groups,
                         decision=decision, reason=reason, now=now)


def review_refusal(engine: PolicyEngine, ticket: TicketRecord, reviewer: Reviewer, now: float,
                   decision: str = "approve") -> NotEligibleReviewer | None:
    """``check_review`` as a dry run: why ``reviewer`` may not give ``decision`` (None: they may).
    A ticket that is no longer pending refuses everyone (``state_conflict``)."""
    if ticket.state != "pending":
        return NotEligibleReviewer("state_conflict", "the ticket is no longer pending")
    try:
        check_review(engine, ticket, reviewer, decision=decision, reason=None, now=now)
    except NotEligibleReviewer as exc:
        return exc
    return None


def suggested_reviewers(
    engine: PolicyEngine,
    config: Config,
    candidates: Iterable[Reviewer],
    ticket: TicketRecord,
    now: float,
) -> list[str]:
    """The candidates whose approval the review endpoint would accept now, sorted.

    The same two gates a review passes: the policy allows ``approvals.review`` of the ticket
    to the candidate (stepped up, with their IdP groups), and ``check_review`` finds no rule
    against them. A pending ticket only: nobody can review a closed one.
    """
    if ticket.state != "pending":
        return []
    action, target = actions.get("approvals.review"), review_target(ticket)
    found: set[str] = set()
    for candidate in candidates:
        decision = decide(engine, config.environments,
                          _stepped_up(candidate.subject_id, candidate.kind, candidate.idp_groups),
                          action, target,
                          {"correlation_id": "suggested-reviewers", "command_hash": None})
        if decision.decision == "allow" and review_refusal(engine, ticket, candidate, now) is None:
            found.add(candidate.subject_id)
    return sorted(found)


#: At most this many federated people are considered as candidates (by subject id).
FEDERATED_CANDIDATES_MAX = 1000


async def reviewer_candidates(store: Store, identities: IdentityDirectory) -> list[Reviewer]:
    """Everyone who might review: the active identities of the identities file, and the people
    federated sign-in has seen (just-in-time, no entry in that file) with the IdP groups
    (``<provider>:<group>``) their most recent session still kept was given. A federated person
    whose sessions have all been purged has no groups on record: only their subject's own
    bindings in policy data count for them until they sign in again."""
    found = [Reviewer(i.subject_id, i.kind) for i in identities if not i.disabled]
    for seen in await store.list_federated_subjects(FEDERATED_CANDIDATES_MAX):
        if identities.get(seen.subject_id) is not None:
            continue  # a local subject an explicit link signs in as: listed above
        facts = await store.last_federated_session(seen.subject_id)
        groups = tuple(f"{facts.provider}:{g}" for g in facts.groups) if facts else ()
        found.append(Reviewer(seen.subject_id, seen.kind, groups))
    return found
