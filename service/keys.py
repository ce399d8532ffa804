"""Every typed key for application and request state (aiohttp ``AppKey``/``RequestKey``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web

from .authn.principal import Principal
from .config import Config

if TYPE_CHECKING:
    from .services import Services

__all__ = [
    "AUTHN_ERROR",
    "COMPONENTS",
    "CONFIG",
    "CORRELATION_ID",
    "METRICS",
    "PRINCIPAL",
    "SERVICES",
    "STARTED_AT",
]

CONFIG = web.AppKey("config", Config)
STARTED_AT = web.AppKey("started_at", float)
#: Metrics registry and instruments (``service.middleware.metrics.Metrics``).
METRICS = web.AppKey("metrics", Any)
#: Per-component status reporters for /readyz and system/info: name -> async callable -> dict.
COMPONENTS = web.AppKey("components", dict)
#: The opened subsystems (store, audit, engine, authenticator), set up in ``cleanup_ctx``.
SERVICES: web.AppKey[Services] = web.AppKey("services")

CORRELATION_ID = web.RequestKey("correlation_id", str)
#: Who is calling: a Principal, or ANONYMOUS. Set by the authn middleware on every request.
PRINCIPAL = web.RequestKey("principal", Principal)
#: The stable code of a presented token that failed verification (for the chain's 401).
AUTHN_ERROR = web.RequestKey("authn_error", str)
