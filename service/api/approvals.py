"""Approval tickets: create (frozen), read, list, review, revoke — every route through the chain."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ..approvals.binding import resource_hash
from ..approvals.command import Command
from ..approvals.command import command_hash as bound_command_hash
from ..approvals.policy import reviewer_facts, ticket_requirements
from ..approvals.review import (
    TICKET_READ,
    TICKET_REVIEW,
    load_ticket,
    require_repository,
    review_ticket,
    ticket_target,
)
from ..approvals.tickets import new_ticket, ticket_view
from ..approvals.withdrawal import withdraw_unanswered
from ..audit.log import AUDIT
from ..authn.sessions import AUTHENTICATOR
from ..authz import actions
from ..authz.engine import ENGINE
from ..chain import Outcome, Run, Target, Write, protected, protected_as
from ..config import CONFIG
from ..errors import Forbidden, SchemaValidationFailed
from ..store.base import TicketRecord
from .queries import query_page_limit, query_str

routes = web.RouteTableDef()


async def _create_target(request: web.Request, body: Any) -> Target:
    require_repository(request.app[CONFIG])
    return Target(
        resource=body["resource"],
        env=body["env"],
        owner=body["subject_id"],
        attributes={"target_action": body["action"]},
    )


@routes.post("/api/v1/approvals")
@protected("approvals.create", target=_create_target, body="approval-request.schema.json")
async def create_approval(run: Write) -> Outcome:
    """Create a pending ticket bound to subject, env, resource hash, action (+ the command and
    its hash); refused (422 ``approval_not_required``) where the action needs no ticket."""
    body = run.body
    if body["action"] not in actions.ACTIONS:
        raise SchemaValidationFailed(
            "unknown action", errors=[{"pointer": "/action", "message": "not in the action catalogue"}]
        )
    if "resource_hash" in body and body["resource_hash"] != resource_hash(body["resource"]):
        raise SchemaValidationFailed(
            "resource_hash does not match the resource",
            code="resource_hash_mismatch",
            errors=[{"pointer": "/resource_hash", "message": "must equal sha256 of the RFC 8785 "
                     "canonical JSON of resource"}],
        )
    command, command_hash = _command(body, run.principal.kind)
    subject_kind = (
        run.principal.kind if body["subject_id"] == run.principal.subject_id
        else _subject_kind(run.request, body["subject_id"])
    )
    if subject_kind is None:
        raise SchemaValidationFailed(
            "unknown subject", errors=[{"pointer": "/subject_id", "message": "no such identity"}]
        )
    # The resource kind and hash the executing request will present (the kind from the catalogue;
    # the executing request's own id, e.g. a task id, is not bound by tickets and unknown here).
    req = ticket_requirements(
        run.request.app[ENGINE], run.config, subject_id=body["subject_id"],
        subject_kind=subject_kind, action=body["action"],
        target=Target(body["resource"], body["env"]), command_hash=command_hash,
        correlation_id=run.correlation_id,
        subject_idp_groups=(
            run.principal.idp_groups if body["subject_id"] == run.principal.subject_id else ()
        ),
    )
    if "ttl_s" in body and body["ttl_s"] < req.ttl_s:
        req = type(req)(req.quorum, req.require_groups, req.reviewer_roles, body["ttl_s"],
                        req.pending_ttl_s)
    ticket, nonce = new_ticket(
        subject_id=body["subject_id"], env=body["env"], resource=body["resource"],
        action=body["action"], command_hash=command_hash, reason=body.get("reason"),
        requested_by=run.principal.subject_id, req=req, now=run.now, command=command,
    )
    await run.tx.create_ticket(ticket)
    store, audit = run.store, run.request.app[AUDIT]

    async def withdraw() -> None:  # the nonce was in the lost answer: nobody can redeem it
        await withdraw_unanswered(store, audit, ticket.id, run.correlation_id)

    return Outcome(
        201,
        ticket_view(ticket, nonce=nonce),
        headers={"Location": f"/api/v1/approvals/{ticket.id}"},
        audit={"ticket_id": ticket.id, "ticket_event": "created",
               "ticket_action": ticket.action, "ticket_subject": ticket.subject_id},
        if_unanswered=withdraw,
    )


@routes.get("/api/v1/approvals/{id}")
@protected_as(TICKET_READ)
async def read_approval(run: Run) -> Outcome:
    """One ticket with its reviews and both clocks (never the nonce)."""
    ticket: TicketRecord = run.target.record
    return Outcome(200, ticket_view(ticket), audit={"ticket_id": ticket.id})


async def _list_target(request: web.Request, body: Any) -> Target:
    require_repository(request.app[CONFIG])
    env = query_str(request, "env", pattern=r"[a-z][a-z0-9-]{0,31}")
    # Without an env filter the list spans every environment, so it is authorized as the
    # strictest one (a production environment).
    return Target.collection("approvals", env or request.app[CONFIG].environments.strictest())


@routes.get("/api/v1/approvals")
@protected("approvals.list", target=_list_target)
async def list_approvals(run: Run) -> Outcome:
    """The reviewer queue: filter by state, env, subject; newest first; cursor paging."""
    request = run.request
    state = query_str(request, "state", choices=("pending", "approved", "rejected", "expired",
                                                  "revoked", "consumed"))
    env = query_str(request, "env", pattern=r"[a-z][a-z0-9-]{0,31}")
    subject = query_str(request, "subject_id", pattern=r"[A-Za-z0-9._@:-]{1,200}")
    limit = query_page_limit(request, default=50, high=200)
    cursor = query_str(request, "cursor", pattern=r"[A-Za-z0-9_:.-]{1,200}")
    try:
        tickets, next_cursor = await run.store.list_tickets(
            state=state, env=env, subject_id=subject, limit=limit, before=cursor
        )
    except ValueError:  # the store could not decode the cursor: not one it issued
        raise SchemaValidationFailed(
            "query parameter 'cursor' is invalid", code="invalid_query",
            errors=[{"pointer": "/query/cursor", "message": "not a cursor this service issued"}],
        ) from None
    return Outcome(200, {"items": [ticket_view(t) for t in tickets], "next_cursor": next_cursor})


@routes.post("/api/v1/approvals/{id}/reviews")
@protected_as(TICKET_REVIEW)
async def review_approval(run: Write) -> Outcome:
    """Approve or reject (``approvals.review``: the console's review form runs the same step)."""
    return await review_ticket(run, run.body["decision"], run.body.get("reason"))


@routes.post("/api/v1/approvals/{id}/revoke")
@protected("approvals.revoke", target=ticket_target)
async def revoke_approval(run: Write) -> Outcome:
    """Revoke a pending or approved ticket: its requester, or an admin."""
    ticket = await load_ticket(run.tx, run.target.id or "")
    if run.principal.subject_id != ticket.requested_by and "admin" not in reviewer_facts(
        run.request.app[ENGINE], run.principal.subject_id, "approvals.revoke",
        run.principal.idp_groups,
    ).roles:
        raise Forbidden("only the ticket's requester or an admin can revoke it", code="not_requester")
    updated = await run.tx.transition_ticket(ticket.id, ("pending", "approved"), "revoked", run.now,
                                             run.principal.subject_id)
    return Outcome(200, ticket_view(updated),
                   audit={"ticket_id": ticket.id, "ticket_event": "revoked"})


def _command(body: Any, caller_kind: str) -> tuple[Command | None, str | None]:
    """The ticket's command text and ``sha256:`` hash from the request body.

    With ``command`` the server computes the hash (``approvals.command``), and a ``command_hash``
    sent alongside must equal it. Agents and services must send the command text, so the
    approver sees what will run, not only its hash.
    """
    command, given_hash = body.get("command"), body.get("command_hash")
    if command is None:
        if caller_kind != "human":
            code, pointer = (("command_required", "/command") if given_hash
                             else ("command_hash_required", "/command_hash"))
            raise SchemaValidationFailed(
                "agents and services must send the command (its text; the hash is derived)",
                code=code, errors=[{"pointer": pointer, "message":
                                    "required for agent and service callers"}],
            )
        return None, given_hash
    computed = bound_command_hash(command)
    if given_hash is not None and given_hash != computed:
        raise SchemaValidationFailed(
            "command_hash does not match the command", code="command_hash_mismatch",
            errors=[{"pointer": "/command_hash", "message": "must equal sha256 of the command's "
                     "canonical form (UTF-8 of a string, RFC 8785 JSON of an argv array)"}],
        )
    return command, computed


def _subject_kind(request: web.Request, subject_id: str) -> str | None:
    """The kind of a known, active identity (None for unknown or disabled)."""
    identity = request.app[AUTHENTICATOR].identities.active(subject_id)
    return identity.kind if identity is not None else None
