"""Stage 3 of the chain on its own (``service.approvals.redeem``), on a real SQLite store with the
shipped policies' decision: every refusal of ``check`` before a transaction opens (no repository,
a step-up missing or too old, no ticket, malformed headers, an unknown ticket or a wrong nonce, a
ticket bound to another subject, environment, action, resource or command, a ticket not approved,
replayed or expired), and ``consume`` as the one conditional write that decides a replay."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest

from service.approvals import redeem
from service.approvals.command import command_hash
from service.approvals.tickets import new_ticket, requirements
from service.authn.errors import StepUpRequired
from service.authn.principal import Principal
from service.authz import actions
from service.authz.decide import decide
from service.authz.decision import Decision
from service.authz.engine import PolicyEngine, default_policies_dir
from service.config import Config
from service.errors import (
    ApprovalRepositoryUnavailable,
    ApprovalRequired,
    BadRequest,
    Conflict,
    TicketBindingMismatch,
)
from service.run import Target
from service.store import ReviewRecord, Store, TicketRecord, open_store
from service.store.base import Conflict as StoreConflict

NOW = 1_800_000_000.0
INSTALL = actions.get("installer.run.execute")
RESOURCE = {"app": "web", "version": "1.2.3"}
DEPLOY = "helm upgrade web ./chart --version 1.2.3"
ALICE = Principal(subject_id="alice", kind="human", session_id="s-alice", auth_time=NOW - 600,
                  authn_method="password", step_up_at=NOW - 60)
AGENT = Principal(subject_id="agent-7", kind="agent", session_id="s-agent", auth_time=NOW - 60,
                  authn_method="private_key_jwt")


@pytest.fixture(scope="module")
def engine() -> PolicyEngine:
    loaded = PolicyEngine(default_policies_dir(), {"dev": False, "staging": False, "prod": True})
    assert loaded.load().ok
    return loaded


@pytest.fixture
def config(make_config) -> Config:
    return make_config()


@pytest.fixture
async def store(config: Config) -> AsyncIterator[Store]:
    opened = await open_store(f"sqlite:///{config.store.sqlite_path}")
    try:
        yield opened
    finally:
        await opened.close()


def decision_for(engine: PolicyEngine, config: Config, principal: Principal, target: Target
                 ) -> Decision:
    decided = decide(engine, config.environments, principal.to_input(NOW, 300), INSTALL, target,
                     {"correlation_id": "corr-1", "method": "POST",
                      "path": "/api/v1/installer/actions", "command_hash": None,
                      "time": "2027-01-15T08:00:00.000Z"})
    assert decided.decision == "require_approval", decided
    return decided


async def ticket(store: Store, *, state: str = "approved", subject: str = "alice",
                 env: str = "prod", action: str = INSTALL.name, resource: Any = RESOURCE,
                 command: str | None = None, ttl_s: int = 900) -> tuple[TicketRecord, str]:
    """A stored ticket (approved by bob unless ``state`` is ``pending``) and its nonce."""
    req = requirements({"quorum": 1, "ttl_s": ttl_s}, default_ttl_s=900, default_pending_ttl_s=3600)
    record, nonce = new_ticket(subject_id=subject, env=env, resource=resource, action=action,
                               command_hash=command_hash(command) if command else None,
                               reason="release", requested_by=subject, req=req, now=NOW - 120)
    await store.create_ticket(record)
    if state != "pending":
        record = await store.add_review(
            record.id, ReviewRecord("bob", "approve", None, None, NOW - 100), "approved",
            NOW - 100 + ttl_s, NOW - 100)
    if state not in ("pending", "approved"):
        record = await store.transition_ticket(record.id, ("approved",), state, NOW - 90, "bob")
    return record, nonce


def presenting(record: TicketRecord, nonce: str, **extra: str) -> dict[str, str]:
    return {redeem.TICKET_HEADER: record.id, redeem.NONCE_HEADER: nonce, **extra}


async def check(engine, config, store, headers, *, principal: Principal = ALICE,
                target: Target | None = None, now: float = NOW) -> redeem.Redemption:
    target = target or Target(RESOURCE, "prod")
    decision = decision_for(engine, config, principal, target)
    return await redeem.check(config, store, principal, INSTALL, target, decision, headers, now)


async def test_a_matching_approved_ticket_passes_and_is_consumed_once(engine, config, store):
    record, nonce = await ticket(store)
    redemption = await check(engine, config, store, presenting(record, nonce))
    assert redemption.ticket.id == record.id
    async with store.run_transaction(redemption.ticket) as tx:
        consumed = await redeem.consume(tx, redemption, NOW, "corr-1")
    assert consumed.state == "consumed" and consumed.consumed_correlation_id == "corr-1"
    # The replay: refused before any transaction by check, and by the store's write itself.
    with pytest.raises(Conflict) as replayed:
        await check(engine, config, store, presenting(record, nonce))
    assert replayed.value.instance_code == "ticket_consumed"
    with pytest.raises(StoreConflict) as raced:
        async with store.run_transaction(redemption.ticket) as tx:
            await redeem.consume(tx, redemption, NOW + 1, "corr-2")
    assert raced.value.reason == "ticket_consumed"
    assert (await store.get_ticket(record.id)).consumed_correlation_id == "corr-1"


async def test_without_an_approval_repository_it_fails_closed(engine, make_config, store):
    config = make_config({"approvals": {"store": "none"}})
    record, nonce = await ticket(store)
    with pytest.raises(ApprovalRepositoryUnavailable):
        await check(engine, config, store, presenting(record, nonce))


@pytest.mark.parametrize("principal", [
    replace(ALICE, step_up_at=None),
    replace(ALICE, step_up_at=NOW - 301),  # older than the 300 s window
    replace(AGENT, auth_time=NOW - 301),  # a key-based login stands in for step-up while fresh
    replace(AGENT, authn_method="password"),  # ...and only a key-based one
], ids=["never", "too-old", "agent-login-too-old", "agent-not-key-based"])
async def test_production_needs_a_fresh_step_up_before_the_ticket_is_read(
        engine, config, store, principal):
    record, nonce = await ticket(store, subject=principal.subject_id)
    with pytest.raises(StepUpRequired) as refused:
        await check(engine, config, store, presenting(record, nonce), principal=principal)
    assert 'max_age="300"' in refused.value.challenge or "max_age=300" in refused.value.challenge
    assert (await store.get_ticket(record.id)).state == "approved"


async def test_no_ticket_is_approval_required_naming_the_bindings(engine, config, store):
    with pytest.raises(ApprovalRequired) as human:
        await check(engine, config, store, {})
    bindings = human.value.extensions["bindings"]
    assert bindings["subject_id"] == "alice" and bindings["env"] == "prod"
    assert bindings["action"] == INSTALL.name and bindings["resource"] == RESOURCE
    assert bindings["resource_hash"] == Target(RESOURCE, "prod").hash
    assert bindings["command_hash_required"] is False
    with pytest.raises(ApprovalRequired) as agent:
        await check(engine, config, store, {}, principal=AGENT)
    assert agent.value.extensions["bindings"]["command_hash_required"] is True


@pytest.mark.parametrize("headers", [
    {redeem.TICKET_HEADER: "tkt_" + "0" * 32},
    {redeem.NONCE_HEADER: "n" * 32},
    {redeem.TICKET_HEADER: "ticket-1", redeem.NONCE_HEADER: "n" * 32},
    {redeem.TICKET_HEADER: "tkt_" + "0" * 32, redeem.NONCE_HEADER: "short"},
    {redeem.TICKET_HEADER: "tkt_" + "0" * 32, redeem.NONCE_HEADER: "n" * 32,
     redeem.COMMAND_HASH_HEADER: "md5:abc"},
], ids=["ticket-only", "nonce-only", "bad-id", "bad-nonce", "bad-command-hash"])
async def test_malformed_approval_headers_are_400(engine, config, store, headers):
    with pytest.raises(BadRequest) as refused:
        await check(engine, config, store, headers)
    assert refused.value.instance_code in ("invalid_ticket_headers", "invalid_command_hash")


async def test_an_unknown_ticket_and_a_wrong_nonce_are_the_same_mismatch(engine, config, store):
    record, nonce = await ticket(store)
    unknown = presenting(replace(record, id="tkt_" + "0" * 32), nonce)
    wrong_nonce = presenting(record, "x" * len(nonce))
    for headers in (unknown, wrong_nonce):
        with pytest.raises(TicketBindingMismatch) as refused:
            await check(engine, config, store, headers)
        assert refused.value.extensions["fields"] == ["nonce"]


@pytest.mark.parametrize(("bound", "field"), [
    ({"subject": "bob"}, "subject_id"),
    ({"env": "staging"}, "env"),
    ({"action": "databases.restart"}, "action"),
    ({"resource": {"app": "web", "version": "1.2.4"}}, "resource_hash"),
    ({"command": DEPLOY}, "command_hash"),  # the ticket binds a command this request lacks
])
async def test_a_ticket_bound_to_another_request_is_a_mismatch_naming_the_field(
        engine, config, store, bound, field):
    record, nonce = await ticket(store, **bound)
    with pytest.raises(TicketBindingMismatch) as refused:
        await check(engine, config, store, presenting(record, nonce))
    assert refused.value.extensions["fields"] == [field]
    assert (await store.get_ticket(record.id)).state == "approved"


async def test_the_command_hash_must_be_the_one_the_ticket_binds(engine, config, store):
    record, nonce = await ticket(store, command=DEPLOY)
    other = presenting(record, nonce, **{redeem.COMMAND_HASH_HEADER: command_hash("rm -rf /")})
    with pytest.raises(TicketBindingMismatch) as refused:
        await check(engine, config, store, other)
    assert refused.value.extensions["fields"] == ["command_hash"]
    same = presenting(record, nonce, **{redeem.COMMAND_HASH_HEADER: command_hash(DEPLOY)})
    assert (await check(engine, config, store, same)).binding.command_hash == command_hash(DEPLOY)


@pytest.mark.parametrize(("state", "code"), [
    ("pending", "ticket_not_approved"),
    ("revoked", "ticket_revoked"),
])
async def test_a_ticket_that_is_not_approved_is_409(engine, config, store, state, code):
    record, nonce = await ticket(store, state=state)
    with pytest.raises(Conflict) as refused:
        await check(engine, config, store, presenting(record, nonce))
    assert (refused.value.instance_code, refused.value.extensions["state"]) == (code, state)


async def test_an_expired_approval_is_409_and_stays_unconsumed(engine, config, store):
    record, nonce = await ticket(store, ttl_s=60)  # approved at NOW - 100: expired at NOW - 40
    with pytest.raises(Conflict) as refused:
        await check(engine, config, store, presenting(record, nonce))
    assert refused.value.instance_code == "ticket_expired"
    # One second earlier it was still redeemable.
    stepped = replace(ALICE, step_up_at=NOW - 100)
    assert await check(engine, config, store, presenting(record, nonce), principal=stepped,
                       now=NOW - 41)
    assert (await store.get_ticket(record.id)).state == "approved"
