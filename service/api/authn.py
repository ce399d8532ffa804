"""AuthN self-service: log in, step up, renew, who am I, log out, JWKS.

These routes are outside the policy chain on purpose: logging in is how a principal comes to
exist, and the others act only on the caller's own session. They are still fail-closed: a route
that needs a caller answers 401 without one.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from .. import clock
from ..appkeys import AUTHN_ERROR
from ..authn.principal import PRINCIPAL, Principal
from ..authn.sessions import IssuedToken
from ..authz.engine import ENGINE
from ..body import read_json
from ..chain import public
from ..config import CONFIG
from ..errors import Unauthorized, to_problem
from ..signin import authenticator_of
from ..store.base import StoreUnavailable

routes = web.RouteTableDef()


def caller(request: web.Request) -> Principal:
    """The authenticated caller of a self-service route; 401 (or 503 when the session cannot
    be checked) without one."""
    principal = request[PRINCIPAL]
    if not principal.is_authenticated:
        if request.get(AUTHN_ERROR) == "store_unavailable":
            raise to_problem(StoreUnavailable("the session cannot be checked"))
        raise Unauthorized(code=request.get(AUTHN_ERROR) or "unauthenticated")
    return principal


def token_body(issued: IssuedToken) -> dict[str, Any]:
    """The token answer (RFC 6749 §5.1) of an issued token."""
    body: dict[str, Any] = {
        "access_token": issued.access_token,
        "token_type": "Bearer",
        "expires_in": issued.expires_in,
        "session_id": issued.session_id,
    }
    if issued.refresh_token is not None:
        body["refresh_token"] = issued.refresh_token
    return body


def client_addr(request: web.Request) -> str | None:
    """The client address logins are throttled and logged by."""
    # The peer address; forwarded headers are not trusted (no proxy configuration exists).
    return request.remote


@routes.post("/api/v1/authn/sessions")
@public
async def create_session(request: web.Request) -> web.Response:
    """Log in with ``{subject_id, password}`` (people) or ``{assertion}`` (services, agents)."""
    authenticator = authenticator_of(request)
    body = await read_json(request, "authn-session.schema.json")
    now = clock.now()
    if "assertion" in body:
        issued = await authenticator.login_assertion(body["assertion"], client_addr(request), now)
    else:
        issued = await authenticator.login_password(
            body["subject_id"], body["password"], client_addr(request), now
        )
    return web.json_response(token_body(issued), status=201)


@routes.get("/api/v1/authn/sessions/current")
@public
async def current_session(request: web.Request) -> web.Response:
    """The caller's principal (the same document the policy sees), with the roles and groups
    the serving policy data gives them: those the IdP groups of an OIDC session are bound to
    included (read at this moment, never from the token)."""
    principal = caller(request)
    config = request.app[CONFIG]
    doc = principal.to_input(clock.now(), config.authn.step_up_window_s)
    facts = request.app[ENGINE].facts(principal.subject_id, "approvals.read", principal.idp_groups)
    doc["roles"], doc["groups"] = sorted(facts["roles"]), sorted(facts["groups"])
    return web.json_response(doc)


@routes.delete("/api/v1/authn/sessions/current")
@public
async def delete_session(request: web.Request) -> web.Response:
    """Revoke the caller's session: every token of it stops working on every worker at once."""
    principal = caller(request)
    await authenticator_of(request).revoke(principal, clock.now())
    return web.Response(status=204)


@routes.post("/api/v1/authn/step-up")
@public
async def step_up(request: web.Request) -> web.Response:
    """Verify a TOTP code (once) and return a fresh token carrying ``acr``/``amr``."""
    principal = caller(request)
    body = await read_json(request, "authn-step-up.schema.json")
    issued = await authenticator_of(request).step_up(
        principal, body["otp"], clock.now(), client_addr(request)
    )
    return web.json_response(token_body(issued), status=201)


@routes.post("/api/v1/authn/token/renew")
@public
async def renew(request: web.Request) -> web.Response:
    """Trade the session's renewal credential (``refresh_token`` of a token answer) for a new
    access token of the same live session: 401 once it is logged out, revoked or expired; the
    step-up is carried over as it was, never renewed (``authn/renewal.py``)."""
    body = await read_json(request, "authn-token-renew.schema.json")
    issued = await authenticator_of(request).renew(body["refresh_token"], clock.now())
    response = web.json_response(token_body(issued), status=201)
    response.headers["Cache-Control"] = "no-store"
    return response


@routes.get("/api/v1/authn/jwks.json")
@public
async def jwks(request: web.Request) -> web.Response:
    """The public keys that verify our access tokens (RFC 7517)."""
    response = web.json_response(authenticator_of(request).jwks(clock.now()))
    response.content_type = "application/jwk-set+json"
    return response
