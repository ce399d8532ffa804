"""The console's cookie session: a signed credential bound to a store session, and its CSRF token.

The authn middleware identifies every request under ``/console/`` by this cookie alone
(``session_of``); the console sets, clears and re-checks it. It lives outside the console so
that identification stays in the middleware and the OIDC callback can land in the console.

The cookie holds a compact JWS of its own type (``console-session+jwt``), signed with the same
key ring as access tokens but never accepted as one (the access-token verifier refuses any other
``typ``, and the API reads only the ``Authorization`` header). It names the store session a
password login opened, so every request re-checks that session (``Authenticator.
session_principal``): a logout anywhere, an expiry or a disabled identity ends the console
session at once, on every worker and replica. It carries a random CSRF token, the
synchronizer token every state-changing form must echo (compared in constant time); the token
is tied to this session and changes with each sign-in. The cookie is ``HttpOnly`` (page
JavaScript never sees it) and ``SameSite=Strict``.

Served over HTTPS (``over_tls``) every console cookie carries the ``__Host-`` prefix
(``__Host-cp_console``: ``Secure``, ``Path=/``, no ``Domain``; RFC 6265bis §4.1.3.2), and only
prefixed cookies are read: a browser accepts such a cookie only from this very host over TLS,
so a sibling subdomain (which can set a cookie for the parent domain) cannot plant a session or
a CSRF token the console would take. The development exception: over plain HTTP (``cpctl
serve`` on loopback) browsers refuse ``Secure`` cookies, so the plain names are used there
(``cp_console``, ``Path=/console``, not ``Secure``). A TLS-terminating proxy must say so with
``X-Forwarded-Proto: https``, or the console takes itself for plain HTTP.
"""

from __future__ import annotations

import hmac
import math
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from . import clock
from .authn.errors import ClaimsInvalid, InvalidToken, IssuerMismatch, UnknownKey
from .authn.principal import Principal
from .authn.sessions import AUTHENTICATOR, Authenticator
from .authn.tokens import check_audience, check_time, encode, parse, require_string

__all__ = [
    "CONSOLE_PREFIX",
    "CONSOLE_SESSION",
    "CONSOLE_TYP",
    "COOKIE",
    "ConsoleSession",
    "csrf_matches",
    "issue",
    "safe_next",
    "session_of",
    "verify",
]

#: Every console route but ``GET /`` (a redirect here) is under this path: requests to it are
#: identified by the console cookie alone, every other request by its bearer token alone.
CONSOLE_PREFIX = "/console/"
COOKIE = "cp_console"
COOKIE_PATH = "/console"
#: Over TLS: ``Secure``, ``Path=/``, no ``Domain``, enforced by the browser (RFC 6265bis).
HOST_PREFIX = "__Host-"
CONSOLE_TYP = "console-session+jwt"
#: The console's audience: distinct from the API's, so the claims say what the credential is for.
AUDIENCE_SUFFIX = "#console"
CLAIMS = frozenset({"iss", "aud", "sub", "sid", "kind", "iat", "exp", "csrf", "stp"})
_CSRF_BYTES = 32


@dataclass(frozen=True)
class ConsoleSession:
    """A verified console cookie: who, which store session, its CSRF token, and step-up."""

    principal: Principal
    csrf: str
    stepped: bool
    expires_at: float


#: On a console request (``CONSOLE_PREFIX``): the session its cookie stands for (its CSRF token,
#: its step-up), or None. Set by the authn middleware with ``PRINCIPAL``.
CONSOLE_SESSION: web.RequestKey[ConsoleSession | None] = web.RequestKey("console_session")


def issue(authenticator: Authenticator, principal: Principal, *, expires_at: float, now: float,
          csrf: str | None = None, stepped: bool = False) -> tuple[str, str]:
    """A signed cookie value for ``principal``'s session (and its CSRF token: new unless given)."""
    csrf = csrf or secrets.token_urlsafe(_CSRF_BYTES)
    settings = authenticator.settings
    claims: dict[str, Any] = {
        "iss": settings.issuer,
        "aud": settings.audience + AUDIENCE_SUFFIX,
        "sub": principal.subject_id,
        "sid": principal.session_id,
        "kind": principal.kind,
        "iat": int(now),
        "exp": max(int(now) + 1, math.floor(expires_at)),
        "csrf": csrf,
        "stp": stepped,
    }
    key = authenticator.keys.signing_key()
    return encode(claims, key.private_key, typ=CONSOLE_TYP, kid=key.kid), csrf


