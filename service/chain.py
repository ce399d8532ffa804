"""The execution chain every protected route runs: AuthN -> AuthZ -> Approval -> Execute -> Audit.

This module is the only place that order lives. A route declares what it protects with
``@protected(action, target=..., body=...)`` and its handler body becomes the Execute step; the
chain does the rest:

1. AuthN: the principal the authn middleware attached; anonymous -> 401.
2. AuthZ: the policy input document -> one decision. Whatever the policy says, a production
   mutation of a ticketed action is ``require_approval`` (hard rule 1, enforced here too, not
   only in the engine).
3. ``deny`` -> 403 with reason codes. ``require_approval`` -> the approval repository must exist
   (else 503, fail closed), step-up must be fresh (else 401 RFC 9470), a ticket must be presented
   (else 403 ``approval_required`` naming the bindings to request), and it must match the
   request's bindings (else 403 ``ticket_binding_mismatch``, nothing consumed).
4. Execute: for mutations, ticket consumption (one conditional UPDATE), the execute step and the
   audit record commit in ONE store transaction — all three happen or none does.
5. Audit: exactly one sealed record per run, allowed or not. A run whose record cannot be
   written answers 503; for a mutation that means it did not happen.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from . import clock
from .api.body import read_json
from .approvals.binding import HASH_PATTERN, nonce_matches, resource_hash
from .authn import stepup
from .authn.principal import Principal
from .authn.sessions import METHOD_ASSERTION
from .authz import actions
from .authz.decision import PRODUCTION_UPGRADE, Decision
from .authz.input import build_input
from .errors import (
    ApprovalRepositoryUnavailable,
    ApprovalRequired,
    BadRequest,
    Conflict,
    PolicyDenied,
    Problem,
    ServiceUnavailable,
    StepUpRequired,
    TicketBindingMismatch,
    Unauthorized,
    to_problem,
)
from .keys import AUTHN_ERROR, CORRELATION_ID, PRINCIPAL, SERVICES
from .store.base import StoreError, TicketRecord, Tx

__all__ = ["Outcome", "Protection", "Run", "Target", "protected", "public"]

log = logging.getLogger("controlplane.chain")

TICKET_HEADER = "Approval-Ticket"
NONCE_HEADER = "Approval-Nonce"
COMMAND_HASH_HEADER = "Command-Hash"
_TICKET_ID = re.compile(r"tkt_[0-9a-f]{32}")
_NONCE = re.compile(r"[A-Za-z0-9_-]{16,128}")


@dataclass(frozen=True)
class Target:
    """What a request acts on: the resource value (hashed for bindings) and the environment."""

    resource: Any
    env: str
    id: str | None = None
    owner: str | None = None  # the subject a resource belongs to (a ticket's subject)
    attributes: dict[str, Any] | None = None
    #: The stored record the target was read from (a ticket, a task), for handlers that only
    #: read it. Writers re-read inside their transaction.
    record: Any = field(default=None, compare=False, repr=False)

    @functools.cached_property
    def hash(self) -> str:
        """``sha256:`` of the RFC 8785 canonical JSON of the resource (computed once)."""
        return resource_hash(self.resource)

    def policy_resource(self, action: actions.Action) -> dict[str, Any]:
        """The ``resource`` member of the policy input (its kind is the action's, from the
        catalogue)."""
        doc: dict[str, Any] = {"id": self.id, "kind": action.resource_kind, "hash": self.hash}
        if self.owner is not None:
            doc["owner"] = self.owner
        if self.attributes:
            doc["attributes"] = self.attributes
        return doc


@dataclass
class Run:
    """Everything the Execute step may use. ``tx`` is set for mutations: write through it."""

    request: web.Request
    principal: Principal
    body: Any
    target: Target
    decision: Decision
    correlation_id: str
    now: float
    ticket: TicketRecord | None = None
    tx: Tx | None = None


@dataclass
class Outcome:
    """The Execute step's result: the response, and what the audit record should add."""

    status: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)
    audit: dict[str, Any] = field(default_factory=dict)
    #: For streamed responses (server-sent events): produces the response after audit commits.
    stream: Callable[[], Awaitable[web.StreamResponse]] | None = None


Execute = Callable[[Run], Awaitable[Outcome]]
#: Reads a request's target; may await the store (e.g. the ticket a review is about).
TargetOf = Callable[[web.Request, Any], Awaitable[Target]]


@dataclass(frozen=True)
class Protection:
    """A route's declaration: its catalogue action, body schema and how to read its target."""

    action: actions.Action
    target: TargetOf
    body_schema: str | None


def protected(
    action: str, *, target: TargetOf, body: str | None = None
) -> Callable[[Execute], Callable[[web.Request], Awaitable[web.StreamResponse]]]:
    """Make ``execute`` the Execute step of a handler that runs the whole chain."""
    spec = Protection(actions.get(action), target, body)

    def wrap(execute: Execute) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def handler(request: web.Request) -> web.StreamResponse:
            return await run(request, spec, execute)

        handler.__name__ = execute.__name__
        handler.__doc__ = execute.__doc__
        handler.protection = spec  # type: ignore[attr-defined]
        return handler

    return wrap


