"""What the approval workflow asks the policy: the one place handlers reach the engine.

- ``ticket_requirements``: when a ticket is requested, the policy is asked the question the
  executing request will ask (the subject who will run it, the action, the resource, the env),
  through the chain's own AuthZ stage; a ``deny`` refuses the ticket, and the decision's
  ``approval`` object says what the ticket needs (quorum, groups, roles, ttl).
- ``reviewer_facts``: a reviewer's roles and groups from policy data, as the policy sees them
  deciding the review (never from tokens: hard rule 2).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..authz import actions
from ..authz.decide import decide
from ..authz.engine import PolicyEngine
from ..config import Config
from ..errors import PolicyDenied
from ..run import Target
from .tickets import Requirements, requirements

__all__ = ["ReviewerFacts", "reviewer_facts", "ticket_requirements"]


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
    ``PolicyDenied`` (403 ``subject_denied``) when the policy would deny the action itself."""
    # The subject as it will present itself: authenticated and stepped up (a ticket is only
    # redeemed with a fresh step-up), its session unknown yet.
    subject: dict[str, Any] = {
        "subject_id": subject_id, "kind": subject_kind, "session_id": None,
        "auth_time": None, "authn_method": None,
        "step_up": {"verified": True, "at": None, "age_s": None},
    }
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
