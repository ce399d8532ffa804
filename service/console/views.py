"""The console's routes: sign-in, inbox (live), ticket detail, review, my requests, audit view.

Handlers stay thin. Who is calling comes from the console's own cookie, never from a bearer
token (the authn middleware reads it: ``consolesession``); every ticket read and every review
runs the one chain (``chain.run``) with the declarations and the Execute step the API route runs
(``approvals.review``), so the policy, the review rules (no self-review, people only, group
quorum), step-up and audit apply exactly as they do there. Each chain run's JSON answer is
replaced by a page (``Outcome.stream`` renders it after the audit record committed).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import json
import logging
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode

from aiohttp import web

from .. import chain, clock, consolesession, signin
from ..appkeys import CORRELATION_ID
from ..approvals.policy import reviewer_candidates, suggested_reviewers
from ..approvals.review import REVIEW_SCHEMA, TICKET_READ, TICKET_REVIEW, review_ticket
from ..approvals.tickets import ticket_view
from ..authn.errors import AuthnError
from ..authn.federation import FEDERATION
from ..authn.principal import Principal
from ..authn.sessions import AUTHENTICATOR
from ..authn.stepup import METHOD_OIDC
from ..authz import actions
from ..authz.engine import ENGINE
from ..authz.revisions import POLICY_KEYS, TrustedKeys
from ..config import CONFIG
from ..consolesession import CONSOLE_SESSION, ConsoleSession
from ..errors import Forbidden, Problem, Unauthorized, to_problem
from ..middleware.authn import step_up_console
from ..policytools import change
from ..run import Outcome, Protection, Run, Target, Write
from ..schemas import ValidationFailed, validate
from ..signin import CONSOLE_LANDING
from ..store.base import TicketRecord
from ..storelink import STORE
from ..streams import STREAMS, StreamWrite, pump
from . import federated, pages, queries
from .html import Markup
from .pages import CSP

__all__ = ["CSP", "routes", "setup_console"]

routes = web.RouteTableDef()
log = logging.getLogger("controlplane.console")

STATIC = Path(__file__).resolve().parent / "static"
_STATIC_TYPES = {"console.css": "text/css", "console.js": "text/javascript",
                 "favicon.svg": "image/svg+xml"}
LOGIN_CSRF_COOKIE = "cp_console_login"
#: A form body is a few fields; anything bigger is not one of ours.
MAX_FORM_BYTES = 16 * 1024
MAX_PASSWORD_CHARS = 1024
#: How often the inbox stream re-reads the store (it works across workers and replicas).
INBOX_POLL_S = 1.0
INBOX_MAX_S = 900.0
#: A ticket's states after which nothing about it changes any more.
FINAL_STATES = frozenset({"consumed", "rejected", "expired", "revoked"})

# The ticket read and review the API declares too (``approvals.review``); the review's body
# comes from the form, validated here against the same schema.
_REVIEW = dataclasses.replace(TICKET_REVIEW, body_schema=None)


async def _inbox_target(request: web.Request, body: Any) -> Target:
    # The inbox spans every environment: authorized as the strictest (as the API list is).
    return Target(resource={"collection": "approvals"},
                  env=request.app[CONFIG].environments.strictest())


_LIST = Protection(actions.get("approvals.list"), _inbox_target, None)


def console(*action_names: str) -> Callable[[Any], Any]:
    """Mark a console route and name the catalogue actions it runs through the chain (none for
    sign-in and static files). A test walks the route table with these marks."""
    for name in action_names:
        actions.get(name)

    def mark(handler: Any) -> Any:
        handler.console_actions = action_names
        return handler

    return mark


# -- responses ----------------------------------------------------------------------------------


_secure = pages.secure


def page(markup: Markup, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    response = web.Response(text=markup, status=status, content_type="text/html",
                            charset="utf-8", headers=headers)
    _secure(response)
    return response


def redirect(location: str) -> web.Response:
    response = web.Response(status=303, headers={"Location": location})
    _secure(response)
    return response


def _to_login(request: web.Request) -> web.Response:
    target = request.path_qs if request.method == "GET" else "/console/"
    return redirect("/console/login?" + urlencode({"next": target}))


_safe_next = consolesession.safe_next


# -- session and forms --------------------------------------------------------------------------


def _session(request: web.Request) -> ConsoleSession | None:
    """The request's console session, as the authn middleware found it (its principal is the
    request's: what the chain's AuthN stage reads)."""
    return request.get(CONSOLE_SESSION)


def _same_origin(request: web.Request) -> bool:
    """A browser's ``Origin`` (sent on every POST) must be this site: the host it asked for,
    over HTTP or (through a TLS-terminating proxy too) HTTPS. Absent counts as same: browsers
    send it on every form post, and other clients cannot be made to post by a foreign page."""
    origin = request.headers.get("Origin")
    if origin is None:
        return True
    scheme, sep, host = origin.partition("://")
    return bool(sep) and scheme in ("http", "https") and host == request.host


async def _form(request: web.Request) -> dict[str, str]:
    if request.content_type != "application/x-www-form-urlencoded":
        raise Forbidden("console forms are posted as application/x-www-form-urlencoded",
                        code="form_refused")
    if request.content_length is not None and request.content_length > MAX_FORM_BYTES:
        raise Forbidden("the form is too large", code="form_refused")
    raw = await request.read()  # bounded by the app's client_max_size (413 beyond it)
    if len(raw) > MAX_FORM_BYTES:
        raise Forbidden("the form is too large", code="form_refused")
    try:
        pairs = parse_qsl(raw.decode("utf-8"), keep_blank_values=True, strict_parsing=False,
                          max_num_fields=20)
    except (UnicodeDecodeError, ValueError):
        raise Forbidden("the form could not be read", code="form_refused") from None
    form: dict[str, str] = {}
    for key, value in pairs:
        if key in form or "\x00" in value:
            raise Forbidden("the form could not be read", code="form_refused")
        form[key] = value
    return form


def _check_csrf(request: web.Request, expected: str | None, form: dict[str, str]) -> None:
    """Every state-changing form: same origin, and the synchronizer token (constant time)."""
    presented = form.get("csrf", "")
    if (not _same_origin(request) or not expected or not presented
            or not hmac.compare_digest(presented.encode("utf-8", "replace"), expected.encode())):
        raise Forbidden("the form's CSRF token is missing or does not match this session",
                        code="csrf_failed")


# -- sign-in ------------------------------------------------------------------------------------


@routes.get("/")
@console()
async def root(request: web.Request) -> web.StreamResponse:
    """The site's root is the console."""
    return redirect("/console/")


