"""The execution chain every protected route runs: AuthN -> AuthZ -> Approval -> Execute -> Audit.

This module is the only place that order lives. A route declares what it protects with
``@protected(action, target=..., body=...)`` and its handler body becomes the Execute step; the
chain does the rest, one stage per package:

1. AuthN (``authn.require``): the principal the authn middleware attached; anonymous -> 401.
   Where the middleware deferred the session check (``middleware.authn.confirm``: a ticket is
   presented and reads are round trips), it is read here, after the body and target and before
   the decision, in one statement with the ticket and task; a 401 still comes before a 400.
2. AuthZ (``authz.decide``): the policy input document -> one decision; a production mutation of
   a ticketed action is never a plain ``allow`` (hard rule 1, re-asserted here). ``deny`` -> 403.
3. Approval (``approvals.redeem``): for ``require_approval``, a fresh step-up and a presented
   ticket that matches the request's bindings, checked before any transaction opens.
4. Execute: for mutations (and any run that redeems a ticket), ticket consumption (one
   conditional UPDATE), the execute step, its response and the audit record happen in ONE store
   transaction: all of them or none.
5. Audit (``audit.recording``): exactly one sealed record per run, allowed or not. A run whose
   record cannot be written answers 503; for a mutation that means it did not happen.
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from aiohttp import web

from . import clock, jsontext
from .appkeys import AUTHN_ERROR, CORRELATION_ID
from .approvals import redeem
from .audit.log import AUDIT
from .audit.recording import begin
from .authn.principal import PRINCIPAL
from .authn.require import require
from .authz import actions
from .authz.decide import decide_run
from .authz.engine import ENGINE
from .body import read_json
from .config import CONFIG
from .errors import PolicyDenied
from .middleware.authn import DEFERRED, confirm
from .middleware.metrics import METRICS
from .run import Outcome, Protection, Run, Target, TargetOf, Write
from .storelink import STORE

__all__ = ["Outcome", "Protection", "Run", "Target", "Write", "protected", "protected_as", "public"]

R = TypeVar("R", bound=Run)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def run(request: web.Request, spec: Protection, execute: Callable[[Any], Awaitable[Outcome]]
              ) -> web.StreamResponse:
    """Run the chain for one request. Every exit path writes exactly one audit record."""
    app = request.app  # a property that looks through the match info: read once
    config, engine, metrics = app[CONFIG], app[ENGINE], app[METRICS]
    store = app[STORE].require()  # no store, no audit: nothing protected runs (503)
    action, now, cid = spec.action, clock.now(), request[CORRELATION_ID]
    # Stage 5 spans the run: every exit path leaves one record (``audit.recording``): the
    # ``except`` below for a run that raised, ``close`` for one that returned. Not a context
    # manager: two coroutines fewer on every request.
    principal = request[PRINCIPAL]
    rec = begin(app[AUDIT], principal, action, correlation_id=cid,
                method=request.method, path=request.path, now=now)
    try:
        bearer, read = None, None
        if not principal.is_authenticated:                                          # 1 AuthN
            # Anonymous, or a session the chain reads (``confirm``). An identified request has
            # neither key: each ``request.get`` of a missing one raises and catches a KeyError.
            bearer = request.get(DEFERRED)
            if bearer is None:
                require(principal, request.get(AUTHN_ERROR))  # raises 401
        if bearer is None:
            body = await read_json(request, spec.body_schema) if spec.body_schema else None
            target = await spec.target(request, body)
        else:  # the session is read with the ticket and task the run reads (``confirm``)
            try:
                body = await read_json(request, spec.body_schema) if spec.body_schema else None
                target = await spec.target(request, body)
            except Exception:
                await confirm(request, bearer, now, with_ticket=False)  # a 401 comes first
                rec.principal(request[PRINCIPAL])
                raise
            read = await confirm(request, bearer, now, task_id=target.id)
            principal = request[PRINCIPAL]
            rec.principal(principal)
        rec.target(target, action)
        started = time.perf_counter()
        decision = decide_run(  # logged by its audit record only                 # 2 AuthZ
            engine, config.environments, principal, action, target,
            method=request.method, path=request.path,
            command_hash=redeem.command_hash(request.headers), now=now,
            step_up_window_s=config.authn.step_up_window_s, correlation_id=cid)
        metrics.decided(decision.decision, decision.cached,
                                     time.perf_counter() - started)
        rec.decided(decision)
        if decision.decision == "deny":
            raise PolicyDenied("the policy denies this action", reasons=list(decision.reasons))
        if target.authorized is not None:
            await target.authorized()
        redemption = None
        if decision.decision == "require_approval":                                 # 3 Approval
            rec.ticket(redeem.presented_ticket_id(request.headers))
            redemption = await redeem.check(config, store, principal, action, target, decision,
                                            request.headers, now, read)
        facts = Run(request=request, config=config, store=store, principal=principal, body=body,
                    target=target, decision=decision, correlation_id=cid, now=now,
                    ticket=redemption.ticket if redemption else None)
        if action.mutating or redemption is not None:                               # 4 Execute
            # Single use holds even when a policy asks a ticket for a read: it runs here too.
            async with (store.run_transaction(redemption.ticket, redemption.task)
                        if redemption is not None else store.run_transaction(None)) as tx:
                if redemption is not None:
                    await redeem.consume(tx, redemption, now, cid)
                    rec.consumed()
                outcome = await execute(Write.of(facts, tx))
                response = _response(outcome)  # built before commit: a committed run is answered
                await rec.executed(outcome, tx)                                     # 5 Audit
        else:
            outcome = await execute(facts)
            response = _response(outcome)
            await rec.executed(outcome, None)                                       # 5 Audit
    except Exception as exc:  # refused or failed: recorded so, answered as a problem
        raise await rec.refused(exc) from None
    after = rec.close()  # executed: its ticket events logged, its record mirrored
    if after is not None:
        await after
    metrics.ticket_events(rec.ticket_events)  # committed runs only
    return response if response is not None else await _stream(outcome)


# RFC 9110: a field name is a token; a field value has no control characters but HTAB.
_FIELD_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_FIELD_VALUE_BAD = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


def _response(outcome: Outcome) -> web.Response | None:
    """The JSON response of an outcome (None for a stream, which starts after commit).

    Everything that can make the answer unsendable fails here, inside the transaction: the
    body's JSON, and header names and values aiohttp would only refuse while writing them,
    after the commit (a consumed ticket with a dropped connection).
    """
    if outcome.stream is not None:
        return None
    for name, value in outcome.headers.items():
        if not _FIELD_NAME.fullmatch(name) or _FIELD_VALUE_BAD.search(value):
            raise ValueError(f"response header {name[:64]!r} cannot be sent")
    # What ``web.json_response`` makes of the text (its body is the text in UTF-8), without
    # the text in between.
    body = (jsontext.compact_bytes(outcome.body) if outcome.text is None
            else outcome.text.encode("utf-8"))
    response = web.Response(body=body, status=outcome.status, content_type="application/json",
                            charset="utf-8")
    response.headers.update(outcome.headers)
    return response


async def _stream(outcome: Outcome) -> web.StreamResponse:
    assert outcome.stream is not None
    return await outcome.stream()


def protected(
    action: str, *, target: TargetOf, body: str | None = None
) -> Callable[[Callable[[R], Awaitable[Outcome]]], Handler]:
    """Make ``execute`` the Execute step of a handler that runs the whole chain.

    The Execute step of a mutating action receives a ``Write`` (with its transaction); of a read,
    a ``Run`` (a ``Write`` when the run redeems a ticket).
    """
    return protected_as(Protection(actions.get(action), target, body))


def protected_as(spec: Protection) -> Callable[[Callable[[R], Awaitable[Outcome]]], Handler]:
    """``protected`` for a declaration made once where every entrance that runs it can import
    it (``approvals.review.TICKET_REVIEW``: the API route and the console's review form)."""

    def wrap(execute: Callable[[R], Awaitable[Outcome]]) -> Handler:
        # ``run`` itself is the handler (a partial, not a coroutine that awaits it: one frame
        # fewer on every request).
        handler = functools.partial(run, spec=spec, execute=execute)
        handler.__name__ = execute.__name__  # type: ignore[attr-defined]
        handler.__doc__ = execute.__doc__
        # For the tests that walk the route table; code that runs a declaration imports it.
        handler.protection = spec  # type: ignore[attr-defined]
        handler.execute = execute  # type: ignore[attr-defined]
        return handler

    return wrap


def public(handler: Callable[..., Any]) -> Callable[..., Any]:
    """Mark a route as deliberately outside the chain (status, health, login, JWKS, legacy)."""
    handler.public = True  # type: ignore[attr-defined]
    return handler