async def verify(authenticator: Authenticator, value: str, now: float) -> ConsoleSession:
    """The session a cookie value stands for; raises an ``InvalidToken`` subclass."""
    settings = authenticator.settings
    jws = parse(value, typ=CONSOLE_TYP, require_kid=True)
    key = authenticator.keys.verification_key(jws.kid or "", now)
    if key is None:
        raise UnknownKey()
    jws.verify_signature(key)
    claims: Mapping[str, Any] = jws.claims()
    if set(claims) != CLAIMS or not isinstance(claims["stp"], bool):
        raise ClaimsInvalid()
    for name in ("sub", "sid", "kind", "csrf"):
        require_string(claims, name)
    if claims["iss"] != settings.issuer:
        raise IssuerMismatch()
    check_audience(claims, settings.audience + AUDIENCE_SUFFIX)
    check_time(claims, now, skew_s=settings.clock_skew_s,
               max_lifetime_s=settings.session_ttl_s + settings.clock_skew_s)
    principal = await authenticator.session_principal(
        claims["sub"], claims["kind"], claims["sid"], stepped=claims["stp"], now=now)
    return ConsoleSession(principal, claims["csrf"], claims["stp"], float(claims["exp"]))


def csrf_matches(session: ConsoleSession, presented: str | None) -> bool:
    """The synchronizer-token check, in constant time."""
    if not isinstance(presented, str) or not presented:
        return False
    return hmac.compare_digest(presented.encode("utf-8", "replace"), session.csrf.encode())


def safe_next(value: str | None) -> str:
    """Where to go after signing in: only a console path of this site (no scheme, no host, no
    ``//``, no backslash, no control character); anything else is the inbox."""
    if (not value or not value.startswith("/console/") or "//" in value or "\\" in value
            or any(ord(c) < 0x20 or ord(c) == 0x7F for c in value) or len(value) > 512):
        return "/console/"
    return value


def over_tls(request: web.Request) -> bool:
    """Whether the browser reached us over TLS: directly, or through a TLS-terminating proxy
    that says so in ``X-Forwarded-Proto``. Trusting that header is safe here, as it only ever
    makes a cookie stricter (``Secure``): a client that forges it over plain HTTP just stops
    getting its own cookie back."""
    forwarded = request.headers.get("X-Forwarded-Proto", "").split(",")[0].strip().lower()
    return request.secure or forwarded == "https"


def cookie_name(request: web.Request, name: str = COOKIE) -> str:
    """The name a console cookie has on this request: ``__Host-<name>`` over TLS."""
    return HOST_PREFIX + name if over_tls(request) else name


def _where(request: web.Request, name: str) -> tuple[str, str, bool]:
    tls = over_tls(request)
    return (HOST_PREFIX + name, "/", True) if tls else (name, COOKIE_PATH, False)


def set_cookie(request: web.Request, response: web.StreamResponse, value: str,
               name: str = COOKIE) -> None:
    """Set a console cookie (a browser-session cookie: no Max-Age; the JWS carries the expiry)."""
    full, path, secure = _where(request, name)
    response.set_cookie(full, value, path=path, httponly=True, samesite="Strict", secure=secure)


def clear_cookie(request: web.Request, response: web.StreamResponse, name: str = COOKIE) -> None:
    full, path, secure = _where(request, name)
    response.del_cookie(full, path=path, httponly=True, samesite="Strict", secure=secure)


def presented(request: web.Request, name: str = COOKIE) -> str | None:
    """The value of the console cookie ``name`` this request carries, if any (over TLS only
    the ``__Host-`` one: a cookie without the prefix may come from a sibling subdomain)."""
    return request.cookies.get(cookie_name(request, name)) or None


async def session_of(request: web.Request) -> ConsoleSession | None:
    """The console session the request's cookie stands for, checked against the store now
    (None: no cookie, or one that is not a live session's). A store outage raises
    ``StoreUnavailable``: it is not an answer about the cookie."""
    value = presented(request)
    if value is None:
        return None
    try:
        return await verify(request.app[AUTHENTICATOR], value, clock.now())
    except InvalidToken:
        return None
