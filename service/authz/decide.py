"""Stage 2 of the chain (AuthZ): one decision for a request, hard rule 1 re-asserted."""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from ..config import Environments
from ..run import Target
from .actions import Action
from .decision import Decision, enforce_production_rule
from .engine import PolicyEngine
from .input import build_input

__all__ = ["Observer", "decide", "observe"]

log = logging.getLogger("controlplane.authz")

#: Sees every decision of the chain with its input (the decision log, shadow evaluation). It must
#: return at once (queue the work; never evaluate on the request path) and cannot change it.
Observer = Callable[[Mapping[str, Any], Decision], None]

_observers: weakref.WeakKeyDictionary[PolicyEngine, tuple[Observer, ...]] = (
    weakref.WeakKeyDictionary()
)


def observe(engine: PolicyEngine, observer: Observer) -> Callable[[], None]:
    """Register ``observer`` for ``engine``'s chain decisions; returns the unregister call."""
    _observers[engine] = (*_observers.get(engine, ()), observer)

    def remove() -> None:
        _observers[engine] = tuple(o for o in _observers.get(engine, ()) if o is not observer)

    return remove


def decide(
    engine: PolicyEngine,
    environments: Environments,
    principal: Mapping[str, Any],
    action: Action,
    target: Target,
    context: Mapping[str, Any],
    *,
    observed: bool = False,
) -> Decision:
    """The policy's decision on ``principal`` (its input form) doing ``action`` to ``target``.

    The engine already applies the production rule; it is applied again here through the same
    function, so a production mutation is never a plain ``allow`` whatever answered.
    ``observed``: a request's own decision (the chain's AuthZ stage), which the observers see;
    the workflow's what-if questions (a ticket's requirements, suggested reviewers) are not
    requests, and neither the decision log nor shadow evaluation counts them.
    """
    input_doc = build_input(
        principal, action.name, target.policy_resource(action), target.env, context
    )
    decision = enforce_production_rule(
        engine.decide(input_doc),
        ticketed=action.needs_ticket_in_production,
        production=environments.is_production(target.env),
    )
    for observer in _observers.get(engine, ()) if observed else ():
        try:
            observer(input_doc, decision)
        except Exception:  # an observer never changes or fails a decision
            log.exception("decision observer failed")
    return decision
