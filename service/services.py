"""The opened subsystems of one worker: store, audit log, policy engine, authenticator.

``setup_services(app)`` registers one ``cleanup_ctx`` that opens them in dependency order on
start-up and closes them in reverse on shutdown, starts the background loops (policy reload,
ticket expiry) and registers each component's status reporter. Handlers reach them only
through the chain (``request.app[SERVICES]``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from . import clock
from .api.system import register_component
from .audit.log import AuditLog
from .authn import identities as identities_mod
from .authn.keys import KeyRing
from .authn.sessions import Authenticator, AuthnSettings
from .authz.decision import Decision
from .authz.engine import LOG_FIELDS, PolicyEngine
from .compose.preflight import RuleSet
from .config import Config
from .keys import CONFIG, SERVICES
from .store import open_store
from .store.base import Store, StoreError

__all__ = ["Services", "setup_services"]

log = logging.getLogger("controlplane.services")

EXPIRY_INTERVAL_S = 30.0
#: Expired sessions are kept this long (a day) for whoever investigates an incident, then purged.
#: No token outlives its session, and a missing session is refused like an expired one.
SESSION_RETENTION_S = 86400.0
CONNECT_RETRY_S = 2.0


@dataclass
class Services:
    """Everything a request may need beyond its own data; one instance per worker."""

    config: Config
    engine: PolicyEngine
    compose_rules: RuleSet
    store: Store | None = None
    audit: AuditLog | None = None
    authenticator: Authenticator | None = None
    store_error: str | None = None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    @property
    def approvals_enabled(self) -> bool:
        return self.config.approvals.enabled and self.store is not None

    def decide(self, input_doc: dict[str, Any]) -> Decision:
        """One policy decision (cheap, synchronous: a compiled bundle on small data)."""
        return self.engine.decide(input_doc)

    def facts(self, subject_id: str, action: str) -> dict[str, Any]:
        """The subject's roles and groups from policy data, as seen deciding ``action``."""
        return self.engine.facts(subject_id, action)

    def subject_kind(self, subject_id: str) -> str | None:
        """The kind of a known, active identity (None for unknown or disabled)."""
        if self.authenticator is None:
            return None
        identity = self.authenticator.identities.active(subject_id)
        return identity.kind if identity is not None else None


def setup_services(app: web.Application) -> None:
    """Open the subsystems on start-up, close them on shutdown (one ``cleanup_ctx``)."""

    async def services_ctx(app: web.Application) -> AsyncIterator[None]:
        config = app[CONFIG]
        # Revisions are vetted (compiled, probed, their *_test.rego run) in a child process: the
        # native engine can crash on some constructs, and that must reject the revision, not
        # kill the worker.
        engine = PolicyEngine(config.policies.dir, config.environments,
                              [f for f in config.logging.mask_fields if f in LOG_FIELDS])
        result = await asyncio.to_thread(engine.load)
        if not result.ok:
            # Serving with no policy would mean every decision is a deny: start degraded and
            # say so (readyz 503), so an orchestrator does not route traffic here.
            log.error("no policy revision could be loaded: %s", result.error)
        compose_rules = await asyncio.to_thread(RuleSet.load, config.policies.dir / "compose")
        services = Services(config=config, engine=engine, compose_rules=compose_rules)
        app[SERVICES] = services
        _register_reporters(app, services)
        if config.store.backend != "none" and not await _connect(services):
            # Start degraded rather than not at all: status surfaces stay up to say why,
            # /readyz answers 503, protected actions 503 — and the store is retried.
            services.tasks.append(asyncio.create_task(_connect_loop(services)))
        services.tasks.append(asyncio.create_task(_reload_loop(services)))
        _install_sighup(services)
        try:
            yield
        finally:
            for task in services.tasks:
                task.cancel()
            for task in services.tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
            if services.store is not None:
                await services.store.close()

    app.cleanup_ctx.append(services_ctx)


async def _connect(services: Services) -> bool:
    """Open the store and what depends on it; False (and the reason kept) when unreachable."""
    config = services.config
    url = config.store.url
    assert url is not None
    try:
        store = await open_store(url.reveal(), schema=config.store.postgres_schema)
    except StoreError as exc:
        # The message names the backend and error class only, never the DSN.
        services.store_error = str(exc)
        log.error("store unavailable: %s", exc)
        return False
    services.authenticator = await _authenticator(config, store)
    services.audit = AuditLog(store, config.audit_jsonl_path)
    services.store = store
    services.store_error = None
    services.tasks.append(asyncio.create_task(_expiry_loop(services)))
    return True


async def _connect_loop(services: Services) -> None:
    """Retry the store until it answers (each failure is logged by ``_connect``)."""
    while True:
        await asyncio.sleep(CONNECT_RETRY_S)
        if await _connect(services):
            return


#: The shipped development identities: their passwords, TOTP secrets and keys are public.
DEV_IDENTITIES = Path(__file__).resolve().parent.parent / "examples" / "identities.yaml"


