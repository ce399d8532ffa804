"""Stage 2 of the chain (AuthZ): one decision for a request, hard rule 1 re-asserted."""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from .. import clock
from ..authn.principal import Principal
from ..config import Environments
from ..run import AS_SENT, Target
from .actions import Action
from .decision import Decision, enforce_production_rule
from .engine import AUDITED, PolicyEngine
from .input import STRIPPED_CONTEXT_FIELDS, build_input

__all__ = ["Observer", "decide", "decide_run", "observe"]

log = logging.getLogger("controlplane.authz")

#: The context fields ``decide`` may be given apart (``correlation_id``, ``at``).
_GIVEN_APART = frozenset(STRIPPED_CONTEXT_FIELDS)

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


def decide_run(
    engine: PolicyEngine,
    environments: Environments,
    principal: Principal,
    action: Action,
    target: Target,
    *,
    method: str,
    path: str,
    command_hash: str | None,
    now: float,
    step_up_window_s: float,
    correlation_id: str,
) -> Decision:
    """The chain's AuthZ: ``decide`` (observed, its decision logged by the run's audit record
    only) on ``principal`` doing ``action`` to ``target`` with the request's context.

    Where the input document is a function of the facts it is built from alone (no step-up,
    whose age moves with the clock; the resource as sent, which the target's hash names; no
    attributes), those facts key the engine's ``recall``: a question the serving revision has
    answered is answered again without building the input or evaluating (a new decision id,
    counted as a cache hit), and the production rule is re-asserted on it as ``decide`` does.
    With observers (the decision log, shadow evaluation), which see every decision's whole
    input document, every decision takes ``decide``."""
    facts = None
    if principal.step_up_at is None and not target.attributes and target.value is AS_SENT:
        facts = (principal.subject_id, principal.kind, principal.session_id,
                 principal.auth_time, principal.authn_method, principal.idp_groups,
                 action.name, target.id, target.hash, target.env, target.owner,
                 method, path, command_hash)
        recalled = None if _observers.get(engine) else engine.recall(facts)
        if recalled is not None:
            return _production_rule(recalled, action, environments, target.env)
    token = AUDITED.set(True)
    try:
        return decide(engine, environments, principal.to_input(now, step_up_window_s), action,
                      target, {"method": method, "path": path, "command_hash": command_hash},
                      observed=True, correlation_id=correlation_id, at=now, facts=facts)
    finally:
        AUDITED.reset(token)


def decide(
    engine: PolicyEngine,
    environments: Environments,
    principal: Mapping[str, Any],
    action: Action,
    target: Target,
    context: Mapping[str, Any],
    *,
    observed: bool = False,
    correlation_id: str | None = None,
    at: float | None = None,
    facts: tuple[Any, ...] | None = None,
) -> Decision:
    """The policy's decision on ``principal`` (its input form) doing ``action`` to ``target``.

    The engine already applies the production rule; it is applied again here through the same
    function, so a production mutation is never a plain ``allow`` whatever answered.
    ``observed``: a request's own decision (the chain's AuthZ stage), which the observers see;
    the workflow's what-if questions (a ticket's requirements, suggested reviewers) are not
    requests, and neither the decision log nor shadow evaluation counts them.

    ``correlation_id`` and ``at`` (a request's, the chain's): the context fields the policy
    never sees (``STRIPPED_CONTEXT_FIELDS``), given apart from ``context``, which then holds
    none of them. The engine is given the input as the policy sees it, with nothing to strip
    (one copy of it less per request, and no time formatted), and the observers the whole
    document with both fields in its context. ``facts``: the engine's (``decide_run``).
    """
    input_doc = build_input(
        principal, action.name, target.policy_resource(action), target.env, context
    )
    apart = correlation_id is not None or at is not None
    if apart and not _GIVEN_APART.isdisjoint(context):
        raise ValueError("the context holds a field given apart (correlation_id, time)")
    decision = _production_rule(
        engine.decide(input_doc, stripped=True, facts=facts) if apart
        else engine.decide(input_doc, facts=facts), action, environments, target.env)
    observers = _observers.get(engine, ()) if observed else ()
    if observers and apart:
        input_doc = {**input_doc, "context": {
            **input_doc["context"], "correlation_id": correlation_id, "time": clock.iso(at)}}
    for observer in observers:
        try:
            observer(input_doc, decision)
        except Exception:  # an observer never changes or fails a decision
            log.exception("decision observer failed")
    return decision


def _production_rule(decision: Decision, action: Action, environments: Environments,
                     env: str) -> Decision:
    """Hard rule 1 on ``decision`` of ``action`` in ``env`` (``enforce_production_rule``)."""
    return enforce_production_rule(decision, ticketed=action.needs_ticket_in_production,
                                   production=environments.is_production(env))
