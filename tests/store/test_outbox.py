"""The notification outbox on both backends: every ticket change writes its event in the same
transaction (and a change that fails writes none), and claims are leases no two claimers share."""

from __future__ import annotations

import asyncio

import pytest

from service.store import Store, open_store
from service.store.base import Conflict, DeliveryRecord, NotFound, StoreError

from .helpers import T0, approved_ticket, binding, review, ticket

LEASE = 30.0


async def types(store: Store) -> list[tuple[str, str]]:
    events = await store.list_outbox(limit=500)
    return [(e.ticket_id, e.type) for e in reversed(events)]


async def test_every_ticket_change_writes_its_event(store: Store) -> None:
    await approved_ticket(store, "t-1")
    await store.consume_ticket("t-1", **binding(ticket("t-1")))
    await store.create_ticket(ticket("t-2", approval={"quorum": 2}))
    await store.add_review("t-2", review("bob"), None, None, T0 + 10)
    await store.add_review("t-2", review("dave", "reject"), "rejected", None, T0 + 11)
    await store.create_ticket(ticket("t-3"))
    await store.transition_ticket("t-3", ("pending",), "revoked", T0 + 12, "alice")
    await store.create_ticket(ticket("t-4", pending_until=T0 + 20))
    await store.expire_tickets(T0 + 21)
    assert await types(store) == [
        ("t-1", "approval.requested"), ("t-1", "approval.approved"), ("t-1", "approval.consumed"),
        ("t-2", "approval.requested"), ("t-2", "approval.reviewed"), ("t-2", "approval.rejected"),
        ("t-3", "approval.requested"), ("t-3", "approval.revoked"),
        ("t-4", "approval.requested"), ("t-4", "approval.expired"),
    ]
    events = {(e.ticket_id, e.type): e for e in await store.list_outbox(limit=500)}
    consumed = events[("t-1", "approval.consumed")]
    assert consumed.data["state"] == "consumed" and consumed.data["actor"] == "alice"
    assert consumed.data["correlation_id"] == "corr-1" and consumed.at == T0 + 30
    assert "nonce" not in consumed.data and "nonce_hash" not in consumed.data
    approved = events[("t-1", "approval.approved")]
    assert approved.data["review"]["reviewer"] == "bob" and approved.data["actor"] == "bob"
    assert events[("t-4", "approval.expired")].data["actor"] == "system"
    assert events[("t-3", "approval.revoked")].data["closed_by"] == "alice"
    assert len({e.id for e in events.values()}) == 10
    assert all(e.state == "pending" and e.attempts == 0 for e in events.values())


async def test_a_change_that_fails_writes_no_event(store: Store) -> None:
    with pytest.raises(RuntimeError):
        async with store.transaction() as tx:
            await tx.create_ticket(ticket("t-1"))
            raise RuntimeError("the run failed after the change")
    assert await store.get_ticket("t-1") is None
    assert await types(store) == []

    await approved_ticket(store, "t-2")
    before = await types(store)
    with pytest.raises(Conflict):  # not pending any more
        await store.add_review("t-2", review("dave"), "approved", T0 + 900, T0 + 20)
    with pytest.raises(Conflict):  # a binding that does not match
        await store.consume_ticket("t-2", **binding(ticket("t-2"), env="dev"))
    with pytest.raises(Conflict):  # already approved: not revocable as pending
        await store.transition_ticket("t-2", ("pending",), "revoked", T0 + 20, "alice")
    await store.create_ticket(ticket("t-3", approval={"quorum": 2}))
    await store.add_review("t-3", review("bob"), None, None, T0 + 10)
    with pytest.raises(Conflict):  # a second review by bob: its state change rolls back too
        await store.add_review("t-3", review("bob"), "approved", T0 + 900, T0 + 11)
    assert await types(store) == [*before, ("t-3", "approval.requested"),
                                  ("t-3", "approval.reviewed")]


async def test_claims_are_leases_and_follow_ticket_order(store: Store) -> None:
    await approved_ticket(store, "t-1")  # requested, approved
    await store.create_ticket(ticket("t-2"))  # requested
    assert await store.outbox_due(T0 + 20)
    first = await store.claim_outbox("a", T0 + 20, LEASE, 10)
    # t-1's approval waits for its request: events of one ticket go out in order.
    assert [(e.ticket_id, e.type) for e in first] == [
        ("t-1", "approval.requested"), ("t-2", "approval.requested")]
    assert await store.claim_outbox("b", T0 + 21, LEASE, 10) == []
    assert not await store.outbox_due(T0 + 21)
    # A lease that ran out (its holder died) makes the events due again.
    again = await store.claim_outbox("b", T0 + 20 + LEASE, LEASE, 10)
    assert [e.id for e in again] == [e.id for e in first]
    # The old holder's records still count as deliveries, but it no longer moves the event.
    a_done = DeliveryRecord(first[0].id, "hook", "delivered", 1, 200, None, T0 + 51)
    assert not await store.finish_outbox(first[0].id, "a", [a_done], state="delivered",
                                         next_attempt_at=T0 + 51, error=None, now=T0 + 51)
    assert (await store.get_outbox_event(first[0].id)).delivered_sinks == ("hook",)
    assert await store.finish_outbox(first[0].id, "b", [], state="delivered",
                                     next_attempt_at=T0 + 52, error=None, now=T0 + 52)
    nxt = await store.claim_outbox("b", T0 + 53, LEASE, 10)
    assert [(e.ticket_id, e.type) for e in nxt] == [("t-1", "approval.approved")]


