"""Every typed key for application and request state (aiohttp ``AppKey``/``RequestKey``)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from .config import Config

__all__ = ["COMPONENTS", "CONFIG", "CORRELATION_ID", "METRICS", "STARTED_AT"]

CONFIG = web.AppKey("config", Config)
STARTED_AT = web.AppKey("started_at", float)
#: Metrics registry and instruments (``service.middleware.metrics.Metrics``).
METRICS = web.AppKey("metrics", Any)
#: Per-component readiness reporters for /readyz and system/info: name -> callable -> dict.
COMPONENTS = web.AppKey("components", dict)

CORRELATION_ID = web.RequestKey("correlation_id", str)