@routes.get("/console/login")
@console()
async def login_form(request: web.Request) -> web.StreamResponse:
    """The sign-in form, with a pre-session CSRF token (double-submitted as a cookie)."""
    if _session(request) is not None:
        return redirect(_safe_next(request.query.get("next")))
    token = consolesession.presented(request, LOGIN_CSRF_COOKIE) or secrets.token_urlsafe(32)
    next_path = _safe_next(request.query.get("next"))
    # A refused single sign-on comes back here naming why (only codes the page explains).
    sso_error = request.query.get("sso_error")
    error = sso_error if sso_error in federated.SHOWN_ERRORS | {"sso_failed"} else None
    response = page(pages.login_page(csrf=token, next_path=next_path, error=error,
                                     providers=_providers(request, next_path)))
    consolesession.set_cookie(request, response, token, name=LOGIN_CSRF_COOKIE)
    return response


def _providers(request: web.Request, next_path: str) -> list[tuple[str, str]]:
    """The configured OpenID providers as "Sign in with <provider>" links back to ``next_path``."""
    federation = request.app.get(FEDERATION)
    if federation is None or not federation.oidc.enabled:
        return []
    return federated.provider_buttons(federation.oidc.listing(), next_path)


@routes.post("/console/login")
@console()
async def login(request: web.Request) -> web.StreamResponse:
    """Password sign-in: opens a store session (as ``POST /api/v1/authn/sessions`` does) and
    sets the console cookie for it; the access token never leaves the server."""
    form = await _form(request)
    _check_csrf(request, consolesession.presented(request, LOGIN_CSRF_COOKIE), form)
    subject, password = form.get("subject_id", "")[:200], form.get("password", "")
    next_path = _safe_next(form.get("next"))
    authenticator, now = request.app[AUTHENTICATOR], clock.now()
    try:
        if not subject or not password or len(password) > MAX_PASSWORD_CHARS:
            raise Unauthorized("sign-in refused", code="invalid_credentials")
        issued = await authenticator.login_password(subject, password, request.remote, now)
        principal = await authenticator.authenticate_bearer(issued.access_token, now)
    except (AuthnError, Problem) as exc:
        problem = to_problem(exc)
        return page(pages.login_page(csrf=form.get("csrf", ""), next_path=next_path,
                                     error=problem.instance_code, subject=subject,
                                     providers=_providers(request, next_path)),
                    status=problem.status, headers=problem.headers)
    stored = await request.app[STORE].require().get_session(principal.session_id)
    expires = stored.expires_at if stored is not None else now + authenticator.settings.token_ttl_s
    value, _ = consolesession.issue(authenticator, principal, expires_at=expires, now=now)
    response = redirect(next_path)
    consolesession.set_cookie(request, response, value)
    consolesession.clear_cookie(request, response, name=LOGIN_CSRF_COOKIE)
    log.info("console sign-in", extra={"fields": {"event": "console.signed_in",
                                                   "subject": principal.subject_id}})
    return response