async def test_settling_finishes_due_events_in_order_and_leaves_leased_ones(store: Store) -> None:
    await approved_ticket(store, "t-1")  # requested, approved
    await store.create_ticket(ticket("t-2"))  # requested
    await store.create_ticket(ticket("t-3"))  # requested
    (leased,) = await store.claim_outbox("a", T0 + 20, LEASE, 1)  # t-1's request, leased
    assert leased.ticket_id == "t-1"
    # Due now: t-2's and t-3's requests (t-1's approval waits for its leased request); at most 1.
    assert await store.settle_outbox(T0 + 21, 1) == 1
    assert await store.settle_outbox(T0 + 21, 10) == 1
    assert await store.settle_outbox(T0 + 21, 10) == 0
    states = {(e.ticket_id, e.type): e for e in await store.list_outbox(limit=50)}
    for key in (("t-2", "approval.requested"), ("t-3", "approval.requested")):
        assert states[key].state == "delivered" and states[key].finished_at == T0 + 21
        assert states[key].attempts == 1 and states[key].delivered_sinks == ()
    assert states[("t-1", "approval.requested")].state == "pending"  # leased: not touched
    assert states[("t-1", "approval.approved")].state == "pending"
    # Once the lease runs out, the ticket's events are settled one after the other.
    assert await store.settle_outbox(T0 + 20 + LEASE, 10) == 1
    assert await store.settle_outbox(T0 + 20 + LEASE, 10) == 1
    assert not await store.outbox_due(T0 + 20 + LEASE)
    assert all(e.state == "delivered" for e in await store.list_outbox(limit=50))


async def test_retry_dead_letter_and_purge(store: Store) -> None:
    await store.create_ticket(ticket("t-1"))
    (event,) = await store.claim_outbox("a", T0 + 1, LEASE, 10)
    failed = DeliveryRecord(event.id, "hook", "failed", 1, 500, "HTTP 500", T0 + 2)
    assert await store.finish_outbox(event.id, "a", [failed], state="pending",
                                     next_attempt_at=T0 + 10, error="hook: HTTP 500", now=T0 + 2)
    assert not await store.outbox_due(T0 + 9) and await store.outbox_due(T0 + 10)
    assert [e.id for e in await store.list_outbox(failed=True)] == [event.id]
    with pytest.raises(Conflict):
        await store.retry_outbox(event.id, T0 + 11)  # only dead events are retried
    (event,) = await store.claim_outbox("a", T0 + 10, LEASE, 10)
    assert event.attempts == 1
    assert await store.finish_outbox(event.id, "a", [failed], state="dead",
                                     next_attempt_at=T0 + 12, error="hook: HTTP 500", now=T0 + 12)
    assert not await store.outbox_due(T0 + 1000)
    (dead,) = await store.list_outbox(failed=True)
    assert dead.state == "dead" and dead.finished_at == T0 + 12 and dead.attempts == 2
    (delivery,) = await store.outbox_deliveries(event.id)
    assert delivery.attempts == 2 and delivery.last_status == 500
    retried = await store.retry_outbox(event.id, T0 + 100)
    assert retried.state == "pending" and retried.window_start == T0 + 100
    assert retried.attempts == 0 and await store.outbox_due(T0 + 100)
    with pytest.raises(NotFound):
        await store.retry_outbox("no-such-event", T0)
    (event,) = await store.claim_outbox("a", T0 + 100, LEASE, 10)
    assert await store.finish_outbox(event.id, "a", [], state="delivered",
                                     next_attempt_at=T0 + 101, error=None, now=T0 + 101)
    assert await store.list_outbox(failed=True) == []
    assert await store.purge_outbox(T0 + 101) == 0  # finished at T0 + 101, not before
    assert await store.purge_outbox(T0 + 102) == 1
    assert await store.outbox_deliveries(event.id) == []


async def test_concurrent_claimers_never_share_an_event(store: Store, target) -> None:
    for i in range(40):
        await store.create_ticket(ticket(f"t-{i:02d}"))
    others = [await open_store(target.url, schema=target.schema) for _ in range(3)]
    try:
        claimers = [store, *others]
        results = await asyncio.gather(*(
            s.claim_outbox(f"owner-{n}", T0 + 1, LEASE, 15) for n, s in enumerate(claimers)),
            return_exceptions=True)
    finally:
        for s in others:
            await s.close()
    claimed = [e.id for r in results if not isinstance(r, StoreError) for e in r]
    assert not any(isinstance(r, BaseException) and not isinstance(r, StoreError)
                   for r in results)
    assert len(claimed) == len(set(claimed))
    assert len(claimed) == 40  # 4 x 15 >= 40: everything was claimed once


async def test_a_large_ticket_still_changes_and_its_events_leave_the_bulk_out(
        store: Store) -> None:
    # A resource near the bound on one JSON value: the ticket holds it, its events cannot
    # (next to everything else), and that must not stop any change of the ticket.
    big = {"blob": "x" * 180_000}  # with the command, over the bound on one value
    await store.create_ticket(ticket("t-1", resource=big, command=["run"] * 15_000,
                                     reason="r" * 2000))
    await store.add_review("t-1", review("bob"), "approved", T0 + 900, T0 + 10)
    assert (await store.get_ticket("t-1")).resource == big
    for event in await store.list_outbox(limit=10):
        assert event.data["resource"] is None and event.data["resource_omitted"] is True
        assert event.data["command"] is None and event.data["command_omitted"] is True
        assert event.data["resource_hash"] == ticket("t-1").resource_hash
