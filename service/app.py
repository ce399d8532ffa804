"""Build the aiohttp application from a ``Config``: middlewares in order, routes, resources."""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from .api import routes as api_routes
from .config import Config
from .keys import COMPONENTS, CONFIG, STARTED_AT
from .middleware.authn import setup_authn
from .middleware.correlation import setup_correlation
from .middleware.headers import setup_headers
from .middleware.metrics import setup_metrics
from .middleware.problems import setup_problems
from .services import setup_services

__all__ = ["create_app"]

MAX_HEADER_FIELD_BYTES = 128 * 1024


def create_app(config: Config) -> web.Application:
    """The whole service as one application; resources open in ``cleanup_ctx`` on start-up."""
    app = web.Application(
        client_max_size=config.server.max_body_bytes,
        # aiohttp's parser answers an over-long header with a plain-text 400 before any
        # middleware runs. Let header fields through up to 128 KiB so that an oversized bearer
        # token reaches the token verifier (which caps tokens at 8 KiB) and gets a problem.
        handler_args={"max_field_size": MAX_HEADER_FIELD_BYTES},
    )
    app[CONFIG] = config
    app[STARTED_AT] = time.time()
    app[COMPONENTS] = {}

    async def config_status() -> dict[str, Any]:
        return {"status": "ready", "mode": config.mode}

    app[COMPONENTS]["config"] = config_status

    # Middleware order, outermost first. correlation first: everything inside logs with the id
    # and every response echoes it. metrics and headers sit outside problems, so they see the
    # final status of error responses (500s included) and decorate them too. problems is the
    # only catch-all. authn is innermost: it only attaches who is calling, and a store error
    # it meets is rendered by problems.
    setup_correlation(app)
    setup_metrics(app)
    setup_headers(app)
    setup_problems(app)
    setup_authn(app)

    setup_services(app)

    api_routes.add_routes(app)
    return app
