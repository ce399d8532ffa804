"""Component status: one reporter per component, read by system/info, the status surfaces and
``/readyz``.

A reporter returns a status object, at least ``{"status": ready|placeholder|degraded}``, and never
a token, a session, a DSN, a raw policy or a per-subject decision (hard rule 4).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from . import clock
from .audit.log import AUDIT
from .authn.federation import FEDERATION
from .authn.sessions import AUTHENTICATOR
from .authz.decisionlog import DECISION_LOG
from .authz.engine import ENGINE
from .authz.reload import POLICY_FOLLOWER
from .authz.shadow import SHADOW
from .compose.evaluator import COMPOSE_RULES
from .config import CONFIG
from .storelink import STORE

__all__ = [
    "COMPONENTS",
    "READY_REQUIRES",
    "Reporter",
    "aggregate",
    "component_status",
    "component_statuses",
    "register_component",
    "setup_health",
]

#: A component reporter returns a status object: at least ``{"status": ready|placeholder|degraded}``.
Reporter = Callable[[], Awaitable[dict[str, Any]]]


#: Per-component status reporters for /readyz and system/info (``service.health``).
COMPONENTS: web.AppKey[dict[str, Reporter]] = web.AppKey("components")

#: Components that must be ``ready`` for /readyz (when the application has them).
READY_REQUIRES = ("config", "store", "policies", "audit")

_PLACEHOLDER_DETAIL = {
    "authn": "authentication is not configured in this build",
    "authz": "the policy engine is not configured in this build",
}


def register_component(app: web.Application, name: str, reporter: Reporter) -> None:
    """Make ``name`` visible in system/info (and /readyz when it is required)."""
    app[COMPONENTS][name] = reporter


async def component_statuses(app: web.Application) -> dict[str, dict[str, Any]]:
    """Every registered component's status object."""
    return {name: await _report(reporter) for name, reporter in app[COMPONENTS].items()}


async def component_status(app: web.Application, name: str) -> dict[str, Any]:
    """One component's status object (a placeholder when it is not part of this application)."""
    reporter = app[COMPONENTS].get(name)
    if reporter is None:
        return {"status": "placeholder", "detail": _PLACEHOLDER_DETAIL.get(name, "not configured")}
    return await _report(reporter)


async def _report(reporter: Reporter) -> dict[str, Any]:
    try:
        return await reporter()
    except Exception:
        # A reporter that fails is itself a finding; its error text stays in our logs.
        return {"status": "degraded", "detail": "status check failed"}


def aggregate(statuses: dict[str, dict[str, Any]]) -> str:
    """``degraded`` if any component is; ``ready`` if all are; else ``placeholder``."""
    values = [s.get("status") for s in statuses.values()]
    if "degraded" in values:
        return "degraded"
    if values and all(v == "ready" for v in values):
        return "ready"
    return "placeholder"


def setup_health(app: web.Application) -> None:
    """Register the reporters of the components ``app.py`` opens (they read the app keys when
    asked, so a reporter registered before its component opened reports it once it has)."""
    app[COMPONENTS] = {}

    async def config() -> dict[str, Any]:
        return {"status": "ready", "mode": app[CONFIG].mode}

    async def policies() -> dict[str, Any]:
        # Readiness is "decisions are correct": ready while any revision serves. A rejected
        # later revision degrades ``authz`` (with its error), never readiness: one bad push
        # must not take every replica out of the load balancer at once.
        status = app[ENGINE].status()
        if status.get("serving"):
            return {"status": "ready", "revision": status.get("revision")}
        return {"status": "degraded", "revision": None,
                "detail": "no policy revision could be loaded"}

    async def authz() -> dict[str, Any]:
        status = app[ENGINE].status()
        shadow, sink = app.get(SHADOW), app.get(DECISION_LOG)
        if shadow is not None:
            status["shadow"] = shadow.status()
        if sink is not None:
            status["decision_log"] = sink.status()
        follower = app.get(POLICY_FOLLOWER)
        if follower is None:
            return {**status, "distribution": {"source": "dir"}}
        # policies.source: store: a refused active revision, or not running it past the
        # convergence bound, degrades authz (the last good revision keeps serving).
        distribution = follower.status()
        if distribution.pop("degraded"):
            error = distribution["error"] or "not running the active revision"
            status = {**status, "status": "degraded", "error": error,
                      "detail": "this process does not run the fleet's active policy revision; "
                                "the previous revision keeps serving"}
        return {**status, "distribution": distribution}

    async def store() -> dict[str, Any]:
        # From memory: the link pings the store in the background (storelink.STATUS_REFRESH_S)
        # and /readyz checks it live, so an anonymous status call costs no store round trip.
        return app[STORE].current_status()

    async def authn() -> dict[str, Any]:
        if app[STORE].store is None:
            return {"status": "placeholder", "detail": "authentication needs a store"}
        status = {"status": "ready", **app[AUTHENTICATOR].status(clock.now())}
        federation = app.get(FEDERATION)
        if federation is not None:
            status["federation"] = federation.status()
        return status

    async def approvals() -> dict[str, Any]:
        if not app[CONFIG].approvals.enabled or app[STORE].store is None:
            return {"status": "placeholder", "detail": "no approval repository configured"}
        return {"status": "ready"}

    async def compose() -> dict[str, Any]:
        rules = app[COMPOSE_RULES]
        return {"status": "ready", "rules": len(rules.rules), "policy_revision": rules.revision}

    async def audit() -> dict[str, Any]:
        # From memory: degraded once this worker found the chain changed under it (audit.tip):
        # it then refuses every audit write, so every protected action would answer 503.
        log = app.get(AUDIT)
        if log is not None and not log.tip.ok:
            return {"status": "degraded",
                    "detail": "the audit chain was changed since this worker verified it; it "
                              "is not extended (cpctl audit verify --anchor <mirror>)"}
        return {"status": "ready"}

    for name, reporter in (("config", config), ("policies", policies), ("authz", authz),
                           ("store", store), ("authn", authn), ("approvals", approvals),
                           ("compose", compose), ("audit", audit)):
        register_component(app, name, reporter)
