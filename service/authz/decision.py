"""The one decision type: allow | deny | require_approval, parsed strictly from policy output."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

__all__ = [
    "DEFAULT_APPROVAL",
    "POLICY_ERROR",
    "PRODUCTION_UPGRADE",
    "Decision",
    "MalformedDecision",
    "enforce_production_rule",
    "parse_decision",
]

DecisionValue = Literal["allow", "deny", "require_approval"]
_VALUES = ("allow", "deny", "require_approval")

#: Reason attached to every fail-closed deny (error, undefined, malformed output).
POLICY_ERROR = "policy_error"
#: Reason added when a production allow of a ticketed action is upgraded (hard rule 1).
PRODUCTION_UPGRADE = "production_mutation_requires_approval"

#: What a ticket must satisfy when the code (not the policy) upgrades a production allow.
DEFAULT_APPROVAL: Mapping[str, Any] = MappingProxyType(
    {
        "quorum": 1,
        "reviewer_roles": ["approver", "admin"],
        "require_groups": [],
        "ttl_s": 900,
        "pending_ttl_s": 3600,
        "step_up": True,
        "humans_only": True,
        "self_review": False,
    }
)

# Reasons are machine codes ("no_grant", "role:operator"), shown to callers: short and plain.
_REASON = re.compile(r"^[A-Za-z0-9_.:\-]{1,80}$")
_APPROVAL_KEYS = {
    "quorum": int,
    "reviewer_roles": list,
    "require_groups": list,
    "ttl_s": int,
    "pending_ttl_s": int,
    "step_up": bool,
    "humans_only": bool,
    "self_review": bool,
}


class MalformedDecision(ValueError):
    """The policy returned something that is not a valid decision document."""


@dataclass(frozen=True)
class Decision:
    """One authorization decision, as the chain consumes it."""

    decision: DecisionValue
    reasons: tuple[str, ...]
    approval: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    revision: str = ""
    decision_id: str = ""
    cached: bool = False

    @property
    def allowed(self) -> bool:
        return self.decision == "allow"

    def to_dict(self) -> dict[str, Any]:
        """The wire shape (what ``cpctl policy eval`` prints and the service logs)."""
        return {
            "decision": self.decision,
            "reasons": list(self.reasons),
            "approval": _plain(self.approval),
            "revision": self.revision,
            "decision_id": self.decision_id,
        }


def deny(reason: str, revision: str = "", decision_id: str = "") -> Decision:
    """A deny with one reason (used for every fail-closed path)."""
    return Decision("deny", (reason,), MappingProxyType({}), revision, decision_id)


def parse_decision(raw: Any, revision: str = "", decision_id: str = "") -> Decision:
    """Validate the policy output strictly; ``MalformedDecision`` on any deviation."""
    if not isinstance(raw, Mapping):
        raise MalformedDecision("decision is not an object")
    extra = set(raw) - {"decision", "reasons", "approval"}
    if extra:
        raise MalformedDecision(f"unknown decision field(s): {sorted(extra)}")
    value = raw.get("decision")
    if value not in _VALUES:
        raise MalformedDecision("decision must be allow, deny or require_approval")
    reasons = raw.get("reasons", [])
    if not isinstance(reasons, list) or not all(
        isinstance(r, str) and _REASON.match(r) for r in reasons
    ):
        raise MalformedDecision("reasons must be a list of reason codes")
    approval = raw.get("approval", {})
    if not isinstance(approval, Mapping):
        raise MalformedDecision("approval must be an object")
    if value == "require_approval":
        _check_approval(approval)
    elif approval:
        raise MalformedDecision("approval is only meaningful with require_approval")
    if value == "deny" and not reasons:
        raise MalformedDecision("a deny needs at least one reason")
    return Decision(value, tuple(reasons), MappingProxyType(dict(approval)), revision, decision_id)


def enforce_production_rule(decision: Decision, *, ticketed: bool, production: bool) -> Decision:
    """Hard rule 1, the one body: a production ``allow`` of a ticketed action becomes
    ``require_approval`` (with ``DEFAULT_APPROVAL``), whatever the policy returned.

    The engine applies it to every decision (so ``cpctl policy eval`` shows what the service
    does) and the chain re-asserts it through this same function, so a decision that did not come
    from the engine cannot skip it.
    """
    if decision.decision != "allow" or not ticketed or not production:
        return decision
    return Decision(
        "require_approval",
        (*decision.reasons, PRODUCTION_UPGRADE),
        DEFAULT_APPROVAL,
        decision.revision,
        decision.decision_id,
        decision.cached,
    )


def _check_approval(approval: Mapping[str, Any]) -> None:
    for key, value in approval.items():
        want = _APPROVAL_KEYS.get(key)
        if want is None:
            raise MalformedDecision(f"unknown approval field {key!r}")
        # bool is an int subclass: a quorum of True must not pass as 1.
        if not isinstance(value, want) or (want is int and isinstance(value, bool)):
            raise MalformedDecision(f"approval.{key} has the wrong type")
        if isinstance(value, list) and not all(isinstance(v, str) for v in value):
            raise MalformedDecision(f"approval.{key} must list strings")
    quorum = approval.get("quorum")
    if not isinstance(quorum, int) or quorum < 1:
        raise MalformedDecision("approval.quorum must be an integer >= 1")
    if len(approval.get("require_groups", [])) > quorum:
        raise MalformedDecision("approval.require_groups cannot exceed quorum")
    if approval.get("self_review", False) or approval.get("humans_only", True) is False:
        # The service never lets a subject approve its own ticket nor an agent approve at all.
        raise MalformedDecision("approval may not allow self review or non-human reviewers")


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
