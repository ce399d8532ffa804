"""Prometheus metrics: every instrument the service exports, and the request middleware.

Events are counted where they happen (through the hooks ``create_app`` wires and the chain's
calls); state (the serving revision, pending approvals, the audit head, the store) is read at
scrape time by ``scrape`` and rendered next to the counters. No label ever carries a subject
id, token or resource value: every label value comes from a fixed set, a route template, a
status code or the policy revision.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from ..audit.log import AUDIT
from ..authz.activations import ActivationRefused
from ..authz.engine import ENGINE
from ..authz.reload import POLICY_FOLLOWER
from ..store.base import Store
from ..storelink import STORE

if TYPE_CHECKING:
    from ..authz.engine import LoadResult
    from ..storelink import StoreLink

log = logging.getLogger("controlplane.metrics")

_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
_DECISION_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                     0.1, 0.25)

#: The label values each labelled counter may take (pre-created, so rate() sees them at 0).
RELOAD_RESULTS = ("ok", "rejected")
DECISION_RESULTS = ("allow", "deny", "require_approval")
APPROVAL_OUTCOMES = ("created", "approved", "rejected", "revoked", "expired", "consumed")
#: Logged ticket event -> ``controlplane_approvals_total{outcome}`` (a review that leaves the
#: ticket pending is not an outcome).
_TICKET_EVENT_OUTCOMES = {
    "approval.ticket_requested": "created",
    "approval.ticket_approved": "approved",
    "approval.ticket_rejected": "rejected",
    "approval.ticket_revoked": "revoked",
    "approval.ticket_consumed": "consumed",
}
#: What became of a notification event in a dispatcher round (``notifications.dispatcher``):
#: every matching sink accepted it, it is due again after a failure, it failed past its window,
#: the round's lease ended before its attempts were recorded, or there are no sinks at all.
#: Why a compose report's evaluator process failed (``service.compose.evaluator``).
COMPOSE_EVALUATOR_FAILURES = ("crashed", "timeout", "protocol", "unavailable")
NOTIFICATION_OUTCOMES = ("delivered", "retried", "dead", "lease_lost", "settled")
LOGIN_FAILURE_REASONS = (
    "bad_password", "unknown_subject", "subject_disabled", "not_a_human", "invalid_assertion",
    "assertion_replayed", "otp_wrong", "otp_replayed", "throttled", "other",
)
#: Authenticator reasons that are not themselves in ``LOGIN_FAILURE_REASONS``.
_REASON_ALIASES = {"token_replayed": "assertion_replayed"}
#: Tickets read per page when counting the pending ones at scrape time, and at most how many.
_PENDING_PAGE = 500
_PENDING_MAX_PAGES = 20

#: Every metric name /metrics exposes (the monitoring examples may reference only these).
EXPORTED = (
    "controlplane_http_requests_total",
    "controlplane_http_request_duration_seconds",
    "controlplane_http_requests_in_flight",
    "controlplane_policy_revision_info",
    "controlplane_policy_reload_total",
    "controlplane_policy_last_reload_success_timestamp_seconds",
    "controlplane_policy_process_revision",
    "controlplane_policy_store_converged",
    "controlplane_policy_load_ok",
    "controlplane_policy_activations_refused_total",
    "controlplane_decisions_total",
    "controlplane_decision_duration_seconds",
    "controlplane_approvals_pending",
    "controlplane_approval_oldest_pending_age_seconds",
    "controlplane_approvals_total",
    "controlplane_audit_append_failures_total",
    "controlplane_audit_head_seq",
    "controlplane_audit_integrity_failures_total",
    "controlplane_audit_chain_ok",
    "controlplane_login_failures_total",
    "controlplane_store_up",
    "controlplane_policy_shadow_divergence_total",
    "controlplane_store_transactions_total",
    "controlplane_store_round_trips_total",
    "controlplane_notification_events_total",
    "controlplane_notification_deliveries_total",
    "controlplane_compose_evaluator_failures_total",
)


#: How often a worker writes its tallied per-request events to the instruments (and so, in
#: multiprocess mode, to the files /metrics sums); a scrape of the worker itself writes first.
FLUSH_INTERVAL_S = 0.5


class Tally:
    """The per-request events of this worker (requests, their latency, in-flight, decisions
    and their latency, store transactions and round trips), added up in plain dicts and written
    to the instruments by ``flush``: one write per label set per flush instead of several
    locked writes (multiprocess mode: mmap files) per request."""

    __slots__ = ("_counts", "decisions", "in_flight", "requests")

    def __init__(self) -> None:
        self._counts: dict[tuple[Counter, tuple[str, ...]], float] = {}
        # The two events of every request (and every decision), in one accumulator each
        # (``timed``): (method, route, status) / (result, cached) -> [count, sum, bucket 0, ...].
        self.requests: dict[tuple[str, str, int], list[float]] = {}
        self.decisions: dict[tuple[str, bool], list[float]] = {}
        self.in_flight = 0

    @staticmethod
    def timed(table: dict[Any, list[float]], key: Any, seconds: float,
              bounds: list[float]) -> None:
        """One event of ``table`` (``requests``, ``decisions``) under ``key``: counted, and its
        ``seconds`` observed (``bounds``: its histogram's)."""
        acc = table.get(key)
        if acc is None:
            acc = table[key] = [0.0] * (len(bounds) + 2)
        acc[0] += 1
        acc[1] += seconds
        acc[2 + bisect.bisect_left(bounds, seconds)] += 1

    def count(self, counter: Counter, labels: tuple[str, ...], amount: float = 1) -> None:
        key = (counter, labels)
        self._counts[key] = self._counts.get(key, 0) + amount

    def flush(self, metrics: Metrics) -> None:
        requests, self.requests = self.requests, {}
        for (method, route, status), acc in requests.items():
            metrics.requests.labels(method, route, str(status)).inc(acc[0])
            _observed(metrics.latency.labels(method, route), acc)
        decisions, self.decisions = self.decisions, {}
        for (result, cached), acc in decisions.items():
            if result in DECISION_RESULTS:
                metrics.decisions.labels(result, "true" if cached else "false").inc(acc[0])
            _observed(metrics.decision_latency, acc)
        counts, self._counts = self._counts, {}
        for (counter, labels), amount in counts.items():
            (counter.labels(*labels) if labels else counter).inc(amount)
        metrics.in_flight.set(self.in_flight)


def _observed(histogram: Histogram, acc: list[float]) -> None:
    """Add the observations ``acc`` tallied (a count, their sum, then a count a bucket) to
    ``histogram``: Histogram.observe's own writes (its sum, then the first bucket the value
    fits), once per bucket for all the observations that fell in it."""
    histogram._sum.inc(acc[1])
    for i, n in enumerate(acc[2:]):
        if n:
            histogram._buckets[i].inc(n)


@dataclass
class Metrics:
    """One registry per application, so several apps in one process (tests) stay apart."""

    registry: CollectorRegistry
    requests: Counter
    latency: Histogram
    in_flight: Gauge
    reloads: Counter
    last_reload_success: Gauge
    decisions: Counter
    decision_latency: Histogram
    approvals: Counter
    audit_append_failures: Counter
    audit_integrity_failures: Counter
    login_failures: Counter
    store_transactions: Counter
    store_round_trips: Counter
    notification_events: Counter
    notification_deliveries: Counter
    shadow_divergence: Counter
    compose_evaluator_failures: Counter
    #: This worker's per-request events not yet written to the instruments (``flush``).
    tally: Tally = field(default_factory=Tally)
    #: Per process (a ``pid`` label with several workers): the revision it serves, and whether
    #: that is the fleet's active one; an operator sees convergence across workers and replicas.
    process_revision: Gauge | None = None
    store_converged: Gauge | None = None
    #: Per process: 1 while the policy it should run is loaded and serving, 0 while that
    #: policy (or its activation) is rejected or refused; ``source``: dir or store.
    load_ok: Gauge | None = None
    activations_refused: Counter | None = None
    multiprocess: bool = False

    def exposition_registry(self) -> CollectorRegistry:
        """What /metrics renders: this process's registry, or the sum over every worker."""
        if not self.multiprocess:
            return self.registry
        registry = CollectorRegistry()
        MultiProcessCollector(registry)  # type: ignore[no-untyped-call]  # untyped upstream
        return registry

    # ---- events ---------------------------------------------------------------------------

    def reloaded(self, outcome: LoadResult) -> None:
        """One policy reload outcome: ``ok`` (swapped in, or the serving revision confirmed after
        a rejection) or ``rejected`` (an engine reload listener, wired by ``create_app``)."""
        self.reloads.labels("ok" if outcome.ok else "rejected").inc()
        if outcome.ok:
            self.last_reload_success.set(time.time())

    def serving(self, previous: str | None, revision: str | None) -> None:
        """This process now serves ``revision`` (it served ``previous``)."""
        if self.process_revision is None:
            return
        if previous is not None and previous != revision:
            self.process_revision.labels(previous).set(0)
        if revision is not None:
            self.process_revision.labels(revision).set(1)

    def load_state(self, source: str, ok: bool) -> None:
        """Whether the policy this process should run (from ``source``) is the one serving."""
        if self.load_ok is not None:
            self.load_ok.labels(source).set(1 if ok else 0)

    def activation_refused(self, reason: str, count: int = 1) -> None:
        """A store-following process refused an activation (``authz.activations``)."""
        if self.activations_refused is not None:
            self.activations_refused.labels(reason).inc(count)

    def converged(self, active: str | None, running: bool) -> None:
        """After each read of the store's active revision (``policies.source: store``)."""
        if self.store_converged is not None:
            self.store_converged.set(1 if running or active is None else 0)

    def decided(self, result: str, cached: bool, duration_s: float) -> None:
        """One AuthZ decision of the chain (counted when ``result`` is one of
        ``DECISION_RESULTS``; its latency whatever it is)."""
        tally = self.tally
        tally.timed(tally.decisions, (result, cached), duration_s,
                    self.decision_latency._upper_bounds)

    def shadow_diverged(self, live: str, candidate: str) -> None:
        """A shadow (candidate) decision differed from the live one (``authz/shadow.py``)."""
        if live in DECISION_RESULTS and candidate in DECISION_RESULTS:
            self.shadow_divergence.labels(live, candidate).inc()

    def approval(self, outcome: str, count: int = 1) -> None:
        if outcome in APPROVAL_OUTCOMES and count > 0:
            self.approvals.labels(outcome).inc(count)

    def ticket_events(self, events: Iterable[str]) -> None:
        """The ticket events of one committed run, as ``audit.recording`` logged them."""
        for event in events:
            outcome = _TICKET_EVENT_OUTCOMES.get(event)
            if outcome is not None:
                self.approval(outcome)

    def audit_append_failed(self) -> None:
        self.audit_append_failures.inc()

    def audit_integrity_failed(self) -> None:
        """A worker found the audit chain changed under it (``audit.tip``); it refuses to extend it."""
        self.audit_integrity_failures.inc()

    def login_failed(self, reason: str) -> None:
        reason = _REASON_ALIASES.get(reason, reason)
        if reason not in LOGIN_FAILURE_REASONS:
            # Assertion verification codes are many; none is a subject or token value.
            reason = "invalid_assertion" if reason.startswith(("token_", "assertion_")) else "other"
        self.login_failures.labels(reason).inc()

    def store_transaction(self, write: bool) -> None:
        """One store transaction opened by this worker (a store call or a chain's transaction)."""
        self.tally.count(self.store_transactions, ("write" if write else "read",))

    def notification_sinks(self, names: Sequence[str]) -> None:
        """The configured sinks: their delivery series exist (at 0) from the start."""
        for name in names:
            for result in ("delivered", "failed"):
                self.notification_deliveries.labels(name, result)

    def notification_delivery(self, sink: str, delivered: bool) -> None:
        """One delivery attempt of one event to one sink."""
        self.notification_deliveries.labels(sink, "delivered" if delivered else "failed").inc()

    def notification_events_ended(self, outcome: str, count: int = 1) -> None:
        """``count`` events' round ended with ``outcome`` (``NOTIFICATION_OUTCOMES``)."""
        self.notification_events.labels(outcome).inc(count)

    def store_round_trips_made(self, count: int) -> None:
        """One store transaction of this worker ended after ``count`` round trips."""
        self.tally.count(self.store_round_trips, (), count)

    def flush(self) -> None:
        """Write the tallied per-request events to the instruments."""
        self.tally.flush(self)

    def compose_evaluator_failed(self, reason: str) -> None:
        self.compose_evaluator_failures.labels(reason).inc()

    @classmethod
    def create(cls, *, multiprocess: bool = False) -> Metrics:
        """``multiprocess``: the workers of one supervisor share their values through files
        (prometheus-client decides that at import time from its own PROMETHEUS_MULTIPROC_DIR,
        which the supervisor sets before it starts them); /metrics then sums every worker."""
        registry = CollectorRegistry()
        metrics = cls(
            registry=registry,
            requests=Counter(
                "controlplane_http_requests",
                "HTTP requests served, by method, route template and status.",
                ["method", "route", "status"],
                registry=registry,
            ),
            latency=Histogram(
                "controlplane_http_request_duration_seconds",
                "HTTP request latency, by method and route template.",
                ["method", "route"],
                buckets=_BUCKETS,
                registry=registry,
            ),
            in_flight=Gauge(
                "controlplane_http_requests_in_flight",
                "HTTP requests being served.",
                registry=registry,
                multiprocess_mode="livesum",
            ),
            reloads=Counter(
                "controlplane_policy_reload",
                "Policy revision loads, by result: ok (swapped in) or rejected (the last good "
                "revision keeps serving).",
                ["result"],
                registry=registry,
            ),
            last_reload_success=Gauge(
                "controlplane_policy_last_reload_success_timestamp_seconds",
                "When a policy revision was last loaded successfully (Unix time).",
                registry=registry,
                multiprocess_mode="max",
            ),
            decisions=Counter(
                "controlplane_decisions",
                "AuthZ decisions of the chain, by result and whether the cache answered.",
                ["result", "cached"],
                registry=registry,
            ),
            decision_latency=Histogram(
                "controlplane_decision_duration_seconds",
                "Time to reach one AuthZ decision (policy evaluation or cache).",
                buckets=_DECISION_BUCKETS,
                registry=registry,
            ),
            approvals=Counter(
                "controlplane_approvals",
                "Approval ticket events, by outcome.",
                ["outcome"],
                registry=registry,
            ),
            audit_append_failures=Counter(
                "controlplane_audit_append_failures",
                "Audit records of chain runs that could not be written (each run answered 503).",
                registry=registry,
            ),
            audit_integrity_failures=Counter(
                "controlplane_audit_integrity_failures",
                "Workers that found the audit chain changed since they verified or wrote it "
                "(each then refuses every audit write and checkpoint: mutations answer 503).",
                registry=registry,
            ),
            login_failures=Counter(
                "controlplane_login_failures",
                "Failed logins and step-ups, by reason (a fixed set).",
                ["reason"],
                registry=registry,
            ),
            shadow_divergence=Counter(
                "controlplane_policy_shadow_divergence",
                "Shadow evaluation: decisions where the candidate revision (policies."
                "candidate_dir or .candidate_revision) decided differently from the live one, "
                "by both results.",
                ["live", "candidate"],
                registry=registry,
            ),
            process_revision=Gauge(
                "controlplane_policy_process_revision",
                "1 for the policy revision this process serves (0 for those it served before); "
                "one series per process.",
                ["revision"],
                registry=registry,
                multiprocess_mode="liveall",
            ),
            store_converged=Gauge(
                "controlplane_policy_store_converged",
                "1 when this process runs the fleet's active policy revision from the store "
                "(or none is active yet, or policies come from the directory); one series per "
                "process.",
                registry=registry,
                multiprocess_mode="liveall",
            ),
            load_ok=Gauge(
                "controlplane_policy_load_ok",
                "1 while the policy revision this process should run (the directory's, or the "
                "store's active one) is loaded and serving; 0 while it is rejected, or its "
                "activation refused, and an older revision serves. One series per process.",
                ["source"],
                registry=registry,
                multiprocess_mode="liveall",
            ),
            activations_refused=Counter(
                "controlplane_policy_activations_refused",
                "Activations of the store a store-following process refused (unsigned, "
                "signature not trusted or not matching, replayed or out of sequence), by reason; "
                "once per refused activation.",
                ["reason"],
                registry=registry,
            ),
            store_transactions=Counter(
                "controlplane_store_transactions",
                "Store transactions opened, by kind (read or write).",
                ["kind"],
                registry=registry,
            ),
            notification_events=Counter(
                "controlplane_notification_events",
                "Notification events by what their dispatcher round ended in: delivered, "
                "retried (due again after a failure), dead (failed past its window), "
                "lease_lost, settled (no sinks configured).",
                ["outcome"],
                registry=registry,
            ),
            notification_deliveries=Counter(
                "controlplane_notification_deliveries",
                "Delivery attempts of notification events, by sink and result (delivered: a "
                "2xx; failed: any other answer, a timeout, a refused redirect).",
                ["sink", "result"],
                registry=registry,
            ),
            store_round_trips=Counter(
                "controlplane_store_round_trips",
                "Round trips to the store's server (statements, BEGIN, COMMIT, ROLLBACK); "
                "PostgreSQL only.",
                registry=registry,
            ),
            compose_evaluator_failures=Counter(
                "controlplane_compose_evaluator_failures",
                "Compose reports whose evaluator process failed, by reason: crashed (died "
                "mid-request), timeout (killed over the wall-clock bound), protocol (an answer "
                "that is not one), unavailable (could not be started).",
                ["reason"],
                registry=registry,
            ),
            multiprocess=multiprocess,
        )
        metrics.converged(None, True)
        for result in RELOAD_RESULTS:
            metrics.reloads.labels(result)
        for result in DECISION_RESULTS:
            for cached in ("true", "false"):
                metrics.decisions.labels(result, cached)
        for outcome in APPROVAL_OUTCOMES:
            metrics.approvals.labels(outcome)
        for reason in LOGIN_FAILURE_REASONS:
            metrics.login_failures.labels(reason)
        for kind in ("read", "write"):
            metrics.store_transactions.labels(kind)
        for reason in ActivationRefused.REASONS:
            metrics.activation_refused(reason, 0)
        for outcome in NOTIFICATION_OUTCOMES:
            metrics.notification_events.labels(outcome)
        for reason in COMPOSE_EVALUATOR_FAILURES:
            metrics.compose_evaluator_failures.labels(reason)
        return metrics


#: Metrics registry and instruments.
METRICS: web.AppKey[Metrics] = web.AppKey("metrics")


# ---- state, read at scrape time ---------------------------------------------------------------


@dataclass
class ScrapeGauges:
    """The state ``scrape`` renders after the counters, in a registry of its own made per
    scrape (a value no scrape set is absent, not stale). Declared here, not inside ``scrape``,
    so the metrics reference (``service.reference``) lists them with the counters."""

    registry: CollectorRegistry
    revision: Gauge
    store_up: Gauge
    pending: Gauge
    oldest: Gauge
    head: Gauge
    chain_ok: Gauge

    @classmethod
    def create(cls) -> ScrapeGauges:
        state = CollectorRegistry()
        return cls(
            registry=state,
            revision=Gauge("controlplane_policy_revision_info",
                           "The policy revision this worker serves (value 1, label revision).",
                           ["revision"], registry=state),
            store_up=Gauge("controlplane_store_up",
                           "1 when the store answered this scrape's reads, else 0.",
                           registry=state),
            pending=Gauge("controlplane_approvals_pending",
                          "Approval tickets waiting for review.", registry=state),
            oldest=Gauge("controlplane_approval_oldest_pending_age_seconds",
                         "Age of the oldest ticket waiting for review (0 when none waits).",
                         registry=state),
            head=Gauge("controlplane_audit_head_seq",
                       "Sequence number of the last audit record.", registry=state),
            chain_ok=Gauge("controlplane_audit_chain_ok",
                           "0 once this worker found the audit chain changed under it (it "
                           "refuses to extend or sign it), else 1.", registry=state),
        )


async def scrape(app: web.Application) -> bytes:
    """The /metrics body: the counters (every worker's, in multiprocess mode), then this
    worker's state: the serving revision, and from the store (``StoreGauges``: read at most once
    a second, one bounded read each; ``controlplane_store_up`` 0 when any failed) pending
    approvals and the audit head."""
    metrics = app[METRICS]
    follower = app.get(POLICY_FOLLOWER)
    if follower is not None:
        # As the status reads it at this moment, not as the end of the last sync left it: a
        # revision installs on a thread, and between its switch and the sync's listeners a
        # scrape would contradict the status read just before it.
        active = follower.active
        metrics.converged(active.revision_id if active else None, follower.converged)
        metrics.load_state("store", follower.load_ok)
    gauges = ScrapeGauges.create()
    engine = app.get(ENGINE)
    if engine is not None and engine.revision is not None:
        gauges.revision.labels(engine.revision).set(1)
    audit = app.get(AUDIT)
    gauges.chain_ok.set(0 if audit is not None and not audit.tip.ok else 1)
    read = await app[STORE_GAUGES].read(app.get(STORE))
    up = 0
    if read is not None:
        up = 1
        count, oldest_at, seq = read
        gauges.pending.set(count)
        gauges.oldest.set(max(0.0, time.time() - oldest_at) if oldest_at is not None else 0.0)
        gauges.head.set(seq)
    gauges.store_up.set(up)
    metrics.flush()  # this worker's events up to now; the others' are at most a flush old
    return generate_latest(metrics.exposition_registry()) + generate_latest(gauges.registry)


#: How long one reading of the store's gauges serves /metrics: every scrape within it (of any
#: caller: /metrics is public) shares it, so scraping costs the store at most one reading a
#: second per process, never one per request.
STORE_GAUGES_TTL_S = 1.0


class StoreGauges:
    """The store's part of /metrics (pending approvals, the oldest one's creation time, the
    audit head), read at most once per ``STORE_GAUGES_TTL_S`` by one scrape at a time; a failed
    reading (None: ``controlplane_store_up`` 0) is kept as long, so a down store is not
    hammered by scrapes either."""

    def __init__(self) -> None:
        self._at = -STORE_GAUGES_TTL_S
        self._values: tuple[int, float | None, int] | None = None
        self._lock = asyncio.Lock()

    async def read(self, link: StoreLink | None) -> tuple[int, float | None, int] | None:
        if time.monotonic() - self._at < STORE_GAUGES_TTL_S:
            return self._values
        async with self._lock:
            if time.monotonic() - self._at < STORE_GAUGES_TTL_S:
                return self._values  # read by the scrape this one waited for
            self._values = await _read_gauges(link)
            self._at = time.monotonic()
            return self._values


#: The store's part of /metrics, read at most once a second (``middleware.metrics.StoreGauges``).
STORE_GAUGES: web.AppKey[StoreGauges] = web.AppKey("store_gauges")


async def _read_gauges(link: StoreLink | None) -> tuple[int, float | None, int] | None:
    store = link.store if link is not None else None
    if link is None or store is None:
        return None
    try:
        async with asyncio.timeout(2 * link.timeout_s):  # two reads, each within the deadline
            count, oldest_at = await _pending(store)
            seq, _ = await store.audit_head()
    except Exception as exc:  # the store's trouble is what this gauge reports
        log.warning("metrics: store read failed", extra={"fields": {"error": type(exc).__name__}})
        return None
    return count, oldest_at, seq


async def _pending(store: Store) -> tuple[int, float | None]:
    """How many tickets are pending, and when the oldest was created (newest first, paged)."""
    count, oldest, before = 0, None, None
    for _ in range(_PENDING_MAX_PAGES):
        tickets, before = await store.list_tickets(state="pending", limit=_PENDING_PAGE,
                                                   before=before)
        count += len(tickets)
        for ticket in tickets:
            if oldest is None or ticket.created_at < oldest:
                oldest = ticket.created_at
        if before is None:
            break
    return count, oldest


def _route_label(request: web.Request) -> str:
    # The template (/api/v1/approvals/{id}), never the raw path: ids must not explode cardinality.
    resource = request.match_info.route.resource
    if resource is None:
        return "unmatched"
    return resource.canonical


def install_metrics(app: web.Application, *, multiprocess: bool = False) -> Metrics:
    """METRICS and STORE_GAUGES, and the tally's flushing while the app runs (every
    ``FLUSH_INTERVAL_S``, and once at its end); the requests are counted by ``observe_request``
    (the request layers: ``middleware.layers``)."""
    metrics = Metrics.create(multiprocess=multiprocess)
    app[METRICS] = metrics
    app[STORE_GAUGES] = StoreGauges()

    async def flushing(app: web.Application) -> AsyncIterator[None]:
        """Write the tally every ``FLUSH_INTERVAL_S`` while the app runs, and once at its end."""

        async def loop() -> None:
            while True:
                await asyncio.sleep(FLUSH_INTERVAL_S)
                try:
                    metrics.flush()
                except Exception:  # a metrics write must never stop the worker
                    log.exception("metrics flush failed")

        task = asyncio.create_task(loop())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            metrics.flush()

    app.cleanup_ctx.append(flushing)
    return metrics


def observe_request(metrics: Metrics, request: web.Request, status: int, started: float) -> None:
    """Count a finished request and its latency (since ``started``, ``time.perf_counter``) under
    its route template; the caller counted it in flight (``tally.in_flight``) and out again."""
    tally = metrics.tally
    tally.timed(tally.requests, (request.method, _route_label(request), status),
                time.perf_counter() - started, metrics.latency._upper_bounds)