@routes.post("/console/logout")
@console()
async def logout(request: web.Request) -> web.StreamResponse:
    """End the store session (every token and cookie of it, everywhere) and clear the cookie."""
    found = _session(request)
    response = redirect("/console/login")
    if found is None:
        consolesession.clear_cookie(request, response)
        return response
    form = await _form(request)
    _check_csrf(request, found.csrf, form)
    await request.app[AUTHENTICATOR].revoke(found.principal, clock.now())
    consolesession.clear_cookie(request, response)
    return response


# -- pages --------------------------------------------------------------------------------------


async def _run_page(request: web.Request, spec: Protection,
                    build: Callable[[Run], Awaitable[tuple[Markup, dict[str, Any]]]]
                    ) -> web.StreamResponse:
    """Run the chain for a console read; its Execute step builds the page."""
    async def execute(run: Run) -> Outcome:
        markup, audit = await build(run)
        return Outcome(200, None, audit=audit, stream=_ready(page(markup)))

    return await chain.run(request, spec, execute)


def _ready(response: web.StreamResponse) -> Callable[[], Awaitable[web.StreamResponse]]:
    async def produce() -> web.StreamResponse:
        return response

    return produce


def _code(problem: Problem) -> str:
    """The code a page shows: a policy denial's first reason the console can explain (e.g.
    ``self_review``), else the problem's own code."""
    if problem.instance_code == "denied":
        reasons = problem.extensions.get("reasons")
        for reason in reasons if isinstance(reasons, list) else []:
            if reason in pages.MESSAGES:
                return str(reason)
    return problem.instance_code


def _problem_page(request: web.Request, problem: Problem,
                  found: ConsoleSession | None) -> web.Response:
    who = found.principal.subject_id if found else None
    return page(pages.error_page(problem.status, _code(problem), who=who,
                                 csrf=found.csrf if found else None),
                status=problem.status, headers=problem.headers)


@routes.get("/console/")
@console("approvals.list")
async def inbox_page(request: web.Request) -> web.StreamResponse:
    """Tickets this person may review, pending first and oldest first; live by SSE."""
    found = _session(request)
    if found is None:
        return _to_login(request)

    async def build(run: Run) -> tuple[Markup, dict[str, Any]]:
        items = await _inbox_markup(run.store, request, run.principal)
        return pages.inbox_page(items, who=run.principal.subject_id, csrf=found.csrf), {}

    try:
        return await _run_page(request, _LIST, build)
    except Problem as problem:
        return _problem_page(request, problem, found)


async def _inbox_markup(store: Any, request: web.Request, principal: Principal) -> Markup:
    box = await queries.inbox(store, request.app[ENGINE], principal, clock.now())
    return pages.inbox_items([_view(t) for t in box.pending], [_view(t) for t in box.recent])


def _view(ticket: TicketRecord) -> dict[str, Any]:
    """The API's ticket view (``command`` included once tickets carry it)."""
    view = ticket_view(ticket)
    view.setdefault("command", getattr(ticket, "command", None))
    return view


