"""AuthN identifies, never decides: attach a Principal or ANONYMOUS to every request.

A missing, malformed or rejected bearer token leaves the request anonymous and notes the
token's error code; 401s, 403s and step-up challenges come from the chain, and public routes
(status, health, login) are served to anonymous callers as usual.
"""

from __future__ import annotations

import logging

from aiohttp import web
from aiohttp.typedefs import Handler

from .. import clock
from ..appkeys import AUTHN_ERROR
from ..authn.errors import InvalidToken
from ..authn.principal import ANONYMOUS, PRINCIPAL
from ..authn.sessions import AUTHENTICATOR
from ..errors import to_problem
from ..repeats import log_repeated
from ..store.base import StoreUnavailable
from ..storelink import STORE

log = logging.getLogger("controlplane.authn")


def bearer_token(request: web.Request) -> str | None:
    """The RFC 6750 bearer token of the Authorization header, if any."""
    header = request.headers.get("Authorization")
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def setup_authn(app: web.Application) -> None:
    """Install the authn middleware (innermost: errors it meets are rendered by ``problems``)."""

    @web.middleware
    async def authn_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        """Verify the bearer token, if any, and attach who is calling."""
        request[PRINCIPAL] = ANONYMOUS
        token = bearer_token(request)
        if token is not None and request.app[STORE].configured:
            try:
                request[PRINCIPAL] = await request.app[AUTHENTICATOR].authenticate_bearer(
                    token, clock.now()
                )
            except InvalidToken as exc:
                request[AUTHN_ERROR] = exc.code
            except StoreUnavailable as exc:
                # Revocation cannot be checked: never answer as bad credentials (a 401 would make
                # clients drop a valid token). A public route (health, status, login) serves the
                # caller anonymously and says why; any other route is refused now, as an outage
                # (503 store_unavailable, Retry-After).
                # Every request of an outage fails this way: one line per interval, counted.
                log_repeated(log, logging.ERROR, ("store.unavailable", "session_check", str(exc)),
                             "session check failed: %s", exc,
                             fields={"event": "store.unavailable", "during": "session_check"})
                if not getattr(request.match_info.handler, "public", False):
                    raise to_problem(exc) from None
                request[AUTHN_ERROR] = "store_unavailable"
        elif token is not None:
            request[AUTHN_ERROR] = "authentication_unavailable"
        return await handler(request)

    app.middlewares.append(authn_middleware)