def public(handler: Callable[..., Any]) -> Callable[..., Any]:
    """Mark a route as deliberately outside the chain (status, health, login, JWKS, legacy)."""
    handler.public = True  # type: ignore[attr-defined]
    return handler


async def run(request: web.Request, spec: Protection, execute: Execute) -> web.StreamResponse:
    """Run the chain for one request. Every exit path writes exactly one audit record."""
    services = request.app[SERVICES]
    if services.audit is None:
        # No store, no audit: a protected action could not be recorded, so none runs.
        raise ServiceUnavailable("protected actions need a store (store.backend is none)",
                                 code="store_unavailable")
    now = clock.now()
    cid = request[CORRELATION_ID]
    principal: Principal = request[PRINCIPAL]
    entry: dict[str, Any] = {
        "at": clock.iso(now),
        "correlation_id": cid,
        "principal": _principal_entry(principal),
        "action": spec.action.name,
        "method": request.method,
        "path": request.path,
    }
    try:
        # 1 AuthN
        if not principal.is_authenticated:
            raise Unauthorized(code=request.get(AUTHN_ERROR) or "unauthenticated")
        body = await read_json(request, spec.body_schema) if spec.body_schema else None
        target = await spec.target(request, body)
        entry.update(env=target.env, resource_hash=target.hash,
                     resource_kind=spec.action.resource_kind)
        command_hash = _command_hash(request)
        # 2 AuthZ
        decision = services.decide(
            build_input(
                principal.to_input(now, services.config.authn.step_up_window_s),
                spec.action.name,
                target.policy_resource(spec.action),
                target.env,
                {"correlation_id": cid, "method": request.method, "path": request.path,
                 "command_hash": command_hash, "time": clock.iso(now)},
            )
        )
        decision = _enforce_production_rule(services, spec.action, target.env, decision)
        entry["decision"] = {
            "result": decision.decision,
            "reasons": list(decision.reasons),
            "decision_id": decision.decision_id,
        }
        entry["policy_revision"] = decision.revision
        if decision.decision == "deny":
            raise PolicyDenied("the policy denies this action", reasons=list(decision.reasons))
        # 3 Approval
        ticket = None
        if decision.decision == "require_approval":
            ticket = await _redeemable_ticket(request, services, principal, spec, target,
                                              decision, command_hash, now)
            entry["ticket_id"] = ticket.id
        run_ = Run(request, principal, body, target, decision, cid, now, ticket)
        # 4 Execute (+ consume + audit in one transaction for mutations, and for any run that
        # redeems a ticket: single use holds even when a policy asks a ticket for a read)
        if spec.action.mutating or ticket is not None:
            async with services.store.transaction() as tx:
                run_.tx = tx
                if ticket is not None:
                    await tx.consume_ticket(
                        ticket.id, nonce_hash=ticket.nonce_hash, subject_id=principal.subject_id,
                        env=target.env, action=spec.action.name, resource_hash=target.hash,
                        command_hash=ticket.command_hash, now=now, correlation_id=cid,
                    )
                    entry["ticket_consumed"] = True
                outcome = await execute(run_)
                entry.update(outcome.audit, outcome="executed", status=outcome.status)
                record = await _append_audit(services, entry, tx)
        else:
            outcome = await execute(run_)
            entry.update(outcome.audit, outcome="executed", status=outcome.status)
            record = await _append_audit(services, entry, None)
    except Exception as exc:
        problem = to_problem(exc)
        if problem.status >= 500 and not isinstance(exc, Problem):
            # The cause stays in our log under the correlation id; the client sees only the id.
            log.error("chain run failed", exc_info=exc)
        entry.update(outcome=_outcome_name(problem), status=problem.status, error=problem.instance_code)
        entry.pop("ticket_consumed", None)  # rolled back with the transaction
        await _record_failure(services, entry, problem)
        raise problem from None
    # 5 Audit (committed above); the JSON-lines mirror is a copy, written after commit.
    await services.audit.mirror(record)
    if outcome.stream is not None:
        return await outcome.stream()
    response = web.json_response(outcome.body, status=outcome.status)
    response.headers.update(outcome.headers)
    return response


def _principal_entry(principal: Principal) -> dict[str, Any]:
    if not principal.is_authenticated:
        return {"subject_id": None, "kind": "anonymous", "session_id": None}
    return {"subject_id": principal.subject_id, "kind": principal.kind,
            "session_id": principal.session_id}


def _enforce_production_rule(services: Any, action: actions.Action, env: str, decision: Decision) -> Decision:
    """Hard rule 1: a production mutation is never a plain ``allow``, whatever the policy says."""
    if (
        decision.decision == "allow"
        and action.needs_ticket_in_production
        and services.config.is_production(env)
    ):
        return Decision(
            "require_approval",
            (*decision.reasons, PRODUCTION_UPGRADE),
            decision.approval,
            decision.revision,
            decision.decision_id,
            decision.cached,
        )
    return decision


