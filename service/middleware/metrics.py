"""Prometheus request counters and latency histograms, labelled by route template and status."""

from __future__ import annotations

import time
from dataclasses import dataclass

from aiohttp import web
from aiohttp.typedefs import Handler
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.multiprocess import MultiProcessCollector

from ..appkeys import METRICS

_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


#: Set by ``cpctl serve --workers N`` for its workers (prometheus-client's own variable): every
#: worker writes its samples to files there, and /metrics on any worker sums all of them.


@dataclass
class Metrics:
    """One registry per application, so several apps in one process (tests) stay apart."""

    registry: CollectorRegistry
    requests: Counter
    latency: Histogram
    in_flight: Gauge
    multiprocess: bool = False

    def exposition_registry(self) -> CollectorRegistry:
        """What /metrics renders: this process's registry, or the sum over every worker."""
        if not self.multiprocess:
            return self.registry
        registry = CollectorRegistry()
        MultiProcessCollector(registry)  # type: ignore[no-untyped-call]  # untyped upstream
        return registry

    @classmethod
    def create(cls, *, multiprocess: bool = False) -> Metrics:
        """``multiprocess``: the workers of one supervisor share their values through files
        (prometheus-client decides that at import time from its own PROMETHEUS_MULTIPROC_DIR,
        which the supervisor sets before it starts them); /metrics then sums every worker."""
        registry = CollectorRegistry()
        return cls(
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
            multiprocess=multiprocess,
        )


def _route_label(request: web.Request) -> str:
    # The template (/api/v1/approvals/{id}), never the raw path: ids must not explode cardinality.
    resource = request.match_info.route.resource
    if resource is None:
        return "unmatched"
    return resource.canonical


def setup_metrics(app: web.Application, *, multiprocess: bool = False) -> None:
    """Install the metrics middleware (outside ``problems``, so it counts final statuses)."""
    metrics = Metrics.create(multiprocess=multiprocess)
    app[METRICS] = metrics

    @web.middleware
    async def metrics_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        """Count the request and observe its latency under its route template."""
        started = time.perf_counter()
        metrics.in_flight.inc()
        status = 500
        try:
            response = await handler(request)
            status = response.status
            return response
        except web.HTTPException as exc:
            status = exc.status
            raise
        finally:
            metrics.in_flight.dec()
            route = _route_label(request)
            metrics.requests.labels(request.method, route, str(status)).inc()
            metrics.latency.labels(request.method, route).observe(time.perf_counter() - started)

    app.middlewares.append(metrics_middleware)
