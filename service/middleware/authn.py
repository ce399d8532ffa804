"""AuthN identifies, never decides: attach a Principal or ANONYMOUS to every request.

A request under ``/console/`` is identified by the console's session cookie alone (a bearer
token there is ignored); any other request by its bearer token alone (a console cookie there is
ignored: the API never takes a cookie, so a foreign page cannot make a browser call it). A
missing, malformed or rejected credential leaves the request anonymous (for a bearer token,
noting its error code); 401s, 403s and step-up challenges come from the chain, and public routes
(status, health, login) are served to anonymous callers as usual. The console's forms carry
their CSRF token, which the console checks (``consolesession``).

``request[PRINCIPAL]`` is written here only: once per request by ``identify_now`` (a step of
the request layers, ``middleware.layers``, which await what it leaves to await), and again by
``step_up_console`` when the request itself steps its console session up.

Where every read is a round trip (PostgreSQL, ``Store.reads_round_trip``), a bearer request to a
chain route that presents an approval ticket has its token verified here and its session read
by the chain's first stage, in the same statement as the ticket and the task it targets
(``Store.get_run_read``; ``confirm``): one round trip where two were. Until then the request is
anonymous, and the chain checks the session before it answers anything, a malformed body
included (``chain.run``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable

from aiohttp import hdrs, web

from .. import clock, consolesession
from ..appkeys import AUTHN_ERROR
from ..approvals.redeem import TICKET_HEADER, presented_ticket_id
from ..authn.errors import InvalidToken, Unauthenticated
from ..authn.principal import ANONYMOUS, PRINCIPAL, Principal
from ..authn.sessions import AUTHENTICATOR, UNREAD, Bearer
from ..consolesession import CONSOLE_SESSION, ConsoleSession
from ..errors import to_problem
from ..repeats import log_repeated
from ..store.base import RunRead, StoreUnavailable
from ..storelink import STORE

log = logging.getLogger("controlplane.authn")

#: A bearer token verified by ``identify`` whose session the chain reads (``confirm``).
DEFERRED = web.RequestKey("deferred_bearer", Bearer)


def bearer_token(request: web.Request) -> str | None:
    """The RFC 6750 bearer token of the Authorization header, if any."""
    header = request.headers.get(hdrs.AUTHORIZATION)
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def _identify_now(request: web.Request) -> Awaitable[None] | None:
    """``_identify`` as far as it goes without waiting: None once the caller is attached (or
    their credential refused: no credential, no store to check one with, or a bearer token whose
    session the store reads at once, ``authenticate_bearer_now``); else what is left to await
    (the console's cookie, a deferred session, a read that waits, a federation's groups).
    Raises ``StoreUnavailable`` when the credential cannot be checked."""
    if request.path.startswith(consolesession.CONSOLE_PREFIX):
        return _identify(request)
    token = bearer_token(request)
    if token is None:
        return None
    app = request.app  # a property that looks through the match info: read once
    if not app[STORE].configured:
        request[AUTHN_ERROR] = "authentication_unavailable"
        return None
    if TICKET_HEADER in request.headers and _defers(request, app):
        return _identify(request)
    try:
        found = app[AUTHENTICATOR].authenticate_bearer_now(token, clock.now())
    except InvalidToken as exc:
        request[AUTHN_ERROR] = exc.code
        return None
    if found is None:
        return _identify(request)
    if isinstance(found, Principal):
        request[PRINCIPAL] = found
        return None
    return _attach(request, found)


async def _attach(request: web.Request, principal: Awaitable[Principal]) -> None:
    """``request[PRINCIPAL]`` once ``principal`` (the rest of a bearer's check) is had."""
    try:
        request[PRINCIPAL] = await principal
    except InvalidToken as exc:
        request[AUTHN_ERROR] = exc.code


async def _identify(request: web.Request) -> None:
    """Attach who is calling where ``_identify_now`` could not go on without a wait: the
    console cookie's session under ``/console/``, else the bearer token's principal (or, for a
    session the chain reads, the verified token). Raises ``StoreUnavailable`` when the
    credential cannot be checked."""
    if request.path.startswith(consolesession.CONSOLE_PREFIX):
        request[CONSOLE_SESSION] = None
        if request.app[STORE].configured:
            found = await consolesession.session_of(request)
            request[CONSOLE_SESSION] = found
            if found is not None:
                request[PRINCIPAL] = found.principal
        return
    token = bearer_token(request)
    app = request.app
    if token is None or not app[STORE].configured:
        return  # (``_identify_now`` answers these)
    authenticator = app[AUTHENTICATOR]
    try:
        if TICKET_HEADER in request.headers and _defers(request, app):
            request[DEFERRED] = await authenticator.verify_bearer(token, clock.now())
        else:
            request[PRINCIPAL] = await authenticator.authenticate_bearer(token, clock.now())
    except InvalidToken as exc:
        request[AUTHN_ERROR] = exc.code


def _defers(request: web.Request, app: web.Application) -> bool:
    """Whether the chain reads this request's session, with its ticket (see the module)."""
    store = app[STORE].store
    return (store is not None and getattr(store, "reads_round_trip", False)
            and getattr(request.match_info.handler, "protection", None) is not None
            and presented_ticket_id(request.headers) is not None)


async def confirm(request: web.Request, bearer: Bearer, now: float, *,
                  task_id: str | None = None, with_ticket: bool = True) -> RunRead | None:
    """The chain's AuthN for a request ``identify`` deferred: the session of ``bearer``, read
    with the presented ticket and task ``task_id`` in one statement (``with_ticket``; else
    alone), becomes ``request[PRINCIPAL]``. Returns that read (None without the ticket).
    Raises ``Unauthenticated`` (401) for a session that is not live, and ``StoreUnavailable``
    when it cannot be read, as ``identify`` would have answered."""
    del request[DEFERRED]  # checked once, whatever happens
    authenticator = request.app[AUTHENTICATOR]
    read = None
    try:
        found = UNREAD
        if with_ticket:
            ticket_id = presented_ticket_id(request.headers)
            assert ticket_id is not None  # deferred only then (``_defers``)
            store = request.app[STORE].require()
            read = await store.get_run_read(bearer.session_id, ticket_id, task_id)
            found = read.session
        principal: Principal = await authenticator.session_principal(
            bearer.subject, bearer.kind, bearer.session_id, stepped=bearer.stepped, now=now,
            found=found)
    except InvalidToken as exc:
        request[AUTHN_ERROR] = exc.code
        raise Unauthenticated(exc.code) from None
    except StoreUnavailable as exc:
        _unavailable(exc)
        raise
    request[PRINCIPAL] = principal
    return read


def _unavailable(exc: StoreUnavailable) -> None:
    # Every request of an outage fails this way: one line per interval, counted.
    log_repeated(log, logging.ERROR, ("store.unavailable", "session_check", str(exc)),
                 "session check failed: %s", exc,
                 fields={"event": "store.unavailable", "during": "session_check"})


async def step_up_console(request: web.Request, found: ConsoleSession,
                          otp: str) -> tuple[ConsoleSession, str]:
    """Step the request's console session up with a one-time code (the API's step-up: the code
    is used once, failures are throttled), and from now on identify the request as the stepped
    session: the console's inline step-up before a review. Returns the session and the value
    of its new cookie, which only then carries the step-up."""
    authenticator, now = request.app[AUTHENTICATOR], clock.now()
    await authenticator.step_up(found.principal, otp[:64], now, request.remote)
    p = found.principal
    principal = await authenticator.session_principal(p.subject_id, p.kind, p.session_id,
                                                      stepped=True, now=now)
    value, csrf = consolesession.issue(authenticator, principal, expires_at=found.expires_at,
                                       now=now, csrf=found.csrf, stepped=True)
    stepped = ConsoleSession(principal, csrf, True, found.expires_at)
    request[PRINCIPAL], request[CONSOLE_SESSION] = principal, stepped
    return stepped, value


def identify_now(request: web.Request) -> Awaitable[None] | None:
    """Attach who is calling (``PRINCIPAL``, ``ANONYMOUS`` without a credential) as far as
    that goes without waiting: None when done, else what is left to await (the request layers
    await it). Raises (now or when awaited) the 503 problem when the credential cannot be
    checked on a route that is not public.

    The authorized read on SQLite identifies its caller here without a coroutine: six fewer
    than an awaited check (each created, run and finished on every request without waiting)."""
    request[PRINCIPAL] = ANONYMOUS
    try:
        rest = _identify_now(request)
    except StoreUnavailable as exc:
        _refuse_unchecked(request, exc)
        return None
    return None if rest is None else _checked(request, rest)


async def _checked(request: web.Request, rest: Awaitable[None]) -> None:
    try:
        await rest
    except StoreUnavailable as exc:
        _refuse_unchecked(request, exc)


def _refuse_unchecked(request: web.Request, exc: StoreUnavailable) -> None:
    # Revocation cannot be checked: never answer as bad credentials (a 401 would make
    # clients drop a valid token). A public route (health, status, login) serves the
    # caller anonymously and says why; any other route is refused now, as an outage
    # (503 store_unavailable, Retry-After).
    _unavailable(exc)
    if not getattr(request.match_info.handler, "public", False):
        raise to_problem(exc) from None
    request[AUTHN_ERROR] = "store_unavailable"
