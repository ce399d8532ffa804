"""Single sign-on into the console: "Sign in with <provider>" ending in a console session.

The sign-in page offers one button per configured OpenID provider (``OidcSignIn.listing``),
linking to the provider's login URL with ``next`` (a console path). That start sets, next to
the cookie binding the pending sign-in to the browser, a marker naming where the console goes
afterwards and bound to that same browser secret (a marker left over from an earlier attempt
never matches a newer sign-in). When the provider's redirect returns to the one registered
callback, the marker turns the result into a console session: the same signed cookie a password
sign-in sets (``HttpOnly``, ``SameSite=Strict``, ``Path=/console``, bound to the store session
the sign-in just opened), never a token in a page.

The callback answers with a small page that moves on to the console by itself (``Refresh``):
the callback is reached by a navigation the provider's site started, on which browsers do not
send a ``SameSite=Strict`` cookie, so a plain redirect would arrive without the new session.

Step-up works the same way: a production ticket's page offers a person signed in through a
provider "Confirm at the sign-in provider" (``POST /console/tickets/<id>/step-up``), which starts
the provider step-up of the console session (``prompt=login``, ``max_age=0``, the provider's
``acr_values``) with a marker for the ticket's page; the callback checks the same person came
back, recently and strongly enough (``oidc.py``), records the step-up on the session and answers
with the console cookie for it, stepped up, in the browser that asked only.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
from urllib.parse import urlencode

from aiohttp import web

from .. import clock
from ..authn.sessions import Authenticator, IssuedToken
from ..storelink import STORE
from . import pages
from . import session as cookies

__all__ = [
    "MARKER_COOKIE",
    "SHOWN_ERRORS",
    "console_next",
    "marker",
    "provider_buttons",
    "refused",
    "signed_in",
]

#: Set with the browser-binding cookie when a sign-in is started for the console.
MARKER_COOKIE = "cp_oidc_console"
log = logging.getLogger("controlplane.console")
#: Refusals the sign-in page names; any other is shown as ``sso_failed`` (the details are in the
#: service's log, with the correlation id).
SHOWN_ERRORS = frozenset({"identity_provider_unavailable", "idp_refused", "subject_not_allowed",
                          "subject_collision", "subject_invalid"})


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
    return cookies.safe_next(path)


def provider_buttons(listing: list[dict[str, str]], next_path: str) -> list[tuple[str, str]]:
    """``(label, href)`` per provider: its login URL, asking to come back to ``next_path``."""
    query = urlencode({"next": cookies.safe_next(next_path)})
    return [(entry["display_name"], f"{entry['login_url']}?{query}") for entry in listing]


async def signed_in(request: web.Request, authenticator: Authenticator, issued: IssuedToken,
                    next_path: str, *, stepped: bool = False) -> web.Response:
    """The callback's answer for a console sign-in: the console cookie for the store session
    the sign-in opened (the access token stays on the server), and a page that moves on.
    ``stepped``: a console step-up at the provider (re-authentication of the same person,
    recorded on the session): the cookie for that session, stepped up, back to the ticket."""
    now = clock.now()
    principal = await authenticator.authenticate_bearer(issued.access_token, now)
    stored = await request.app[STORE].require().get_session(principal.session_id)
    expires = stored.expires_at if stored is not None else now + authenticator.settings.token_ttl_s
    value, _ = cookies.issue(authenticator, principal, expires_at=expires, now=now,
                             stepped=stepped and principal.step_up_at is not None)
    response = web.Response(
        text=pages.signed_in_page(who=principal.subject_id, next_path=next_path,
                                  stepped=stepped),
        content_type="text/html", charset="utf-8", headers={"Refresh": f"0; url={next_path}"})
    pages.secure(response)
    cookies.set_cookie(request, response, value)
    log.info("console sign-in", extra={"fields": {"event": "console.signed_in",
                                                   "subject": principal.subject_id,
                                                   "method": principal.authn_method}})
    return response


def refused(request: web.Request, code: str, next_path: str) -> web.Response:
    """A console sign-in the callback refused: back to the console's sign-in page, which says
    why in words (a known code) and offers the buttons again; never a JSON problem page."""
    shown = code if code in SHOWN_ERRORS else "sso_failed"
    response = web.Response(status=303, headers={
        "Location": "/console/login?" + urlencode({"next": next_path, "sso_error": shown})})
    pages.secure(response)
    return response
