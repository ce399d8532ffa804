"""Build the aiohttp application from a ``Config``: middlewares, components, routes, in order."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from . import clock, logs, sighup
from .api import routes as api_routes
from .appkeys import STARTED_AT
from .approvals.expiry import expire_once
from .audit.checkpointer import checkpointing
from .audit.log import AUDIT, AuditLog
from .authn.federation import FEDERATION, Federation
from .authn.federation.oidc import OidcSignIn
from .authn.federation.remote import Fetcher
from .authn.federation.workload import WorkloadExchange
from .authn.published import PublishedKeyRing
from .authn.reload import IdentityFile
from .authn.reload import reloading as identities_reloading
from .authn.sessions import AUTHENTICATOR, Authenticator
from .authz.activations import POLICY_ACTIVATION_SIGNER, ActivationSigner, activation_keys
from .authz.decide import observe
from .authz.decisionlog import DECISION_LOG, DecisionLog
from .authz.engine import ENGINE, LOG_FIELDS, PolicyEngine
from .authz.reload import POLICY_FOLLOWER, CandidateRevision, StoreFollower, following, reloading, shadowing
from .authz.revisions import POLICY_KEYS, SignatureError, TrustedKeys
from .authz.shadow import SHADOW, Shadow
from .background import background
from .compose.evaluator import COMPOSE_EVALUATOR, COMPOSE_RULES, EvaluatorPool
from .compose.preflight import RuleSet
from .config import CONFIG, Config, load_from_process
from .console.views import setup_console
from .edge import MAX_HEADER_FIELD_BYTES
from .health import setup_health
from .middleware.layers import setup_layers
from .middleware.metrics import METRICS
from .notifications.dispatcher import NOTIFICATIONS, Dispatcher, dispatching
from .notifications.reviewers import reviewers_of
from .policytools import change
from .repeats import log_failure
from .store.base import OutboxEvent, Store, StoreError
from .storelink import STORE, setup_store
from .streams import setup_streams

__all__ = ["create_app"]

log = logging.getLogger("controlplane.app")

#: How often each worker expires tickets and purges dead claims, failures and sessions.
HOUSEKEEPING_INTERVAL_S = 30.0
#: The shipped development identities: their passwords, TOTP secrets and keys are public.
DEV_IDENTITIES = Path(__file__).resolve().parent.parent / "examples" / "identities.yaml"


def create_app(config: Config, *, shared_metrics: bool = False) -> web.Application:
    """The whole service as one application; components open in ``cleanup_ctx`` on start-up.

    ``shared_metrics``: this is one of a supervisor's workers, which share their metrics through
    prometheus-client's multiprocess files (``cpctl serve --workers N``)."""
    server = config.server
    app = web.Application(
        client_max_size=server.max_body_bytes,
        # aiohttp's protocol settings (service/edge.py says what the edge adds to them).
        handler_args={
            # One field up to 128 KiB, so that an oversized bearer token reaches the token
            # verifier and gets its 401 problem; the head as a whole is bounded by the edge.
            "max_field_size": MAX_HEADER_FIELD_BYTES,
            "max_headers": server.max_header_fields,
            # The keep-alive timer runs from the connection's start and from each response,
            # and closes a connection still waiting for a complete request head: the header
            # deadline (and so the idle keep-alive timeout).
            "keepalive_timeout": server.header_timeout_s,
        },
    )
    app[CONFIG] = config
    app[STARTED_AT] = time.time()
    logs.install_scrubbing()  # aiohttp's own log records carry request data

    # The request layers, outermost first, as one middleware (middleware/layers.py).
    # correlation first: everything inside logs with the id and every response echoes it;
    # deadline next: every store call of the request comes out of its one store deadline.
    # metrics and headers sit outside problems, so they see the final status of error
    # responses (500s included) and decorate them too. problems is the only catch-all. authn
    # is innermost: it only attaches who is calling, and a store error it meets is rendered by
    # problems.
    setup_layers(app, multiprocess=shared_metrics)
    setup_streams(app, server.streams)

    # Components, opened in this order on start-up and closed in reverse on shutdown. Each
    # sets its own app key. The policy engine needs nothing; the store link may start
    # disconnected (degraded, retried in the background); the audit log and the authenticator
    # reach the store through the link per call; housekeeping runs last, over all of them.
    setup_health(app)
    app.cleanup_ctx.append(_policies)
    app.cleanup_ctx.append(_compose_evaluator)  # evaluates COMPOSE_RULES in child processes
    app.cleanup_ctx.append(_decision_observers)  # decision log, shadow evaluation (if configured)
    setup_store(app, on_transaction=app[METRICS].store_transaction,
                on_round_trips=app[METRICS].store_round_trips_made)
    app.cleanup_ctx.append(_policy_store)  # policies.source: store follows the fleet's revision
    app.cleanup_ctx.append(_shadow_revision)  # policies.candidate_revision: shadow a published one
    app.cleanup_ctx.append(_audit)
    app.cleanup_ctx.append(_audit_checkpoints)  # signed checkpoints of the chain; a last one on stop
    app.cleanup_ctx.append(_authenticator)
    app.cleanup_ctx.append(_federation)  # OIDC sign-in and workload token exchange (after AuthN)
    app.cleanup_ctx.append(_notifications)  # the outbox dispatcher: after all it reads
    app.cleanup_ctx.append(_housekeeping)

    api_routes.add_routes(app)
    setup_console(app)  # /console/ (and GET /): HTML for people, cookie session
    return app