def _command_hash(request: web.Request) -> str | None:
    value = request.headers.get(COMMAND_HASH_HEADER)
    if value is None:
        return None
    if not HASH_PATTERN.fullmatch(value):
        raise BadRequest("Command-Hash must be sha256:<64 lowercase hex>", code="invalid_command_hash")
    return value


async def _redeemable_ticket(
    request: web.Request,
    services: Any,
    principal: Principal,
    spec: Protection,
    target: Target,
    decision: Decision,
    command_hash: str | None,
    now: float,
) -> TicketRecord:
    """Stage 3 up to consumption: repository, step-up, a presented ticket that matches."""
    if not services.approvals_enabled:
        raise ApprovalRepositoryUnavailable(
            "this action needs an approval ticket and no approval repository is configured"
        )
    production = services.config.is_production(target.env)
    window = services.config.authn.step_up_window_s
    if (production or decision.approval.get("step_up") is True) and not fresh_strong_auth(
        principal, now, window
    ):
        raise StepUpRequired(
            "this action needs a recent step-up authentication",
            headers={"WWW-Authenticate": stepup.challenge(
                "this action needs a recent step-up authentication", max_age=window)},
        )
    ticket_id = request.headers.get(TICKET_HEADER)
    nonce = request.headers.get(NONCE_HEADER)
    if ticket_id is None and nonce is None:
        raise ApprovalRequired(
            "this action needs an approved ticket; request one with POST /api/v1/approvals",
            reasons=list(decision.reasons),
            bindings={
                "subject_id": principal.subject_id,
                "env": target.env,
                "action": spec.action.name,
                "resource": target.resource,
                "resource_hash": target.hash,
                "command_hash_required": principal.kind != "human" or command_hash is not None,
                "command_hash": command_hash,
            },
            approval=dict(decision.approval),
            request_with="POST /api/v1/approvals",
            present_with=[TICKET_HEADER, NONCE_HEADER, COMMAND_HASH_HEADER],
        )
    if not ticket_id or not nonce or not _TICKET_ID.fullmatch(ticket_id) or not _NONCE.fullmatch(nonce):
        raise BadRequest(
            "Approval-Ticket and Approval-Nonce must both be present and well-formed",
            code="invalid_ticket_headers",
        )
    ticket = await services.store.get_ticket(ticket_id)
    if ticket is None or not nonce_matches(nonce, ticket.nonce_hash):
        # An unknown id and a wrong nonce look the same: ticket ids are not an oracle.
        raise TicketBindingMismatch("the ticket does not exist or the nonce does not match",
                                    fields=["nonce"])
    mismatched = [
        name
        for name, want, got in (
            ("subject_id", ticket.subject_id, principal.subject_id),
            ("env", ticket.env, target.env),
            ("action", ticket.action, spec.action.name),
            ("resource_hash", ticket.resource_hash, target.hash),
        )
        if want != got
    ]
    if ticket.command_hash is not None and ticket.command_hash != command_hash:
        mismatched.append("command_hash")
    if mismatched:
        raise TicketBindingMismatch(
            "the ticket is bound to another " + ", ".join(mismatched), fields=mismatched
        )
    if ticket.state != "approved":
        code = {"consumed": "ticket_consumed", "pending": "ticket_not_approved"}.get(
            ticket.state, f"ticket_{ticket.state}"
        )
        raise Conflict(f"the ticket is {ticket.state}", code=code, state=ticket.state)
    if ticket.expires_at is not None and ticket.expires_at <= now:
        raise Conflict("the ticket's approval has expired", code="ticket_expired", state="approved")
    return ticket


def fresh_strong_auth(principal: Principal, now: float, window_s: float) -> bool:
    """A fresh step-up for people; for services and agents (which cannot step up), a fresh
    key-based authentication: their signed assertion is a proof of possession, so they log in
    again with a new one instead."""
    if principal.kind == "human":
        return principal.step_up_verified(now, window_s)
    return principal.authn_method == METHOD_ASSERTION and now - principal.auth_time <= window_s


def _outcome_name(problem: Problem) -> str:
    if problem.status == 401:
        return "unauthenticated" if problem.instance_code != "step_up_required" else "step_up_required"
    if problem.instance_code == "approval_required":
        return "approval_required"
    if problem.instance_code == "denied":
        return "denied"
    if problem.status in (403, 409):
        return "rejected"
    if problem.status >= 500:
        return "failed"
    return "invalid"


async def _append_audit(services: Any, entry: dict[str, Any], tx: Tx | None) -> Any:
    """Append the run's record; if it cannot be written, the run fails (and a mutation rolls back)."""
    try:
        return await services.audit.append(entry, tx)
    except StoreError as exc:
        log.error("audit record could not be written", extra={"fields": {"error": type(exc).__name__}})
        raise ServiceUnavailable("the audit log is unavailable; nothing was executed",
                                 code="audit_unavailable") from None


async def _record_failure(services: Any, entry: dict[str, Any], problem: Problem) -> None:
    """The one audit record of a run that did not execute; 503 if even that cannot be written."""
    record = await _append_audit(services, entry, None)
    await services.audit.mirror(record)
