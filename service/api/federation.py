"""Identity federation routes: OIDC sign-in and IdP step-up (people), token exchange (workloads).

Public like the rest of AuthN self-service: signing in is how a principal comes to exist. The
token exchange speaks RFC 8693 (form-encoded); its failures are problems whose ``code`` (and
``error``) is the RFC 6749 error code. The sign-in pages answer with problems too.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import parse_qsl

from aiohttp import web

from .. import clock, signin
from ..authn.federation import FEDERATION
from ..authn.federation.oidc import (
    BROWSER_COOKIE,
    CallbackResult,
    ProviderUnavailable,
    SignInRefused,
)
from ..authn.federation.workload import (
    ACCESS_TOKEN_TYPE,
    GRANT_TYPE,
    ID_TOKEN_TYPE,
    JWT_TOKEN_TYPE,
    ExchangeRefused,
    IssuerUnavailable,
)
from ..authn.stepup import METHOD_OIDC
from ..body import read_json
from ..chain import public
from ..consolesession import safe_next
from ..errors import BadRequest, ServiceUnavailable, Unauthorized
from ..signin import CONSOLE_LANDING
from ..storelink import STORE
from .authn import caller, client_addr, token_body

routes = web.RouteTableDef()

_FORM = "application/x-www-form-urlencoded"
_MAX_FORM_BYTES = 65536
_LOGIN_PATH = "/api/v1/authn/oidc/{provider}"


def _oauth_error(code: str, detail: str, status: int = 400) -> BadRequest | Unauthorized:
    cls = Unauthorized if status == 401 else BadRequest
    return cls(detail, code=code, error=code, error_description=detail)


@routes.get("/api/v1/authn/oidc/providers")
@public
async def providers(request: web.Request) -> web.Response:
    """The configured sign-in providers (for a sign-in page): name, label, login URL."""
    return web.json_response({"providers": request.app[FEDERATION].oidc.listing()})


async def _start(request: web.Request, purpose: str, session_id: str | None) -> web.Response:
    query = request.query
    console_path = query.get("next") if purpose == "login" else None
    if console_path is not None and (safe_next(console_path) != console_path
                                     or "cli_redirect" in query):
        raise BadRequest("next must be a console path (/console/...) and cannot go with "
                         "cli_redirect", code="invalid_request")
    return await signin.start(request, request.match_info["provider"], purpose, session_id,
                       console_path, cli_redirect=query.get("cli_redirect"),
                       cli_challenge=query.get("cli_challenge"))


@routes.get(_LOGIN_PATH + "/login")
@public
async def login(request: web.Request) -> web.Response:
    """Start the browser sign-in: 302 to the provider (code flow, PKCE S256, state, nonce).
    With ``next`` (a console path) it ends in a console session instead of a token."""
    return await _start(request, "login", None)


@routes.post(_LOGIN_PATH + "/step-up")
@public
async def step_up(request: web.Request) -> web.Response:
    """Start a step-up by re-authentication at the IdP for the caller's OIDC session."""
    principal = caller(request)
    if principal.authn_method != METHOD_OIDC:
        raise BadRequest("only a session signed in through OpenID Connect steps up at the IdP",
                         code="step_up_not_available")
    return await _start(request, "step_up", principal.session_id)


@routes.get(_LOGIN_PATH + "/callback")
@public
async def callback(request: web.Request) -> web.Response:
    """The provider's redirect: verify everything, open our session, answer with our token (or
    hand off to the CLI's loopback port, or set the console's cookie for a console sign-in)."""
    federation = signin.federation_of(request)
    authenticator = signin.authenticator_of(request)
    browser_name, browser_path, _ = signin.sign_in_cookie(federation, BROWSER_COOKIE)
    marker_name, marker_path, _ = signin.sign_in_cookie(federation, signin.MARKER_COOKIE)
    browser = request.cookies.get(browser_name)
    console_path = signin.console_next(request.cookies.get(marker_name), browser)
    landing = request.app[CONSOLE_LANDING]
    try:
        result = await federation.oidc.callback(
            authenticator, request.match_info["provider"], request.query, browser, clock.now()
        )
    except SignInRefused as exc:
        authenticator.failed(exc.reason.split(":", 1)[0])
        _log_refusal(request, exc.reason)
        if console_path is None:
            raise signin.refusal(exc) from None
        response = landing.refused(request, exc.code, console_path)
    except ProviderUnavailable:
        if console_path is None:
            raise signin.provider_unavailable() from None
        response = landing.refused(request, "identity_provider_unavailable", console_path)
    else:
        response = await _signed_in(request, result, console_path)
    response.del_cookie(browser_name, path=browser_path)
    if console_path is not None:
        response.del_cookie(marker_name, path=marker_path)
    response.headers["Cache-Control"] = "no-store"
    return response


async def _signed_in(request: web.Request, result: CallbackResult,
                     console_path: str | None) -> web.Response:
    """The callback's answer once the sign-in succeeded: the CLI handoff, the console's
    session, or our token."""
    if result.redirect is not None:
        return web.Response(status=302, headers={"Location": result.redirect})
    assert result.issued is not None
    landing, authenticator = request.app[CONSOLE_LANDING], signin.authenticator_of(request)
    if console_path is not None and result.purpose == "login":
        return await landing.signed_in(request, authenticator, result.issued, console_path)
    if console_path is not None and result.purpose == "step_up":
        if not result.browser_bound:
            # A console step-up ends in a console cookie: only in the browser that asked.
            return landing.refused(request, "sso_failed", console_path)
        return await landing.signed_in(request, authenticator, result.issued, console_path,
                                       stepped=True)
    return web.json_response(token_body(result.issued), status=201)


