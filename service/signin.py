"""Browser sign-in at an OpenID provider over HTTP: how it starts and where it lands.

One start for every entrance: the API's login and step-up routes (``api/federation.py``) and
the console's "Confirm at the sign-in provider" link. A sign-in started for the console carries,
next to the cookie binding the pending sign-in to the browser, a marker naming the console path
to land on, bound to that same browser secret (a marker left from an earlier attempt never
matches a newer sign-in). The provider's redirect returns to the API's one registered callback,
which hands a console sign-in to the console through ``CONSOLE_LANDING`` (set by the console at
startup): the API serves the callback without knowing how the console answers it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from typing import Protocol

from aiohttp import web

from . import clock
from .authn.federation import FEDERATION, Federation
from .authn.federation.oidc import BROWSER_COOKIE, ProviderUnavailable, SignInRefused
from .authn.sessions import AUTHENTICATOR, Authenticator, IssuedToken
from .consolesession import safe_next
from .errors import BadRequest, NotFound, ServiceUnavailable, Unauthorized
from .storelink import STORE

__all__ = [
    "CONSOLE_LANDING",
    "MARKER_COOKIE",
    "ConsoleLanding",
    "authenticator_of",
    "console_next",
    "federation_of",
    "marker",
    "provider_unavailable",
    "refusal",
    "sign_in_cookie",
    "start",
]

#: Set with the browser-binding cookie when a sign-in is started for the console.
MARKER_COOKIE = "cp_oidc_console"


class ConsoleLanding(Protocol):
    """How a sign-in started for the console ends (``console/federated.py``)."""

    async def signed_in(self, request: web.Request, authenticator: Authenticator,
                        issued: IssuedToken, next_path: str, *,
                        stepped: bool = False) -> web.Response:
        """The console session the sign-in opened (or stepped up), landing on ``next_path``."""
        ...

    def refused(self, request: web.Request, code: str, next_path: str) -> web.Response:
        """Back to the console's sign-in page, saying why (``code``)."""
        ...


#: How a sign-in at a provider started for the console ends (set by ``setup_console``).
CONSOLE_LANDING: web.AppKey[ConsoleLanding] = web.AppKey("console_landing")


def authenticator_of(request: web.Request) -> Authenticator:
    """The authenticator, or 503 ``authentication_unavailable`` when no store is configured (a
    configured store that is not connected yet answers 503 ``store_unavailable`` per call)."""
    if not request.app[STORE].configured:
        raise ServiceUnavailable("authentication needs a store (store.backend is none)",
                                 code="authentication_unavailable")
    return request.app[AUTHENTICATOR]


def federation_of(request: web.Request) -> Federation:
    """Identity federation, or 503 as ``authenticator_of``."""
    authenticator_of(request)
    return request.app[FEDERATION]


def refusal(exc: SignInRefused) -> Exception:
    """The problem a refused sign-in answers with."""
    if exc.code == "provider_unknown":
        return NotFound(exc.detail, code="provider_unknown")
    if exc.code in ("invalid_request", "invalid_grant"):
        return BadRequest(exc.detail, code=exc.code)
    return Unauthorized(exc.detail, code=exc.code)


def provider_unavailable() -> ServiceUnavailable:
    return ServiceUnavailable("the identity provider cannot be reached; try again later",
                              code="identity_provider_unavailable", headers={"Retry-After": "5"})


def sign_in_cookie(federation: Federation, name: str) -> tuple[str, str, bool]:
    """``(name, path, secure)`` of a sign-in cookie (the browser binding, the console marker).

    When the callback is served over HTTPS (``redirect_base_url``): ``__Host-<name>``,
    ``Path=/``, ``Secure``, so a sibling subdomain cannot plant a binding of its own (a login
    CSRF). Over plain HTTP (local development) the plain name on the sign-in paths."""
    if federation.oidc.config.redirect_base_url.startswith("https://"):
        return "__Host-" + name, "/", True
    return name, "/api/v1/authn/oidc/", False


def _tag(browser_secret: str) -> str:
    digest = hashlib.sha256(b"console-sign-in\x00" + browser_secret.encode()).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def marker(browser_secret: str, next_path: str) -> str:
    """The marker cookie's value: bound to this sign-in's browser secret, with the console
    path to land on (base64url, so it is a plain cookie value)."""
    encoded = base64.urlsafe_b64encode(next_path.encode()).rstrip(b"=").decode("ascii")
    return f"{_tag(browser_secret)}.{encoded}"


def console_next(value: str | None, browser_secret: str | None) -> str | None:
    """The console path a callback lands on when ``value`` marks this browser's sign-in as a
    console sign-in; ``None`` when it is not one (an API or CLI sign-in)."""
    if not value or not browser_secret or len(value) > 1024:
        return None
    tag, sep, encoded = value.partition(".")
    if not sep or not hmac.compare_digest(tag.encode(), _tag(browser_secret).encode()):
        return None
    try:
        path = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
    return safe_next(path)


async def start(request: web.Request, provider: str, purpose: str, session_id: str | None,
                console_path: str | None, *, cli_redirect: str | None = None,
                cli_challenge: str | None = None) -> web.Response:
    """Start a sign-in (``login``) or a step-up (``step_up`` of ``session_id``) at ``provider``.

    With ``console_path`` the browser is sent to the provider (302) and the callback ends in
    the console, landing there: a console session (sign-in), or the console session stepped up
    (step-up: the console's "Confirm at the sign-in provider" button). A bearer step-up (API,
    CLI) gets the URL to open instead (201)."""
    federation = federation_of(request)
    try:
        url, browser = await federation.oidc.start(
            request.app[STORE].require(), provider, clock.now(),
            purpose=purpose, session_id=session_id, cli_redirect=cli_redirect,
            cli_challenge=cli_challenge,
        )  # fmt: skip
    except SignInRefused as exc:
        raise refusal(exc) from None
    except ProviderUnavailable:
        raise provider_unavailable() from None
    if purpose == "step_up" and console_path is None:
        # A bearer request (API or CLI) gets the URL to open; the pending request is bound to
        # the caller's session instead of a browser (the IdP must return the same person).
        response: web.Response = web.json_response({"authorization_url": url}, status=201)
    else:
        response = web.Response(status=302, headers={"Location": url})
    ttl = federation.oidc.config.login_ttl_s
    name, path, secure = sign_in_cookie(federation, BROWSER_COOKIE)
    response.set_cookie(name, browser, max_age=ttl, httponly=True, samesite="Lax", path=path,
                        secure=secure)
    name, path, secure = sign_in_cookie(federation, MARKER_COOKIE)
    if console_path is not None:
        # A console sign-in (or step-up): the callback ends in a console cookie session,
        # landing here.
        response.set_cookie(name, marker(browser, console_path), max_age=ttl,
                            httponly=True, samesite="Lax", path=path, secure=secure)
    else:
        response.del_cookie(name, path=path)
    response.headers["Cache-Control"] = "no-store"
    return response
