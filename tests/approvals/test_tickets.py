"""Review rules in code: separation of duties, distinct reviewers, and the group quorum (AND)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from service.approvals.binding import hash_nonce, nonce_matches, resource_hash
from service.approvals.tickets import (
    NotEligibleReviewer,
    decide_review,
    new_ticket,
    requirements,
    ticket_view,
)

NOW = 1_800_000_000.0


def ticket(**approval):
    req = requirements(approval, default_ttl_s=900, default_pending_ttl_s=3600)
    record, nonce = new_ticket(subject_id="alice", env="prod", resource={"app": "web"},
                               action="installer.run.execute", command_hash=None, reason=None,
                               requested_by="alice", req=req, now=NOW)
    return record, nonce


def review(t, reviewer, groups=(), roles=("approver",), decision="approve", kind="human"):
    return decide_review(t, reviewer=reviewer, reviewer_kind=kind, reviewer_roles=roles,
                         reviewer_groups=groups, decision=decision, reason=None, now=NOW + 1)


def apply(t, outcome):
    state = outcome.new_state or t.state
    return replace(t, reviews=(*t.reviews, outcome.review), state=state,
                   expires_at=outcome.approved_expires_at)


def test_new_ticket_binds_hashes_and_keeps_only_the_nonce_hash():
    t, nonce = ticket()
    assert t.state == "pending" and t.resource_hash == resource_hash({"app": "web"})
    assert t.nonce_hash == hash_nonce(nonce) and nonce not in str(t)
    assert nonce_matches(nonce, t.nonce_hash) and not nonce_matches(nonce + "x", t.nonce_hash)
    assert len(nonce) >= 22
    view = ticket_view(t)
    assert "nonce" not in view and view["quorum"] == 1 and view["pending_until"]


def test_one_approval_from_each_required_group():
    t, _ = ticket(quorum=2, require_groups=["sre-approvers", "security"])
    first = review(t, "bob", groups=["sre-approvers"])
    assert first.new_state is None and first.review.group == "sre-approvers"
    t = apply(t, first)
    # A second SRE cannot fill the security slot.
    with pytest.raises(NotEligibleReviewer) as refused:
        review(t, "erin", groups=["sre-approvers"])
    assert refused.value.code == "reviewer_group_required"
    second = review(t, "dave", groups=["security"])
    assert second.new_state == "approved" and second.review.group == "security"
    assert second.approved_expires_at == NOW + 1 + 900


def test_quorum_larger_than_groups_counts_distinct_reviewers():
    t, _ = ticket(quorum=3, require_groups=["security"])
    t = apply(t, review(t, "dave", groups=["security"]))
    t = apply(t, outcome := review(t, "bob"))
    assert outcome.new_state is None
    assert review(t, "erin").new_state == "approved"


def test_quorum_is_at_least_the_number_of_required_groups():
    t, _ = ticket(quorum=1, require_groups=["a", "b"])
    assert ticket_view(t)["quorum"] == 2


@pytest.mark.parametrize(
    ("reviewer", "kind", "roles", "code"),
    [
        pytest.param("alice", "human", ("approver",), "self_review", id="subject-and-requester"),
        pytest.param("agent-7", "agent", ("approver",), "reviewer_not_human", id="agent"),
        pytest.param("ci-bot", "service", ("approver",), "reviewer_not_human", id="service"),
        pytest.param("carol", "human", ("viewer",), "reviewer_role_required", id="no-role"),
    ],
)
def test_who_can_never_review(reviewer, kind, roles, code):
    t, _ = ticket(reviewer_roles=["approver", "admin"])
    with pytest.raises(NotEligibleReviewer) as refused:
        review(t, reviewer, roles=roles, kind=kind)
    assert refused.value.code == code


def test_requester_for_someone_else_cannot_review_either():
    req = requirements({}, default_ttl_s=900, default_pending_ttl_s=3600)
    t, _ = new_ticket(subject_id="alice", env="prod", resource="web", action="installer.run.execute",
                      command_hash=None, reason=None, requested_by="erin", req=req, now=NOW)
    with pytest.raises(NotEligibleReviewer):
        review(t, "erin", roles=("admin",))


def test_a_reviewer_counts_once_and_any_reject_rejects():
    t, _ = ticket(quorum=2)
    t = apply(t, review(t, "bob"))
    with pytest.raises(NotEligibleReviewer) as refused:
        review(t, "bob")
    assert refused.value.code == "duplicate_review"
    assert review(t, "dave", decision="reject").new_state == "rejected"


@pytest.mark.parametrize(
    "approval",
    [{"quorum": True}, {"quorum": -4}, {"ttl_s": "900"}, {"require_groups": "security"}],
)
def test_bad_policy_values_fall_back_to_safe_defaults(approval):
    req = requirements(approval, default_ttl_s=900, default_pending_ttl_s=3600)
    assert req.quorum >= 1 and req.ttl_s == 900 and isinstance(req.require_groups, tuple)