@routes.post(_LOGIN_PATH + "/device")
@public
async def device(request: web.Request) -> web.Response:
    """Start a device authorization (RFC 8628): the user code and URL to show the person."""
    federation = signin.federation_of(request)
    try:
        body = await federation.oidc.start_device(
            request.app[STORE].require(), request.match_info["provider"], clock.now())
    except SignInRefused as exc:
        raise signin.refusal(exc) from None
    except ProviderUnavailable:
        raise signin.provider_unavailable() from None
    response = web.json_response(body, status=201)
    response.headers["Cache-Control"] = "no-store"
    return response


@routes.post(_LOGIN_PATH + "/device/token")
@public
async def device_token(request: web.Request) -> web.Response:
    """Poll a device authorization: 201 with the token once approved, else 400 with the
    RFC 8628 code (``authorization_pending``, ``slow_down``, ``expired_token``, ``access_denied``)."""
    federation = signin.federation_of(request)
    authenticator = signin.authenticator_of(request)
    body = await read_json(request, "authn-oidc-device-token.schema.json")
    try:
        issued = await federation.oidc.poll_device(
            authenticator, request.match_info["provider"], body["device_request"], clock.now())
    except SignInRefused as exc:
        if exc.code in _DEVICE_CODES:
            if exc.code not in ("authorization_pending", "slow_down"):
                authenticator.failed(exc.reason.split(":", 1)[0])
            raise _oauth_error(exc.code, exc.detail) from None
        authenticator.failed(exc.reason.split(":", 1)[0])
        _log_refusal(request, exc.reason)
        raise signin.refusal(exc) from None
    except ProviderUnavailable:
        raise signin.provider_unavailable() from None
    return web.json_response(token_body(issued), status=201)


_DEVICE_CODES = frozenset({"authorization_pending", "slow_down", "expired_token", "access_denied"})


@routes.post("/api/v1/authn/oidc/handoff")
@public
async def handoff(request: web.Request) -> web.Response:
    """A CLI redeems its one-time loopback code with its PKCE verifier for the token."""
    federation = signin.federation_of(request)
    body = await read_json(request, "authn-oidc-handoff.schema.json")
    try:
        issued = await federation.oidc.redeem_handoff(
            signin.authenticator_of(request), body["code"], body["code_verifier"], clock.now()
        )
    except SignInRefused as exc:
        raise signin.refusal(exc) from None
    return web.json_response(token_body(issued), status=201)


@routes.post("/api/v1/authn/token-exchange")
@public
async def token_exchange(request: web.Request) -> web.Response:
    """RFC 8693: a workload's own OIDC token (``subject_token``) for our access token."""
    federation = signin.federation_of(request)
    authenticator = signin.authenticator_of(request)
    form = await _form(request)
    if form.get("grant_type") != GRANT_TYPE:
        raise _oauth_error("unsupported_grant_type", f"grant_type must be {GRANT_TYPE}")
    token, token_type = form.get("subject_token"), form.get("subject_token_type")
    if not token or token_type not in (JWT_TOKEN_TYPE, ID_TOKEN_TYPE):
        raise _oauth_error("invalid_request",
                           f"subject_token and subject_token_type ({JWT_TOKEN_TYPE}) are required")
    if form.get("requested_token_type", ACCESS_TOKEN_TYPE) != ACCESS_TOKEN_TYPE:
        raise _oauth_error("invalid_request", "only access tokens are issued")
    if "actor_token" in form:
        raise _oauth_error("invalid_request", "delegation (actor_token) is not supported")
    try:
        issued, _subject, _kind = await federation.workload.exchange(
            authenticator, token, clock.now()
        )
    except ExchangeRefused as exc:
        authenticator.failed(exc.reason.split(":", 1)[0])
        _log_refusal(request, exc.reason)
        raise _oauth_error("invalid_grant", "the subject token is not accepted") from None
    except IssuerUnavailable:
        raise ServiceUnavailable("the token's issuer cannot be reached; try again later",
                                 code="temporarily_unavailable", error="temporarily_unavailable",
                                 headers={"Retry-After": "5"}) from None
    body: dict[str, Any] = {**token_body(issued), "issued_token_type": ACCESS_TOKEN_TYPE}
    response = web.json_response(body)
    response.headers["Cache-Control"] = "no-store"
    return response


async def _form(request: web.Request) -> dict[str, str]:
    if request.content_type != _FORM:
        raise _oauth_error("invalid_request", f"the body must be {_FORM}")
    if (request.content_length or 0) > _MAX_FORM_BYTES:
        raise _oauth_error("invalid_request", "the body is too large")
    raw = await request.read()
    if len(raw) > _MAX_FORM_BYTES:
        raise _oauth_error("invalid_request", "the body is too large")
    try:
        pairs = parse_qsl(raw.decode("utf-8"), strict_parsing=bool(raw), max_num_fields=20)
    except (UnicodeDecodeError, ValueError):
        raise _oauth_error("invalid_request", "the body is not a valid form") from None
    form: dict[str, str] = {}
    for key, value in pairs:
        if key in form:
            # RFC 6749 §3.2: parameters must not be included more than once.
            raise _oauth_error("invalid_request", f"parameter {key!r} repeated")
        form[key] = value
    return form


def _log_refusal(request: web.Request, reason: str) -> None:
    logging.getLogger("controlplane.authn").warning(
        "federated sign-in refused",
        extra={"fields": {"event": "authn.federation_refused", "reason": reason,
                          "client_addr": client_addr(request), "path": request.path}},
    )