async def _authenticator(config: Config, store: Store) -> Authenticator:
    settings = AuthnSettings(
        issuer=config.authn.issuer,
        audience=config.authn.audience,
        token_ttl_s=config.authn.token_ttl_s,
        step_up_window_s=config.authn.step_up_window_s,
        clock_skew_s=config.authn.clock_skew_s,
        session_ttl_s=config.authn.session_ttl_s,
        max_failures=config.authn.max_failures,
        failure_window_s=config.authn.failure_window_s,
    )
    if config.mode == "production" and config.authn.identities.resolve() == DEV_IDENTITIES:
        log.warning("production mode with the DEVELOPMENT identities (examples/identities.yaml): "
                    "their passwords, TOTP secrets and keys are public; set authn.identities")
    directory = await asyncio.to_thread(identities_mod.load, config.authn.identities)
    keys = await asyncio.to_thread(
        KeyRing.open, config.state_dir / "keys", retain_s=settings.key_retain_s, now=clock.now()
    )
    return Authenticator(store, directory, keys, settings)


def _register_reporters(app: web.Application, services: Services) -> None:
    async def policies() -> dict[str, Any]:
        status = services.engine.status()
        return {"status": status.get("status", "degraded"), "revision": status.get("revision")}

    async def authz() -> dict[str, Any]:
        return services.engine.status()

    register_component(app, "policies", policies)
    register_component(app, "authz", authz)

    async def store() -> dict[str, Any]:
        if services.store is None:
            if services.config.store.backend != "none":
                return {"status": "degraded", "detail": "store unreachable; retrying"}
            return {"status": "placeholder", "detail": "no store configured (store.backend: none)"}
        try:
            await services.store.ping()
        except StoreError:
            return {"status": "degraded", "detail": "store unreachable",
                    "describe": await services.store.describe()}
        return {"status": "ready", "describe": await services.store.describe()}

    register_component(app, "store", store)

    async def authn() -> dict[str, Any]:
        if services.authenticator is None:
            return {"status": "placeholder", "detail": "authentication needs a store"}
        return {"status": "ready", **services.authenticator.status(clock.now())}

    register_component(app, "authn", authn)

    async def approvals() -> dict[str, Any]:
        if not services.approvals_enabled:
            return {"status": "placeholder", "detail": "no approval repository configured"}
        return {"status": "ready"}

    register_component(app, "approvals", approvals)

    async def compose() -> dict[str, Any]:
        return {"status": "ready", "rules": len(services.compose_rules.rules),
                "policy_revision": services.compose_rules.revision}

    register_component(app, "compose", compose)


async def _reload_loop(services: Services) -> None:
    """Poll the policy files; compile a changed revision off the event loop; swap atomically."""
    interval = services.config.policies.reload_interval_s
    if interval <= 0:
        return
    while True:
        await asyncio.sleep(interval)
        try:
            if services.engine.poll_changes():
                await asyncio.to_thread(services.engine.reload)
        except Exception:
            log.exception("policy reload failed")


def _install_sighup(services: Services) -> None:
    def reload() -> None:
        services.tasks.append(asyncio.create_task(_reload_now(services)))

    with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, reload)


async def _reload_now(services: Services) -> None:
    await asyncio.to_thread(services.engine.reload)


async def _expiry_loop(services: Services) -> None:
    """Run ``sweep_once`` every ``EXPIRY_INTERVAL_S``; a failed sweep is logged and retried."""
    while True:
        try:
            await sweep_once(services, clock.now())
        except StoreError:
            log.warning("expiry sweep skipped: store unavailable")
        except Exception:
            log.exception("expiry sweep failed")
        await asyncio.sleep(EXPIRY_INTERVAL_S)


async def sweep_once(services: Services, now: float) -> None:
    """Expire unreviewed and unused tickets (each expiry is an audit record), then purge
    one-time claims past their expiry, login failures older than the throttling window and
    sessions expired more than ``SESSION_RETENTION_S`` ago."""
    assert services.store is not None and services.audit is not None
    async with services.store.transaction() as tx:
        expired = await tx.expire_tickets(now)
        records = [
            await services.audit.append(
                {"at": clock.iso(now), "action": "approvals.expire",
                 "principal": {"subject_id": "system", "kind": "service", "session_id": None},
                 "ticket_id": t.id, "ticket_event": "expired", "env": t.env,
                 "resource_hash": t.resource_hash, "outcome": "executed"},
                tx,
            )
            for t in expired
        ]
    for record in records:
        await services.audit.mirror(record)
    # A store-level write: never issued while the transaction above is open (see store/sql.py).
    claims, failures, sessions = await services.store.purge_expired(
        now, now - services.config.authn.failure_window_s, now - SESSION_RETENTION_S
    )
    if claims or failures or sessions:
        log.info(
            "purged %d expired one-time claims, %d old login failures, %d expired sessions",
            claims, failures, sessions,
        )