@routes.get("/console/inbox/events")
@console("approvals.list")
async def inbox_events(request: web.Request) -> web.StreamResponse:
    """Server-sent events: ``event: inbox`` with the rendered list whenever it changes (the
    store is polled, so a change made through any worker or replica shows)."""
    found = _session(request)
    if found is None:
        return _secure(web.Response(status=401, text="sign in first", content_type="text/plain"))

    async def execute(run: Run) -> Outcome:
        request.app[STREAMS].acquire(run.principal.subject_id)
        return Outcome(200, None, audit={"stream": True},
                       stream=lambda: _inbox_stream(request, run.store, found))

    try:
        return await chain.run(request, _LIST, execute)
    except Problem as problem:
        response = web.Response(status=problem.status, text=problem.instance_code,
                                content_type="text/plain", headers=problem.headers)
        return _secure(response)


async def _inbox_stream(request: web.Request, store: Any, found: ConsoleSession
                        ) -> web.StreamResponse:
    async def state() -> tuple[bytes | None, bool]:
        markup = await _inbox_markup(store, request, found.principal)
        data = json.dumps({"html": markup}, separators=(",", ":"))
        return f"event: inbox\ndata: {data}\n\n".encode(), False

    return await _poll_stream(request, state, "console inbox stream")


async def _poll_stream(request: web.Request,
                       state: Callable[[], Awaitable[tuple[bytes | None, bool]]],
                       name: str) -> web.StreamResponse:
    """An SSE response (``streams.pump``) that re-reads the store every ``INBOX_POLL_S`` and
    sends ``state()``'s event when it differs from the last one sent; ends after a final state
    (``event: end``), a console session that ended, ``INBOX_MAX_S``, a store outage or shutdown
    (an ``EventSource`` then reconnects by itself)."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "X-Accel-Buffering": "no",
                                           "X-Correlation-ID": request[CORRELATION_ID]})
    _secure(response)
    sent: bytes | None = None

    async def poll(write: StreamWrite) -> bytes | None:
        nonlocal sent
        event, final = await state()
        if event is not None and event != sent:
            sent = event
            await write(event)
        return b'{"reason":"final"}' if final else None

    async def alive() -> bool:  # the store session, read again
        return await consolesession.session_of(request) is not None

    return await pump(request, response, poll, label=name, poll_s=INBOX_POLL_S,
                      max_s=INBOX_MAX_S, alive=alive)


@routes.get("/console/tickets/{id}")
@console("approvals.read")
async def ticket_page(request: web.Request) -> web.StreamResponse:
    """Everything about one ticket, its reviews and timeline, and the review form."""
    found = _session(request)
    if found is None:
        return _to_login(request)
    try:
        return await _run_page(request, TICKET_READ, _ticket_builder(request, found, None, ""))
    except Problem as problem:
        return _problem_page(request, problem, found)


def _ticket_builder(request: web.Request, found: ConsoleSession, error: str | None,
                    reason: str) -> Callable[[Run], Awaitable[tuple[Markup, dict[str, Any]]]]:
    async def build(run: Run) -> tuple[Markup, dict[str, Any]]:
        ticket: TicketRecord = run.target.record
        markup = await _ticket_markup(request, run.store, ticket, found, run.principal, error,
                                      reason)
        return markup, {"ticket_id": ticket.id}

    return build


async def _ticket_markup(request: web.Request, store: Any, ticket: TicketRecord,
                         found: ConsoleSession, principal: Principal, error: str | None,
                         reason: str) -> Markup:
    now, config, engine = clock.now(), request.app[CONFIG], request.app[ENGINE]
    records, _ = await queries.ticket_records(store, ticket)
    sso = principal.authn_method == METHOD_OIDC
    # The review endpoint's own decision (``check_review``), dry-run for an approval: a refusal
    # names the role or group that is missing; one that only an approval meets (a group still
    # missing) leaves the person free to reject.
    refusal = queries.review_refusal(engine, principal, ticket, now, "approve")
    may_reject = refusal is not None and queries.review_refusal(engine, principal, ticket,
                                                                now) is None
    if refusal is None or may_reject:
        needs = config.is_production(ticket.env) and not principal.step_up_verified(
            now, config.authn.step_up_window_s)
        form = pages.review_form(ticket.id, csrf=found.csrf, needs_step_up=needs or
                                 error in ("step_up_required", "otp_invalid"), reason=reason,
                                 sso=sso)
        if refusal is not None:
            form = Markup(pages.cannot_review(refusal.code, refusal.detail) + form)
    elif refusal.code == "state_conflict":
        form = Markup("")
    else:
        form = pages.cannot_review(refusal.code, refusal.detail)
    suggested = suggested_reviewers(
        engine, config, await reviewer_candidates(store, request.app[AUTHENTICATOR].identities),
        ticket, now) if ticket.state == "pending" else None
    return pages.ticket_page(_view(ticket), timeline=queries.timeline(records),
                             policy_reasons=queries.policy_reasons(records), review_form=form,
                             who=principal.subject_id, csrf=found.csrf,
                             error="step_up_required_sso" if sso and error == "step_up_required"
                             else error, reviewers=suggested,
                             change=await _policy_change(request, store, ticket))


async def _policy_change(request: web.Request, store: Any,
                         ticket: TicketRecord) -> dict[str, Any] | None:
    """The change a policy ticket asks to approve (as GET /api/v1/approvals/{id}/change)."""
    if ticket.action not in change.ACTIONS:
        return None
    config = request.app[CONFIG]
    keys: TrustedKeys = request.app[POLICY_KEYS]
    return await change.report(store, keys, ticket.action, ticket.resource,
                               config.policies.dir, config.environments,
                               config.decision_log.path)


@routes.get("/console/tickets/{id}/events")
@console("approvals.read")
async def ticket_events(request: web.Request) -> web.StreamResponse:
    """Server-sent events: ``event: ticket`` with its state and review count, first at once and
    then on every change, until it reaches a final state (the page reloads itself on a change)."""
    found = _session(request)
    if found is None:
        return _secure(web.Response(status=401, text="sign in first", content_type="text/plain"))

    async def execute(run: Run) -> Outcome:
        request.app[STREAMS].acquire(run.principal.subject_id)
        ticket: TicketRecord = run.target.record
        return Outcome(200, None, audit={"ticket_id": ticket.id, "stream": True},
                       stream=lambda: _ticket_stream(request, run.store, ticket.id))

    try:
        return await chain.run(request, TICKET_READ, execute)
    except Problem as problem:
        return _secure(web.Response(status=problem.status, text=problem.instance_code,
                                    content_type="text/plain", headers=problem.headers))


async def _ticket_stream(request: web.Request, store: Any, ticket_id: str) -> web.StreamResponse:
    async def state() -> tuple[bytes | None, bool]:
        ticket = await store.get_ticket(ticket_id)
        if ticket is None:
            return None, True
        data = json.dumps({"state": ticket.state, "reviews": len(ticket.reviews)},
                          separators=(",", ":"))
        return f"event: ticket\ndata: {data}\n\n".encode(), ticket.state in FINAL_STATES

    return await _poll_stream(request, state, "console ticket stream")


@routes.post("/console/tickets/{id}/review")
@console("approvals.review", "approvals.read")
async def review(request: web.Request) -> web.StreamResponse:
    """Approve or reject through the one review step (``review_ticket``); a one-time code in the form steps
    the session up first (the inline step-up prompt)."""
    found = _session(request)
    if found is None:
        return _to_login(request)
    form = await _form(request)
    _check_csrf(request, found.csrf, form)
    body: dict[str, Any] = {"decision": form.get("decision", "")}
    if form.get("reason"):
        body["reason"] = form["reason"]
    new_cookie: str | None = None
    try:
        try:
            validate(REVIEW_SCHEMA, body)
        except ValidationFailed as exc:
            raise to_problem(exc) from None
        if form.get("otp"):
            found, new_cookie = await step_up_console(request, found, form["otp"])

        async def execute(run: Write) -> Outcome:
            outcome = await review_ticket(run, body["decision"], body.get("reason"))
            return Outcome(outcome.status, outcome.body, audit=outcome.audit,
                           stream=_ready(redirect(f"/console/tickets/{run.target.id}")))

        response = await chain.run(request, _REVIEW, execute)
    except (Problem, AuthnError) as exc:
        problem = to_problem(exc)
        response = await _ticket_refused(request, found, problem, form.get("reason", ""))
    if new_cookie is not None:
        consolesession.set_cookie(request, response, new_cookie)
    return response


@routes.get("/console/tickets/{id}/step-up")
@console()
async def sso_step_up(request: web.Request) -> web.StreamResponse:
    """"Confirm at the sign-in provider": a person signed in through OpenID Connect steps up by
    signing in again at that provider (in this browser), then lands on the ticket again with
    the console session stepped up (``federated.py``). Nothing is reviewed here.

    A link, not a form: the console's CSP (``form-action 'self'``) rightly stops a form post
    from being redirected to another site. A page elsewhere cannot start it for someone either:
    the console cookie (``SameSite=Strict``) does not come with a navigation from another site,
    and without a console session this only leads to the sign-in page."""
    found = _session(request)
    if found is None:
        return _to_login(request)
    try:
        back = consolesession.safe_next(f"/console/tickets/{request.match_info['id']}")
        facts = None
        if found.principal.authn_method == METHOD_OIDC:
            facts = await request.app[STORE].require().get_federated_session(
                found.principal.session_id)
        if facts is None or back == "/console/":
            raise Forbidden("this session does not step up at a sign-in provider",
                            code="step_up_not_available")
        response = await signin.start(request, facts.provider, "step_up",
                                      found.principal.session_id, back)
    except Problem as problem:
        return _problem_page(request, problem, found)
    return _secure(response)


async def _ticket_refused(request: web.Request, found: ConsoleSession, problem: Problem,
                          reason: str) -> web.StreamResponse:
    """The ticket page again, saying why (by stable code), the reason kept in the form."""
    code = _code(problem)
    if code in ("ticket_not_found", "csrf_failed", "store_unavailable"):
        return _problem_page(request, problem, found)
    try:
        response = await _run_page(request, TICKET_READ,
                                   _ticket_builder(request, found, code, reason))
    except Problem as again:
        return _problem_page(request, again, found)
    response.set_status(problem.status)
    response.headers.update({k: v for k, v in problem.headers.items() if k != "WWW-Authenticate"})
    return response


@routes.get("/console/tickets/{id}/audit")
@console("approvals.read")
async def audit_page(request: web.Request) -> web.StreamResponse:
    """Every audit record that names the ticket, read-only."""
    found = _session(request)
    if found is None:
        return _to_login(request)

    async def build(run: Run) -> tuple[Markup, dict[str, Any]]:
        ticket: TicketRecord = run.target.record
        records, truncated = await queries.ticket_records(run.store, ticket)
        return pages.audit_page(ticket.id, records, truncated=truncated,
                                who=run.principal.subject_id, csrf=found.csrf), {
            "ticket_id": ticket.id}

    try:
        return await _run_page(request, TICKET_READ, build)
    except Problem as problem:
        return _problem_page(request, problem, found)


@routes.get("/console/requests")
@console("approvals.list")
async def requests_page(request: web.Request) -> web.StreamResponse:
    """The tickets for this person, with their state."""
    found = _session(request)
    if found is None:
        return _to_login(request)

    async def build(run: Run) -> tuple[Markup, dict[str, Any]]:
        tickets = await queries.my_requests(run.store, run.principal)
        return pages.requests_page([_view(t) for t in tickets], who=run.principal.subject_id,
                                   csrf=found.csrf), {}

    try:
        return await _run_page(request, _LIST, build)
    except Problem as problem:
        return _problem_page(request, problem, found)


@routes.get("/console/static/{name}")
@console()
async def static(request: web.Request) -> web.StreamResponse:
    """The console's one stylesheet and one script (no CDN, no build step)."""
    name = request.match_info["name"]
    content_type = _STATIC_TYPES.get(name)
    if content_type is None:
        return _secure(web.Response(status=404, text="not found", content_type="text/plain"))
    data = await asyncio.to_thread((STATIC / name).read_bytes)
    response = web.Response(body=data, content_type=content_type, charset="utf-8")
    response.headers["Cache-Control"] = "public, max-age=3600"
    return _secure(response)


def setup_console(app: web.Application) -> None:
    """Add the console's routes (and ``GET /``, which redirects to it), and land the sign-ins
    at a provider the console starts (the API's callback hands them to ``federated``)."""
    app.router.add_routes(routes)
    app[CONSOLE_LANDING] = federated
