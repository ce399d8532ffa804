"""Every typed key for application and request state (aiohttp ``AppKey``/``RequestKey``).

Each app key is set by the one startup context that opens its value (listed in order in
``app.py``); handlers and the chain read them, nothing else sets them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from .authn.principal import Principal
from .config import Config

if TYPE_CHECKING:
    from .audit.log import AuditLog
    from .authn.federation import Federation
    from .authn.sessions import Authenticator
    from .authz.activations import ActivationSigner
    from .authz.decisionlog import DecisionLog
    from .authz.engine import PolicyEngine
    from .authz.reload import StoreFollower
    from .authz.revisions import TrustedKeys
    from .authz.shadow import Shadow
    from .compose.evaluator import EvaluatorPool
    from .compose.preflight import RuleSet
    from .consolesession import ConsoleSession
    from .health import Reporter
    from .middleware.metrics import Metrics, StoreGauges
    from .notifications.dispatcher import Dispatcher
    from .signin import ConsoleLanding
    from .storelink import StoreLink
    from .streams import StreamSlots

__all__ = [
    "AUDIT",
    "AUTHENTICATOR",
    "AUTHN_ERROR",
    "COMPONENTS",
    "COMPOSE_EVALUATOR",
    "COMPOSE_RULES",
    "CONFIG",
    "CONSOLE_LANDING",
    "CONSOLE_SESSION",
    "CORRELATION_ID",
    "DECISION_LOG",
    "ENGINE",
    "FEDERATION",
    "METRICS",
    "NOTIFICATIONS",
    "POLICY_ACTIVATION_SIGNER",
    "POLICY_FOLLOWER",
    "POLICY_KEYS",
    "PRINCIPAL",
    "SHADOW",
    "STARTED_AT",
    "STORE",
    "STORE_GAUGES",
    "STREAMS",
]

CONFIG = web.AppKey("config", Config)
STARTED_AT = web.AppKey("started_at", float)
#: Metrics registry and instruments.
METRICS: web.AppKey[Metrics] = web.AppKey("metrics")
#: The store's part of /metrics, read at most once a second (``middleware.metrics.StoreGauges``).
STORE_GAUGES: web.AppKey[StoreGauges] = web.AppKey("store_gauges")
#: Per-component status reporters for /readyz and system/info (``service.health``).
COMPONENTS: web.AppKey[dict[str, Reporter]] = web.AppKey("components")
#: The policy engine (compiled revision, hot reload).
ENGINE: web.AppKey[PolicyEngine] = web.AppKey("engine")
#: The public keys trusted to sign policy revisions (``policies.store.trusted_keys``).
POLICY_KEYS: web.AppKey[TrustedKeys] = web.AppKey("policy_keys")
#: This replica's activation key (``policies.store.activation_key``), None when not configured
#: or unreadable: activations and rollbacks executed here are signed with it.
POLICY_ACTIVATION_SIGNER: web.AppKey[ActivationSigner | None] = web.AppKey(
    "policy_activation_signer")
#: With ``policies.source: store``: what keeps this process on the fleet's active revision.
POLICY_FOLLOWER: web.AppKey[StoreFollower | None] = web.AppKey("policy_follower")
#: Set by ``_decision_observers`` only when configured (``decision_log.path``,
#: ``policies.candidate_dir`` or ``.candidate_revision``).
DECISION_LOG: web.AppKey[DecisionLog] = web.AppKey("decision_log")
SHADOW: web.AppKey[Shadow] = web.AppKey("shadow")
#: The compose preflight rule set.
COMPOSE_RULES: web.AppKey[RuleSet] = web.AppKey("compose_rules")
#: The processes that evaluate compose reports (``service.compose.evaluator``).
COMPOSE_EVALUATOR: web.AppKey[EvaluatorPool] = web.AppKey("compose_evaluator")
#: The store as this worker sees it: connected, or not (yet), with the reason.
STORE: web.AppKey[StoreLink] = web.AppKey("store")
#: The audit log over the store.
AUDIT: web.AppKey[AuditLog] = web.AppKey("audit")
#: Logins, bearer tokens, step-up (identities and signing keys loaded at startup).
AUTHENTICATOR: web.AppKey[Authenticator] = web.AppKey("authenticator")
#: The notification outbox dispatcher of this process (``service.notifications``).
NOTIFICATIONS: web.AppKey[Dispatcher] = web.AppKey("notifications")
#: Identity federation: OIDC sign-in of people, RFC 8693 token exchange of workloads.
FEDERATION: web.AppKey[Federation] = web.AppKey("federation")
#: How a sign-in at a provider started for the console ends (set by ``setup_console``).
CONSOLE_LANDING: web.AppKey[ConsoleLanding] = web.AppKey("console_landing")
#: Open live streams (SSE), capped per principal and per worker; told to stop on shutdown.
STREAMS: web.AppKey[StreamSlots] = web.AppKey("streams")

CORRELATION_ID = web.RequestKey("correlation_id", str)
#: Who is calling: a Principal, or ANONYMOUS. Set by the authn middleware on every request.
PRINCIPAL = web.RequestKey("principal", Principal)
#: On a console request (``consolesession.CONSOLE_PREFIX``): the session its cookie stands
#: for (its CSRF token, its step-up), or None. Set by the authn middleware with ``PRINCIPAL``.
CONSOLE_SESSION: web.RequestKey[ConsoleSession | None] = web.RequestKey("console_session")
#: The stable code of a presented token that failed verification (for the chain's 401).
AUTHN_ERROR = web.RequestKey("authn_error", str)