async def _policies(app: web.Application) -> AsyncIterator[None]:
    """ENGINE and COMPOSE_RULES; the policy files are polled (and SIGHUP reloads) while open."""
    config = app[CONFIG]
    # Revisions are vetted (compiled, probed, their *_test.rego run) in a child process: the
    # native engine can crash on some constructs, and that must reject the revision, not
    # kill the worker.
    engine = PolicyEngine(config.policies.dir, config.environments,
                          [f for f in config.logging.mask_fields if f in LOG_FIELDS])
    engine.reload_listeners.append(app[METRICS].reloaded)
    serving: list[str | None] = [None]

    def served(_result: object) -> None:
        app[METRICS].serving(serving[0], engine.revision)
        serving[0] = engine.revision

    engine.reload_listeners.append(served)
    result = await asyncio.to_thread(engine.load)
    if not result.ok:
        # Serving with no policy would mean every decision is a deny: start degraded and
        # say so (readyz 503), so an orchestrator does not route traffic here.
        log.error("no policy revision could be loaded: %s", result.error)
    app[ENGINE] = engine
    app[COMPOSE_RULES] = await asyncio.to_thread(RuleSet.load, config.policies.dir / "compose")
    if config.policies.source == "store":
        # The directory was only the bootstrap revision: from here on the store decides
        # (_policy_store), and neither file changes nor SIGHUP may swap the directory back in.
        yield
        return
    async with reloading(engine, config.policies.reload_interval_s):
        yield


async def _compose_evaluator(app: web.Application) -> AsyncIterator[None]:
    """COMPOSE_EVALUATOR: the processes that evaluate compose reports (a native crash takes
    one of them, not this worker); started on first use, stopped here on shutdown."""
    pool = EvaluatorPool(on_failure=app[METRICS].compose_evaluator_failed)
    app[COMPOSE_EVALUATOR] = pool
    try:
        yield
    finally:
        await pool.close()


async def _policy_store(app: web.Application) -> AsyncIterator[None]:
    """POLICY_KEYS; with ``policies.source: store``, POLICY_FOLLOWER: the fleet's active revision
    is read (and run) before the first request, then followed (NOTIFY, polling, SIGHUP)."""
    config, metrics = app[CONFIG], app[METRICS]
    trust_error = None
    try:
        keys = await asyncio.to_thread(TrustedKeys.from_files, config.policies.store.trusted_keys)
    except SignatureError as exc:
        # Fail closed: no revision from the store is accepted until the keys can be read.
        log.error("policy signing keys unusable: %s", exc)
        keys, trust_error = TrustedKeys({}), str(exc)
    app[POLICY_KEYS] = keys
    signer, trusted_activations = await asyncio.to_thread(_activation_keys, config)
    app[POLICY_ACTIVATION_SIGNER] = signer
    app[POLICY_FOLLOWER] = None
    if config.policies.source != "store":
        app[ENGINE].reload_listeners.append(
            lambda result: metrics.load_state("dir", app[ENGINE].status()["status"] == "ready"))
        metrics.load_state("dir", app[ENGINE].status()["status"] == "ready")
        yield
        return
    link = app[STORE]
    follower = StoreFollower(app[ENGINE], lambda: link.store, config.policies.store, keys,
                             trust_error=trust_error, activation_keys=trusted_activations)
    follower.listeners.append(metrics.converged)
    follower.listeners.append(lambda _a, _r: metrics.load_state("store", follower.load_ok))
    follower.activation_listeners.append(metrics.activation_refused)
    app[POLICY_FOLLOWER] = follower
    async with following(follower, lambda: link.store, config.policies.store.poll_interval_s):
        yield


