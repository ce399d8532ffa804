"""Stage 2 of the chain (AuthZ): one decision for a request, hard rule 1 re-asserted."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..config import Environments
from ..run import Target
from .actions import Action
from .decision import Decision, enforce_production_rule
from .engine import PolicyEngine
from .input import build_input

__all__ = ["decide"]


def decide(
    engine: PolicyEngine,
    environments: Environments,
    principal: Mapping[str, Any],
    action: Action,
    target: Target,
    context: Mapping[str, Any],
) -> Decision:
    """The policy's decision on ``principal`` (its input form) doing ``action`` to ``target``.

    The engine already applies the production rule; it is applied again here through the same
    function, so a production mutation is never a plain ``allow`` whatever answered.
    """
    decision = engine.decide(
        build_input(principal, action.name, target.policy_resource(action), target.env, context)
    )
    return enforce_production_rule(
        decision,
        ticketed=action.needs_ticket_in_production,
        production=environments.is_production(target.env),
    )
