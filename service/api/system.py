"""System surfaces: ``/api/v1/system/info``, component status objects, health, readiness, metrics."""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from .. import __version__
from ..appkeys import STARTED_AT
from ..chain import public
from ..clock import iso
from ..config import CONFIG
from ..errors import ServiceUnavailable
from ..health import READY_REQUIRES, aggregate, component_status, component_statuses
from ..middleware.metrics import scrape
from ..storelink import STORE

routes = web.RouteTableDef()


@routes.get("/api/v1/system/info")
@public
async def system_info(request: web.Request) -> web.Response:
    """Aggregate status, per-component states, version and runtime — never a secret."""
    app = request.app
    config = app[CONFIG]
    statuses = await component_statuses(app)
    for name in ("authn", "authz"):
        statuses.setdefault(name, await component_status(app, name))
    started = app[STARTED_AT]
    store_desc = statuses.get("store", {}).get("describe", {})
    return web.json_response(
        {
            "status": aggregate(statuses),
            "service": "controlplane",
            "version": __version__,
            "started_at": iso(started),
            "uptime_s": round(time.time() - started, 3),
            "components": statuses,
            "runtime": {
                "mode": config.runtime_mode,
                "config_mode": config.mode,
                "workers": config.server.workers,
                "persistence": _persistence(config.store.backend, store_desc),
            },
            "environments": [
                {"name": name, "production": prod} for name, prod in config.environments.items()
            ],
        }
    )


def _persistence(backend: str, describe: dict[str, Any]) -> dict[str, Any]:
    if backend == "none":
        return {
            "backend": "none",
            "durable": [],
            "multi_process_safe": False,
            "multi_replica_safe": False,
            "note": "no store: sessions, approvals, tasks and audit are unavailable",
        }
    return {
        "backend": "sqlite" if backend == "sqlite" else "postgresql",
        "durable": ["sessions", "approvals", "tasks", "audit"],
        "multi_process_safe": True,
        "multi_replica_safe": bool(describe.get("multi_replica_safe", backend == "postgres")),
    }


@routes.get("/api/v1/authn/status")
@public
async def authn_status(request: web.Request) -> web.Response:
    """AuthN status object: issuer, key ids, lifetimes — never tokens or sessions."""
    return web.json_response(await component_status(request.app, "authn"))


@routes.get("/api/v1/authz/status")
@public
async def authz_status(request: web.Request) -> web.Response:
    """AuthZ status object: revision, module count, reloads — never policy text or decisions."""
    return web.json_response(await component_status(request.app, "authz"))


@routes.get("/healthz")
@public
async def healthz(request: web.Request) -> web.Response:
    """Liveness: the process serves requests. Checks nothing else on purpose."""
    return web.json_response({"status": "ok"})


@routes.get("/readyz")
@public
async def readyz(request: web.Request) -> web.Response:
    """Readiness: 200 only when configuration, policies and store are loaded and the store
    serves: it is pinged now (within ``store.probe_timeout_s``, not read from the status
    surfaces' background check) and no kind of store call failed recently without one
    served since (``store.failure_window_s``; said in ``store_failures``), and the audit
    chain is the one this worker verified (``audit``: degraded once it was changed under it)."""
    await request.app[STORE].check()
    statuses = await component_statuses(request.app)
    not_ready = sorted(
        name
        for name in READY_REQUIRES
        if name in statuses and statuses[name].get("status") != "ready"
    )
    if not_ready:
        failures = statuses.get("store", {}).get("recent_failures")
        raise ServiceUnavailable(
            f"not ready: {', '.join(not_ready)}",
            code="not_ready",
            components={name: statuses[name].get("status") for name in not_ready},
            **({"store_failures": failures} if failures else {}),
        )
    return web.json_response(
        {"status": "ready", "components": {k: v.get("status") for k, v in statuses.items()}}
    )


@routes.get("/metrics")
@public
async def metrics(request: web.Request) -> web.Response:
    """Prometheus text exposition: the counters (every worker's), then this worker's state (its
    store figures read at most once a second)."""
    body = await scrape(request.app)
    response = web.Response(body=body)
    response.headers["Content-Type"] = CONTENT_TYPE_LATEST
    return response