def _activation_keys(config: Config) -> tuple[ActivationSigner | None, TrustedKeys]:
    """This replica's activation signer and the activation keys it trusts; an unreadable key
    is logged and left out (fail closed: activations here 503, or refused everywhere)."""
    store = config.policies.store
    signer = None
    if store.activation_key is not None:
        try:
            signer = ActivationSigner.from_file(store.activation_key)
        except SignatureError as exc:
            log.error("policy activation key unusable: %s", exc)
    try:
        trusted = activation_keys(store.trusted_activation_keys, signer)
    except SignatureError as exc:
        log.error("trusted policy activation keys unusable: %s", exc)
        trusted = TrustedKeys({})
    return signer, trusted


async def _shadow_revision(app: web.Application) -> AsyncIterator[None]:
    """With ``policies.candidate_revision``: the published revision is read from the store,
    verified with POLICY_KEYS and loaded into SHADOW in the background (retried while it
    cannot be read); SIGHUP re-reads the config file and follows a changed id."""
    config = app[CONFIG]
    revision = config.policies.candidate_revision
    if not revision:
        yield
        return
    link, source = app[STORE], config.source
    reread: Callable[[], str | None] | None = None
    if source is not None:  # started from a file: SIGHUP reads it (and CONTROLPLANE_*) again
        path = source

        def reread_file() -> str | None:
            return load_from_process(path).policies.candidate_revision

        reread = reread_file
    keys = app[POLICY_KEYS]
    trust_error = None if len(keys) else "no trusted policy signing key could be read"
    candidate = CandidateRevision(app[SHADOW], lambda: link.store, keys, revision,
                                  trust_error=trust_error, reread=reread)
    async with shadowing(candidate, config.policies.store.poll_interval_s):
        yield


async def _decision_observers(app: web.Application) -> AsyncIterator[None]:
    """DECISION_LOG and SHADOW, when configured: each observes the chain's decisions (a queue
    append on the request path) and works in its own thread (SHADOW: and its own process;
    SIGHUP makes it look at a candidate directory at once)."""
    config, engine = app[CONFIG], app[ENGINE]
    removers: list[Callable[[], None]] = []
    closers: list[Callable[[], None]] = []
    if config.decision_log.path is not None:
        sink = DecisionLog(config.decision_log.path, max_bytes=config.decision_log.max_bytes,
                           backups=config.decision_log.backups,
                           queue_size=config.decision_log.queue_size)
        await asyncio.to_thread(sink.start)
        app[DECISION_LOG] = sink
        removers.append(observe(engine, sink.record))
        closers.append(sink.close)
    if config.policies.candidate_dir is not None or config.policies.candidate_revision:
        # A published candidate revision is given to the shadow by _shadow_revision (it needs
        # the store and the trusted keys); until then its inputs are skipped.
        shadow = Shadow(config.policies.candidate_dir, config.environments,
                        sample_rate=config.policies.shadow_sample_rate,
                        queue_size=config.policies.shadow_queue_size,
                        poll_interval_s=config.policies.reload_interval_s or 2.0,
                        on_divergence=app[METRICS].shadow_diverged,
                        mask_fields=config.logging.mask_fields)
        shadow.start()
        app[SHADOW] = shadow
        removers.append(observe(engine, shadow.submit))
        closers.append(shadow.close)
    try:
        with contextlib.ExitStack() as stack:
            if SHADOW in app and config.policies.candidate_dir is not None:
                stack.enter_context(sighup.on_sighup(app[SHADOW].recheck))
            yield
    finally:
        for remove in removers:
            remove()
        for close in reversed(closers):
            await asyncio.to_thread(close)


async def _audit(app: web.Application) -> AsyncIterator[None]:
    """AUDIT: the hash-chained log over the store (and its JSON-lines mirror)."""
    app[AUDIT] = AuditLog(app[STORE].require, app[CONFIG].audit.jsonl_path)
    app[AUDIT].append_failed = app[METRICS].audit_append_failed
    app[AUDIT].integrity_failed = app[METRICS].audit_integrity_failed
    yield
    await app[AUDIT].resolver.close()  # logs the unknown outcomes it could not resolve


async def _audit_checkpoints(app: web.Application) -> AsyncIterator[None]:
    """Every N records or T seconds, sign (seq, head hash) with the audit key (audit.keys_dir)."""
    if app[CONFIG].store.backend == "none":
        yield
        return
    async with checkpointing(app[AUDIT], app[CONFIG].audit):
        yield


