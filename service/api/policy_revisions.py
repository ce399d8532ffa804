"""Policy revisions for the fleet: publish (signed), list, activate, roll back — through the chain.

Publishing stores an immutable revision; activating (or rolling back) sets the fleet's active
revision, which every replica with ``policies.source: store`` runs within the convergence bound.
Both are mutations of the whole fleet, so they are authorised as the strictest environment
(``environments.strictest()``): in a fleet that serves production they need step-up and an
approved ticket bound to the revision, like any other production mutation.

Before the chain's AuthZ, a published bundle's signature must verify with a trusted key
(``policies.store.trusted_keys``) and the bundle must pass the same vetting every process runs
before it loads a revision (compile, probe decision, ``*_test.rego``, in a child process): only
holders of a signing key can make the service vet anything, and nothing unvetted is stored.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
from collections.abc import Callable
from datetime import datetime
from typing import Any

from aiohttp import web

from .. import clock
from ..approvals.review import TICKET_READ
from ..authn.principal import PRINCIPAL
from ..authz.activations import POLICY_ACTIVATION_SIGNER, ActivationSigner
from ..authz.engine import ENGINE
from ..authz.reload import POLICY_FOLLOWER
from ..authz.revisions import POLICY_KEYS, Bundle, BundleError, Claims, SignatureError, TrustedKeys, verify
from ..chain import Outcome, Run, Target, Write, protected, protected_as
from ..clock import iso
from ..config import CONFIG
from ..errors import (
    Conflict,
    NotFound,
    SchemaValidationFailed,
    ServiceUnavailable,
)
from ..policytools import change
from ..policytools.change import DIRECTORY
from ..store.base import PolicyActivation, PolicyRevisionRecord, StoreError, TicketRecord
from ..storelink import STORE
from .queries import query_page_limit, query_str

__all__ = ["activation_view", "revision_view", "routes"]

routes = web.RouteTableDef()
log = logging.getLogger("controlplane.api")

def _fleet_env(request: web.Request) -> str:
    # A revision decides for every environment the fleet serves: judged as the strictest.
    return request.app[CONFIG].environments.strictest()


def _invalid(code: str, pointer: str, message: str, **extra: Any) -> SchemaValidationFailed:
    return SchemaValidationFailed(message, code=code,
                                  errors=[{"pointer": pointer, "message": message}], **extra)


def revision_view(rec: PolicyRevisionRecord, active: str | None) -> dict[str, Any]:
    """A revision as listed: who, when, why, which key; never its policy text or data."""
    return {
        "id": rec.id, "digest": rec.digest, "kid": rec.kid, "author": rec.author,
        "message": rec.message, "created_at": iso(rec.created_at),
        "published_by": rec.published_by, "published_at": iso(rec.published_at),
        "active": rec.id == active,
    }


def activation_view(a: PolicyActivation) -> dict[str, Any]:
    return {
        # revision None: back to directory mode (every replica runs its policies.dir).
        "seq": a.seq, "revision": a.revision_id or None, "previous": a.previous_id or None,
        "kind": a.kind, "activated_by": a.activated_by, "activated_at": iso(a.activated_at),
        "reason": a.reason,
    }


# ---- publish ---------------------------------------------------------------------------------


async def _publish_target(request: web.Request, body: Any) -> Target:
    try:
        bundle = Bundle.from_doc(body["bundle"])
        snapshot = await asyncio.to_thread(bundle.snapshot)
    except BundleError as exc:
        raise _invalid("invalid_bundle", "/bundle", str(exc)[:300]) from None
    keys: TrustedKeys = request.app[POLICY_KEYS]
    try:
        claims = verify(bundle, body["signature"], keys, revision=snapshot.revision)
        created_at = datetime.fromisoformat(claims.created_at).timestamp()
    except SignatureError as exc:
        raise _invalid("policy_signature_invalid", "/signature", str(exc),
                       reason=exc.reason) from None
    except ValueError:
        raise _invalid("policy_signature_invalid", "/signature",
                       "the signed created_at is not an RFC 3339 time", reason="malformed") from None
    if not math.isfinite(created_at):
        raise _invalid("policy_signature_invalid", "/signature", "created_at out of range",
                       reason="malformed")
    report = await asyncio.to_thread(request.app[ENGINE].vet_revision, snapshot)
    if not report.ok:
        raise _invalid("policy_rejected", "/bundle", report.summary()[:300])
    return Target(resource={"revision": snapshot.revision, "digest": bundle.digest},
                  env=_fleet_env(request), id=snapshot.revision,
                  attributes={"kid": claims.kid}, record=(bundle, claims, created_at),
                  authorized=functools.partial(_propose, request, bundle, body["signature"],
                                               claims, created_at))


async def _propose(request: web.Request, bundle: Bundle, signature: Any, claims: Claims,
                   created_at: float) -> None:
    # Signed by a trusted key, vetted, and not denied by the policy (the chain calls this after
    # AuthZ): kept as a proposal, so the reviewers of its ticket read the change before it is
    # approved (it is stored as a revision only by the publish).
    store = request.app[STORE].store
    if store is None:
        return
    try:
        await store.add_policy_candidate(PolicyRevisionRecord(
            id=claims.revision, digest=claims.digest, bundle=bundle.to_doc(),
            signature=dict(signature), kid=claims.kid, author=claims.author,
            message=claims.message, created_at=created_at,
            published_by=request[PRINCIPAL].subject_id, published_at=clock.now()))
    except StoreError as exc:  # the publish itself does not depend on it
        log.warning("policy candidate not kept for review: %s", type(exc).__name__)


@routes.post("/api/v1/policy/revisions")
@protected("policy.publish", target=_publish_target, body="policy-publish.schema.json")
async def publish_revision(run: Write) -> Outcome:
    """Store a signed, vetted revision (201; 200 when that exact revision was stored before).
    Publishing does not activate it."""
    bundle: Bundle
    claims: Claims
    bundle, claims, created_at = run.target.record
    rec = PolicyRevisionRecord(
        id=claims.revision, digest=claims.digest, bundle=bundle.to_doc(),
        signature=dict(run.body["signature"]), kid=claims.kid, author=claims.author,
        message=claims.message, created_at=created_at, published_by=run.principal.subject_id,
        published_at=run.now,
    )
    stored = await run.tx.add_policy_revision(rec)
    if not stored:
        rec = await run.tx.get_policy_revision(rec.id) or rec
    active = await run.tx.active_policy()
    return Outcome(
        201 if stored else 200,
        revision_view(rec, active.revision_id if active else None),
        headers={"Location": "/api/v1/policy/revisions"},
        audit={"revision": rec.id, "digest": rec.digest, "kid": rec.kid, "stored": stored},
    )


# ---- list ------------------------------------------------------------------------------------


async def _list_target(request: web.Request, body: Any) -> Target:
    return Target.collection("policy_revisions", _fleet_env(request))


@routes.get("/api/v1/policy/revisions")
@protected("policy.read", target=_list_target)
async def list_revisions(run: Run) -> Outcome:
    """Published revisions, newest first (cursor paging), the active one and recent changes."""
    limit = query_page_limit(run.request, default=50, high=200)
    cursor = query_str(run.request, "cursor", pattern=r"[0-9]{1,12}(\.[0-9]{1,9})?")
    before = float(cursor) if cursor else None
    revisions = await run.store.list_policy_revisions(limit=limit, before=before)
    history = await run.store.policy_activations(limit=20)
    active = history[0] if history else None
    next_cursor = (repr(revisions[-1].published_at) if len(revisions) == limit else None)
    return Outcome(200, {
        "active": activation_view(active) if active else None,
        "items": [revision_view(r, active.revision_id if active else None) for r in revisions],
        "activations": [activation_view(a) for a in history],
        "next_cursor": next_cursor,
    })


# ---- activate and roll back ------------------------------------------------------------------


# ---- the change a policy ticket is about -----------------------------------------------------


@routes.get("/api/v1/approvals/{id}/change")
@protected_as(TICKET_READ)  # who may read it may read its change
async def ticket_change(run: Run) -> Outcome:
    """A policy ticket's change: signed message and author, vetting, the diff against the
    revision the fleet runs and the recent decisions replayed against it (404
    ``no_policy_change`` for other tickets, or a candidate no trusted key signed)."""
    ticket: TicketRecord = run.target.record
    config = run.config
    keys: TrustedKeys = run.request.app[POLICY_KEYS]
    found = await change.report(
        run.store, keys, ticket.action, ticket.resource,
        config.policies.dir, config.environments,
        config.decision_log.path)
    if found is None:
        raise NotFound("this ticket carries no readable policy change", code="no_policy_change")
    return Outcome(200, {"ticket_id": ticket.id, "action": ticket.action, **found},
                   audit={"ticket_id": ticket.id})


def _signer(request: web.Request) -> ActivationSigner:
    # Every replica refuses an unsigned activation: without a key this one cannot activate.
    signer = request.app[POLICY_ACTIVATION_SIGNER]
    if signer is None:
        raise ServiceUnavailable(
            "this replica has no usable policy activation key (policies.store.activation_key)",
            code="policy_activation_key_missing")
    return signer


async def _activate_target(request: web.Request, body: Any) -> Target:
    store = request.app[STORE].require()
    rec = await store.get_policy_revision(body["revision"])
    if rec is None:
        raise NotFound("no such policy revision", code="policy_revision_not_found")
    _check_trusted(request, rec)
    _signer(request)  # before any ticket is consumed
    return Target(resource={"revision": rec.id}, env=_fleet_env(request), id=rec.id, record=rec)


async def _rollback_target(request: web.Request, body: Any) -> Target:
    store = request.app[STORE].require()
    active = await store.active_policy()
    if active is None or not (active.previous_id or active.revision_id):
        raise Conflict("there is no previous revision to roll back to", code="no_rollback_target")
    if not active.previous_id:
        # Right after the first activation: back to directory mode (each replica's
        # policies.dir, as before any activation).
        _signer(request)
        return Target(resource={"revision": DIRECTORY}, env=_fleet_env(request), id=DIRECTORY,
                      attributes={"rollback_from": active.revision_id}, record=active)
    rec = await store.get_policy_revision(active.previous_id)
    if rec is None:
        raise NotFound("no such policy revision", code="policy_revision_not_found")
    _check_trusted(request, rec)
    _signer(request)
    # The same resource as activating that revision: one ticket shape for both.
    return Target(resource={"revision": rec.id}, env=_fleet_env(request), id=rec.id,
                  attributes={"rollback_from": active.revision_id}, record=active)


def _check_trusted(request: web.Request, rec: PolicyRevisionRecord) -> None:
    # Every replica would refuse it: activating it would only degrade the fleet.
    keys: TrustedKeys = request.app[POLICY_KEYS]
    try:
        verify(Bundle.from_doc(rec.bundle), rec.signature, keys, revision=rec.id)
    except (SignatureError, BundleError) as exc:
        reason = exc.reason if isinstance(exc, SignatureError) else "malformed"
        raise _invalid("policy_signature_invalid", "/revision",
                       f"this service does not trust the revision's signature: {exc}",
                       reason=reason) from None


@routes.post("/api/v1/policy/activation")
@protected("policy.activate", target=_activate_target, body="policy-activate.schema.json")
async def activate_revision(run: Write) -> Outcome:
    """Make a published revision the fleet's active one (signed with this replica's activation
    key, naming the approving ticket)."""
    activation = await run.tx.activate_policy_revision(
        run.target.record.id, kind="activate", by=run.principal.subject_id, at=run.now,
        reason=run.body.get("reason"), sign=_signing(run), after_seq=_accepted(run),
    )
    return _activated(run, activation)


@routes.post("/api/v1/policy/rollback")
@protected("policy.activate", target=_rollback_target, body="policy-rollback.schema.json")
async def rollback_revision(run: Write) -> Outcome:
    """Activate the revision that was active before the current one (right after the first
    activation: none, back to directory mode; 409 state_conflict if the
    active revision changed since the request was authorised)."""
    current: PolicyActivation = run.target.record
    activation = await run.tx.activate_policy_revision(
        current.previous_id, kind="rollback", by=run.principal.subject_id, at=run.now,
        reason=run.body.get("reason"), expected=current.revision_id, sign=_signing(run),
        after_seq=_accepted(run),
    )
    return _activated(run, activation)


def _signing(run: Write) -> Callable[[PolicyActivation], dict[str, str]]:
    signer, ticket = _signer(run.request), run.ticket.id if run.ticket else None
    return lambda activation: signer.sign(activation, ticket)


def _accepted(run: Write) -> int:
    # Above what this replica accepted, even if the database's history was cut back under it:
    # replicas refuse an activation whose seq is not above the last one they followed.
    follower = run.request.app[POLICY_FOLLOWER]
    return follower.accepted_seq if follower is not None else 0


def _activated(run: Write, activation: PolicyActivation) -> Outcome:
    # The audit record names what was signed: seq, revision, the ticket and the signing key.
    return Outcome(200, activation_view(activation),
                   audit={"revision": activation.revision_id,
                          "previous": activation.previous_id or None,
                          "seq": activation.seq, "kind": activation.kind,
                          "ticket": run.ticket.id if run.ticket else None,
                          "activation_kid": _signer(run.request).kid})

