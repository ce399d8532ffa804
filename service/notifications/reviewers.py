"""Who an ``approval.requested`` event names as suggested reviewers.

Computed when the event is delivered, from the policy data and identities serving then and the
ticket as it is then (reviews already given count), by ``approvals.policy.suggested_reviewers``:
the review endpoint's own rules. The candidates (``reviewer_candidates``) include the people
federated sign-in has seen, with their IdP groups. A retry may so name fewer people than the
first attempt did.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..approvals.policy import reviewer_candidates, suggested_reviewers
from ..authn.identities import IdentityDirectory
from ..authz.engine import PolicyEngine
from ..config import Config
from ..store.base import OutboxEvent, Store
from .dispatcher import ReviewersOf

__all__ = ["reviewers_of"]


def reviewers_of(engine: PolicyEngine, config: Config,
                 identities: Callable[[], IdentityDirectory]) -> ReviewersOf:
    """The dispatcher's ``reviewers`` callback over the live engine and identity directory."""

    async def reviewers(store: Store, event: OutboxEvent, now: float) -> Sequence[str] | None:
        if event.type != "approval.requested":
            return None
        ticket = await store.get_ticket(event.ticket_id)
        if ticket is None:
            return []
        candidates = await reviewer_candidates(store, identities())
        return suggested_reviewers(engine, config, candidates, ticket, now)

    return reviewers