async def _authenticator(app: web.Application) -> AsyncIterator[None]:
    """AUTHENTICATOR: identities and the signing key ring are loaded here; the identities file is
    polled (and SIGHUP reloads it) while open."""
    config = app[CONFIG]
    if config.mode == "production" and config.authn.identities.resolve() == DEV_IDENTITIES:
        log.warning("production mode with the DEVELOPMENT identities (examples/identities.yaml): "
                    "their passwords, TOTP secrets and keys are public; set authn.identities")
    source = IdentityFile(config.authn.identities)
    directory = await asyncio.to_thread(source.load)
    keys = await asyncio.to_thread(PublishedKeyRing.open, config.state_dir / "keys",
                                   retain_s=config.authn.key_retain_s, now=clock.now())
    app[AUTHENTICATOR] = Authenticator(app[STORE].require, directory, keys, config.authn)
    app[AUTHENTICATOR].failed = app[METRICS].login_failed
    async with contextlib.AsyncExitStack() as stack:
        if config.store.backend != "none":
            # Every replica's public keys through the store: a token from any replica verifies.
            keys.attach(app[STORE].require)
            await stack.enter_async_context(keys.publishing())
        await stack.enter_async_context(identities_reloading(app[AUTHENTICATOR], source))
        yield


async def _notifications(app: web.Application) -> AsyncIterator[None]:
    """NOTIFICATIONS: deliver the outbox's approval events to the configured sinks while open;
    on close, the round in flight finishes first."""
    config = app[CONFIG]
    if config.store.backend == "none":
        yield
        return
    link, authenticator = app[STORE], app[AUTHENTICATOR]
    async def policy_change(store: Store, event: OutboxEvent) -> dict[str, Any] | None:
        keys: TrustedKeys = app[POLICY_KEYS]
        found = await change.report(store, keys, str(event.data.get("action")),
                                    event.data.get("resource"), config.policies.dir,
                                    config.environments, config.decision_log.path)
        return None if found is None else change.brief(found)

    dispatcher = Dispatcher(lambda: link.store, config.notifications,
                            reviewers_of(app[ENGINE], config, lambda: authenticator.identities),
                            app[METRICS], changes=policy_change)
    app[NOTIFICATIONS] = dispatcher
    async with dispatching(dispatcher, config.notifications):
        yield


async def _federation(app: web.Application) -> AsyncIterator[None]:
    """FEDERATION: the OpenID providers and workload issuers of ``authn.oidc``/``authn.workload``
    (their documents are fetched on first use, so an unreachable IdP never blocks start-up)."""
    config = app[CONFIG]
    fetcher = Fetcher(allow_http_loopback=config.federation.allow_http_loopback)
    leeway = float(config.authn.clock_skew_s)
    app[FEDERATION] = Federation(
        fetcher,
        OidcSignIn(config.federation, fetcher, leeway, float(config.authn.session_ttl_s),
                   policy_names=app[ENGINE].names_subject),
        WorkloadExchange(config.federation, fetcher, leeway),
    )
    try:
        yield
    finally:
        await app[FEDERATION].close()


async def _housekeeping(app: web.Application) -> AsyncIterator[None]:
    """Every ``HOUSEKEEPING_INTERVAL_S``: expire tickets, purge dead claims, failures and
    sessions, and seal audit records left staged. Idle while there is no store; a failed round
    is logged and retried."""
    link, audit, authenticator, metrics = app[STORE], app[AUDIT], app[AUTHENTICATOR], app[METRICS]

    async def round_(now: float) -> None:
        if link.store is None:
            return
        # Store-level purges first: they need no audit record, so a chain this worker refuses
        # to extend (audit.tip) does not stop them.
        claims, failures, sessions = await authenticator.purge(now)
        if claims or failures or sessions:
            log.info("purged %d expired one-time claims, %d old login failures, %d expired "
                     "sessions", claims, failures, sessions)
        # Pending OIDC sign-ins and CLI handoffs past their expiry; IdP facts of purged sessions.
        await link.store.purge_federation(now)
        # Verify what other workers appended since this one last looked (audit.tip): appends
        # then find little to verify under the chain head's lock, and a rewrite is found even
        # while this worker appends nothing.
        await audit.catch_up()
        # Expiry writes audit records: never issued while a store-level write above is open.
        metrics.approval("expired", await expire_once(link.store, audit, now))
        # Audit records a worker staged and never sealed (it stopped): chained by whoever is up.
        swept = await audit.sweep(now)
        if swept:
            log.warning("sealed %d audit records another worker had left staged", swept)

    async with _every(HOUSEKEEPING_INTERVAL_S, round_):
        yield


@contextlib.asynccontextmanager
async def _every(interval_s: float, job: Callable[[float], Awaitable[Any]]) -> AsyncIterator[None]:
    async def loop() -> None:
        while True:
            try:
                await job(clock.now())
            except StoreError as exc:
                # An outage (or a chain changed under this worker: audit.chain_tampered) skips
                # every round alike: said once per interval, counted, no traceback.
                log_failure(log, "housekeeping skipped", exc, event="housekeeping.skipped",
                            expected=(StoreError,), level=logging.WARNING)
            except Exception as exc:
                log_failure(log, "housekeeping failed", exc, event="housekeeping.failed")
            await asyncio.sleep(interval_s)

    async with background(loop()):
        yield
