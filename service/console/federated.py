"""Single sign-on into the console: "Sign in with <provider>" ending in a console session.

The sign-in page offers one button per configured OpenID provider (``OidcSignIn.listing``),
linking to the provider's login URL with ``next`` (a console path). That start
(``service.signin``) sets, next to the cookie binding the pending sign-in to the browser, a
marker naming where the console goes afterwards and bound to that same browser secret. When the
provider's redirect returns to the one registered callback (the API's), the marker makes it hand
the result here (``signed_in``, ``refused``: this module is the app's ``CONSOLE_LANDING``),
which turns it into a console session: the same signed cookie a password
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

import logging
from urllib.parse import urlencode

from aiohttp import web

from .. import clock
from .. import consolesession as cookies
from ..authn.sessions import Authenticator, IssuedToken
from ..storelink import STORE
from . import pages

__all__ = [
    "SHOWN_ERRORS",
    "provider_buttons",
    "refused",
    "signed_in",
]

log = logging.getLogger("controlplane.console")
#: Refusals the sign-in page names; any other is shown as ``sso_failed`` (the details are in the
#: service's log, with the correlation id).
SHOWN_ERRORS = frozenset({"identity_provider_unavailable", "idp_refused", "subject_not_allowed",
                          "subject_collision", "subject_invalid"})


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
