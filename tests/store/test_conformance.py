"""One conformance suite, run on SQLite and PostgreSQL: the backends must be indistinguishable."""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import replace

import pytest

from service.approvals.states import TICKET_STATES, TICKET_TRANSITIONS
from service.store import (
    AUDIT_GENESIS_HASH,
    Conflict,
    NotFound,
    Store,
    StoreError,
    TicketRecord,
    open_store,
)
from service.store.base import ThrottleRule, ThrottleVerdict

from .conftest import Target
from .helpers import (
    COMMAND_HASH,
    T0,
    approved_ticket,
    binding,
    review,
    seal,
    session,
    ticket,
)

# ------------------------------------------------------------------------------------ lifecycle


async def test_ping_and_describe(store: Store, target: Target) -> None:
    await store.ping()
    info = await store.describe()
    assert info["backend"] == ("sqlite" if target.backend == "sqlite" else "postgresql")
    assert info["durable"] is True
    assert info["multi_replica_safe"] is (target.backend == "postgres")
    assert set(info) == {"backend", "durable", "multi_replica_safe"}
    # Status surfaces must never learn where the data lives.
    assert target.url.split("://", 1)[1] not in repr(info)


async def test_reopen_keeps_data_and_migrates_once(store: Store, target: Target) -> None:
    await store.create_session(session())
    again = await open_store(target.url, schema=target.schema)
    try:
        assert await again.get_session("s-1") == session()
    finally:
        await again.close()


# ------------------------------------------------------------------------------------- sessions


async def test_session_roundtrip_and_duplicate(store: Store) -> None:
    await store.create_session(session())
    assert await store.get_session("s-1") == session()
    assert await store.get_session("nope") is None
    with pytest.raises(Conflict) as exc:
        await store.create_session(session())
    assert exc.value.reason == "duplicate_id"


async def test_session_revoke(store: Store) -> None:
    await store.create_session(session())
    assert await store.revoke_session("s-1", T0 + 5) is True
    assert await store.revoke_session("s-1", T0 + 6) is False  # already revoked: first time wins
    assert await store.revoke_session("nope", T0 + 6) is False
    got = await store.get_session("s-1")
    assert got is not None and got.revoked_at == T0 + 5


async def test_revoke_subject_sessions(store: Store) -> None:
    await store.create_session(session())
    await store.create_session(replace(session(), id="s-2"))
    await store.create_session(replace(session(), id="s-3", subject_id="bob"))
    await store.create_session(replace(session(), id="s-4", expires_at=T0 + 1))
    await store.revoke_session("s-2", T0 + 2)
    # Only the live sessions of that subject: s-2 was revoked before, s-4 has expired.
    assert await store.revoke_subject_sessions("alice", T0 + 5) == 1
    assert await store.revoke_subject_sessions("alice", T0 + 6) == 0
    got = {s: await store.get_session(s) for s in ("s-1", "s-2", "s-3", "s-4")}
    assert got["s-1"] is not None and got["s-1"].revoked_at == T0 + 5
    assert got["s-2"] is not None and got["s-2"].revoked_at == T0 + 2
    assert got["s-3"] is not None and got["s-3"].revoked_at is None
    assert got["s-4"] is not None and got["s-4"].revoked_at is None


async def test_session_step_up(store: Store) -> None:
    await store.create_session(session())
    rec = await store.record_step_up("s-1", T0 + 60, "totp")
    assert (rec.step_up_at, rec.step_up_method) == (T0 + 60, "totp")
    assert await store.get_session("s-1") == rec
    with pytest.raises(NotFound):
        await store.record_step_up("nope", T0 + 60, "totp")
    with pytest.raises(Conflict) as exc:
        await store.record_step_up("s-1", T0 + 3600, "totp")  # at == expires_at
    assert exc.value.reason == "session_expired"
    await store.revoke_session("s-1", T0 + 70)
    with pytest.raises(Conflict) as exc:
        await store.record_step_up("s-1", T0 + 80, "webauthn")
    assert exc.value.reason == "session_revoked"
    got = await store.get_session("s-1")
    assert got is not None and got.step_up_method == "totp"


# ---------------------------------------------------------------------------- one-time values


async def test_claim_once(store: Store) -> None:
    assert await store.claim_once("jti", "a", T0 + 60, T0) is True
    assert await store.claim_once("jti", "a", T0 + 120, T0 + 30) is False  # replay
    assert await store.claim_once("totp", "a", T0 + 60, T0) is True  # namespaces are separate
    assert await store.claim_once("jti", "b", T0 + 60, T0) is True
    # At expiry the old claim no longer protects anything: it can be claimed again, once.
    assert await store.claim_once("jti", "a", T0 + 200, T0 + 60) is True
    assert await store.claim_once("jti", "a", T0 + 300, T0 + 100) is False


# --------------------------------------------------------------------------------- throttling


def budget(key: str, limit: int | None = 3, window: float = 100.0, **delay: float) -> ThrottleRule:
    return ThrottleRule(key, window, limit, **delay)  # type: ignore[arg-type]


async def test_reserve_attempt_counts_up_to_the_limit_then_refuses_until_the_window_ends(
    store: Store,
) -> None:
    rule = budget("login:source:alice|10.0.0.1")
    for n in (1, 2, 3):
        verdict = await store.reserve_attempt([rule], T0 + n)
        assert verdict == ThrottleVerdict(True, {rule.key: n})
    refused = await store.reserve_attempt([rule], T0 + 50)
    # the window opened at the first failure (T0 + 1) and lasts 100 s
    assert refused == ThrottleVerdict(False, {rule.key: 3}, (rule.key,), T0 + 101)
    assert await store.count_failures(rule.key, T0 + 50, 100) == 3
    assert await store.count_failures(rule.key, T0 + 101, 100) == 0  # the window has ended
    assert await store.count_failures("nobody", T0, 100) == 0
    assert (await store.reserve_attempt([rule], T0 + 101)).failures == {rule.key: 1}


async def test_reserve_attempt_is_all_keys_or_none(store: Store) -> None:
    tight, loose = budget("k:tight", limit=1), budget("k:loose", limit=10)
    assert (await store.reserve_attempt([loose, tight], T0)).granted
    verdict = await store.reserve_attempt([loose, tight], T0 + 1)
    assert (verdict.granted, verdict.refused) == (False, ("k:tight",))
    # the refused attempt left the loose key as it was
    assert await store.count_failures("k:loose", T0 + 1, 100) == 1
    assert (await store.reserve_attempt([loose], T0 + 2)).failures == {"k:loose": 2}
    assert (await store.reserve_attempt([], T0)).granted
    async with store.transaction() as tx:  # the same inside a transaction
        verdict = await tx.reserve_attempt([loose, tight], T0 + 3)
        assert not verdict.granted
        assert await tx.count_failures("k:loose", T0 + 3, 100) == 2


async def test_a_plain_budget_does_not_compare_request_times(store: Store) -> None:
    # Workers' clocks differ and requests land out of order: an attempt stamped before the
    # latest one still fits a budget that asks for no spacing.
    rule = budget("k", limit=3)
    assert (await store.reserve_attempt([rule], T0 + 5)).granted
    assert (await store.reserve_attempt([rule], T0 + 4)).failures == {"k": 2}


async def test_release_and_clear(store: Store) -> None:
    rule = budget("k")
    await store.reserve_attempt([rule], T0)
    await store.reserve_attempt([rule], T0 + 1)
    await store.release_failure("k", T0 + 1)
    assert await store.count_failures("k", T0 + 1, 100) == 1
    await store.release_failure("k", T0 + 2)
    await store.release_failure("k", T0 + 3)  # never below zero
    assert await store.count_failures("k", T0 + 3, 100) == 0
    # a reservation of an ended window is not taken back from the next one
    await store.reserve_attempt([rule], T0 + 200)
    await store.release_failure("k", T0 + 3)
    assert await store.count_failures("k", T0 + 200, 100) == 1
    await store.reserve_attempt([budget("other")], T0 + 200)
    await store.clear_failures("k")
    assert await store.count_failures("k", T0 + 200, 100) == 0
    assert await store.count_failures("other", T0 + 200, 100) == 1


async def test_reserve_attempt_spaces_attempts_progressively_without_a_limit(store: Store) -> None:
    rule = budget("subject:alice", limit=None, window=1000, delay_after=3, delay_base_s=2,
                  delay_max_s=10)  # fmt: skip
    t = T0
    for n in (1, 2, 3):  # no spacing before the 3rd failure
        assert (await store.reserve_attempt([rule], t)).failures == {rule.key: n}
    # the 3rd asks for 2 s, the next ones for 4, 8, 10, 10 (bounded)
    for n, delay in ((4, 2.0), (5, 4.0), (6, 8.0), (7, 10.0), (8, 10.0)):
        refused = await store.reserve_attempt([rule], t + delay - 0.5)
        assert (refused.granted, refused.retry_at) == (False, t + delay)
        t += delay
        assert (await store.reserve_attempt([rule], t)).failures == {rule.key: n}
    await store.clear_failures(rule.key)
    assert (await store.reserve_attempt([rule], t)).failures == {rule.key: 1}


async def test_reservations_from_many_processes_grant_at_most_the_budget(
    store: Store, target: Target
) -> None:
    from .test_races import _processes, _spawn

    n = _processes(target)
    args = {"key": "login:source:alice|10.0.0.7", "limit": 5, "attempts": 25, "now": T0}
    granted = await asyncio.to_thread(_spawn, target, "reserve", [args] * n)
    assert sum(granted) == 5, granted
    assert await store.count_failures("login:source:alice|10.0.0.7", T0, 300) == 5
    assert await store.count_failures("login:subject:race", T0, 300) == 5


async def test_concurrent_reservations_grant_at_most_the_budget(store: Store) -> None:
    rules = [budget("login:source:alice|10.0.0.9", limit=5), budget("login:addr:10.0.0.9", 50)]
    verdicts = await asyncio.gather(*(store.reserve_attempt(rules, T0) for _ in range(40)))
    assert sum(v.granted for v in verdicts) == 5
    assert await store.count_failures("login:addr:10.0.0.9", T0, 100) == 5


# ------------------------------------------------------------------------------ housekeeping


async def test_purge_expired_drops_only_what_can_no_longer_matter(store: Store) -> None:
    assert await store.claim_once("jti", "old", T0 + 10, T0) is True
    assert await store.claim_once("jti", "live", T0 + 100, T0) is True
    await store.reserve_attempt([budget("old", window=5)], T0)  # its window opened at T0
    await store.reserve_attempt([budget("alice", window=100)], T0 + 5)
    await store.reserve_attempt([budget("alice", window=100)], T0 + 50)

    assert await store.purge_expired(T0 + 10, failures_before=T0 + 5, sessions_before=0) == (1, 1, 0)
    # the live claim still blocks a replay; the expired one was free to take anyway
    assert await store.claim_once("jti", "live", T0 + 200, T0 + 20) is False
    assert await store.claim_once("jti", "old", T0 + 200, T0 + 20) is True
    # keys whose window is still open keep every failure
    assert await store.count_failures("alice", T0 + 50, 100) == 2
    assert await store.count_failures("old", T0 + 4, 5) == 0  # gone
    assert await store.purge_expired(T0 + 10, failures_before=T0 + 5, sessions_before=0) == (0, 0, 0)


async def test_purge_expired_sessions_only_after_they_expired_before_the_cutoff(store: Store) -> None:
    await store.create_session(session("gone", expires_at=T0 + 10))
    await store.create_session(session("recent", expires_at=T0 + 50))
    await store.create_session(session("live", expires_at=T0 + 3600))
    # cut-off T0 + 40 (e.g. now - retention): only "gone" expired before it
    assert await store.purge_expired(T0 + 100, 0, sessions_before=T0 + 40) == (0, 0, 1)
    assert await store.get_session("gone") is None
    assert await store.get_session("recent") is not None and await store.get_session("live")
    # a cut-off in the future never takes a session that has not expired yet
    assert await store.purge_expired(T0 + 100, 0, sessions_before=T0 + 10_000) == (0, 0, 1)
    assert await store.get_session("live") is not None


# ------------------------------------------------------------------------------------ tickets


@pytest.mark.parametrize(
    ("resource", "command_hash"),
    [
        pytest.param({"kind": "db", "tags": ["a", "ü"], "n": 1.5}, COMMAND_HASH, id="object"),
        pytest.param("db-1", None, id="string-no-command"),
    ],
)
async def test_ticket_roundtrip(store: Store, resource: object, command_hash: str | None) -> None:
    rec = ticket(resource=resource, command_hash=command_hash)
    await store.create_ticket(rec)
    assert await store.get_ticket("t-1") == rec
    assert await store.get_ticket("nope") is None


async def test_a_ticket_read_with_a_task_is_both_as_read_alone(store: Store) -> None:
    """``get_ticket_and_task`` (a chain run's pre-read): the ticket with its reviews, as
    ``get_ticket`` gives it, and the task as ``get_task`` does; no task read without a ticket."""
    rec = await approved_ticket(store)
    await store.ensure_task("task-1", "alice", T0)
    await store.append_event("task-1", "step", "alice", {}, T0, result={"ok": True})
    got, task = await store.get_ticket_and_task("t-1", "task-1")
    assert got == rec and len(got.reviews) == 1
    assert task is not None and task.id == "task-1" and task.task == await store.get_task("task-1")
    got, task = await store.get_ticket_and_task("t-1", "task-2")
    assert got == rec and task is not None and task.id == "task-2" and task.task is None
    assert await store.get_ticket_and_task("nope", "task-1") == (None, None)


async def test_ticket_duplicate_and_invalid_create(store: Store) -> None:
    await store.create_ticket(ticket())
    with pytest.raises(Conflict) as exc:
        await store.create_ticket(ticket(reason="other"))
    assert exc.value.reason == "duplicate_id"
    with pytest.raises(ValueError):
        await store.create_ticket(ticket("t-2", state="approved"))
    assert await store.get_ticket("t-2") is None


async def test_list_tickets_filters_and_pages_newest_first(store: Store) -> None:
    for i in range(7):
        await store.create_ticket(
            ticket(f"t-{i}", created_at=T0 + i // 2, env="prod" if i % 2 else "dev")
        )
    # Same created_at for pairs: the id breaks the tie, so pages never skip or repeat.
    seen: list[str] = []
    cursor: str | None = None
    while True:
        page, cursor = await store.list_tickets(limit=3, before=cursor)
        seen += [t.id for t in page]
        if cursor is None:
            break
    assert seen == ["t-6", "t-5", "t-4", "t-3", "t-2", "t-1", "t-0"]
    prod, cursor = await store.list_tickets(env="prod")
    assert [t.id for t in prod] == ["t-5", "t-3", "t-1"] and cursor is None
    await store.transition_ticket("t-3", ("pending",), "revoked", T0 + 9, "carol")
    revoked, _ = await store.list_tickets(state="revoked", subject_id="alice")
    assert [t.id for t in revoked] == ["t-3"]
    assert (await store.list_tickets(subject_id="mallory"))[0] == []
    with pytest.raises(ValueError):
        await store.list_tickets(before="not-a-cursor")


async def _ticket_in(store: Store, state: str) -> TicketRecord:
    """A ticket brought into ``state`` through the store's own operations."""
    if state == "approved":
        return await approved_ticket(store)
    await store.create_ticket(ticket())
    if state == "pending":
        got = await store.get_ticket("t-1")
        assert got is not None
        return got
    if state == "rejected":
        return await store.add_review("t-1", review(decision="reject"), "rejected", None, T0 + 10)
    if state in ("expired", "revoked"):
        return await store.transition_ticket("t-1", ("pending",), state, T0 + 10, "carol")
    assert state == "consumed"
    await store.add_review("t-1", review(), "approved", T0 + 900, T0 + 10)
    return await store.consume_ticket("t-1", **binding(ticket()))


@pytest.mark.parametrize("from_state", TICKET_STATES)
@pytest.mark.parametrize("to_state", TICKET_STATES)
async def test_every_transition(store: Store, from_state: str, to_state: str) -> None:
    before = await _ticket_in(store, from_state)
    assert before.state == from_state
    legal = to_state in TICKET_TRANSITIONS[from_state] and to_state not in ("approved", "consumed")
    if legal:
        after = await store.transition_ticket("t-1", (from_state,), to_state, T0 + 50, "carol")
        assert (after.state, after.closed_by, after.closed_at) == (to_state, "carol", T0 + 50)
        assert await store.get_ticket("t-1") == after
    else:
        # Illegal by the state machine, or reserved for add_review / consume_ticket.
        with pytest.raises(ValueError):
            await store.transition_ticket("t-1", (from_state,), to_state, T0 + 50, "carol")
        assert await store.get_ticket("t-1") == before


@pytest.mark.parametrize("actual", TICKET_STATES)
async def test_transition_conflicts_with_current_state(store: Store, actual: str) -> None:
    before = await _ticket_in(store, actual)
    if actual in ("pending", "approved"):
        after = await store.transition_ticket("t-1", ("pending", "approved"), "revoked", T0, "x")
        assert after.state == "revoked"
        return
    with pytest.raises(Conflict) as exc:
        await store.transition_ticket("t-1", ("pending", "approved"), "revoked", T0, "x")
    assert (exc.value.reason, exc.value.current_state) == ("state_conflict", actual)
    assert await store.get_ticket("t-1") == before
    with pytest.raises(NotFound):
        await store.transition_ticket("nope", ("pending",), "revoked", T0, "x")


async def test_review_quorum_and_duplicate(store: Store) -> None:
    await store.create_ticket(ticket(approval={"quorum": 2}))
    first = await store.add_review("t-1", review("bob"), None, None, T0 + 10)
    assert first.state == "pending" and [r.reviewer for r in first.reviews] == ["bob"]
    with pytest.raises(Conflict) as exc:
        # The same reviewer again, even claiming quorum: refused, and the approval rolled back.
        await store.add_review("t-1", review("bob", at=T0 + 11), "approved", T0 + 900, T0 + 11)
    assert exc.value.reason == "duplicate_review"
    assert await store.get_ticket("t-1") == first
    second = await store.add_review(
        "t-1", review("carol", at=T0 + 12), "approved", T0 + 900, T0 + 12
    )
    assert (second.state, second.approved_at, second.expires_at) == ("approved", T0 + 12, T0 + 900)
    assert [r.reviewer for r in second.reviews] == ["bob", "carol"]
    assert second.reviews[1] == review("carol", at=T0 + 12)


async def test_review_reject_closes(store: Store) -> None:
    await store.create_ticket(ticket())
    rec = await store.add_review("t-1", review("bob", "reject"), "rejected", None, T0 + 10)
    assert (rec.state, rec.closed_by, rec.closed_at) == ("rejected", "bob", T0 + 10)


async def test_review_conflicts(store: Store) -> None:
    with pytest.raises(NotFound):
        await store.add_review("nope", review(), None, None, T0)
    await approved_ticket(store)
    with pytest.raises(Conflict) as exc:
        await store.add_review("t-1", review("carol"), None, None, T0 + 20)
    assert (exc.value.reason, exc.value.current_state) == ("not_pending", "approved")
    await store.create_ticket(ticket("t-2"))
    with pytest.raises(Conflict) as exc:
        await store.add_review("t-2", review("carol"), "approved", T0 + 900, T0 + 600)
    assert exc.value.reason == "expired"
    got = await store.get_ticket("t-2")
    assert got is not None and got.state == "pending" and got.reviews == ()
    with pytest.raises(ValueError):
        await store.add_review("t-2", review(), "consumed", None, T0)
    with pytest.raises(ValueError):
        await store.add_review("t-2", review(), "approved", None, T0)


# -------------------------------------------------------------------------------- consumption


async def test_consume_then_replay(store: Store) -> None:
    await approved_ticket(store)
    rec = await store.consume_ticket("t-1", **binding(ticket()))
    assert (rec.state, rec.consumed_at, rec.consumed_correlation_id) == (
        "consumed",
        T0 + 30,
        "corr-1",
    )
    with pytest.raises(Conflict) as exc:
        await store.consume_ticket("t-1", **binding(ticket(), now=T0 + 31, correlation_id="c2"))
    assert exc.value.reason == "ticket_consumed"
    assert await store.get_ticket("t-1") == rec


async def test_consume_without_command_hash(store: Store) -> None:
    await approved_ticket(store, command_hash=None)
    rec = await store.consume_ticket("t-1", **binding(ticket(command_hash=None)))
    assert rec.state == "consumed"


async def test_consume_expired(store: Store) -> None:
    await approved_ticket(store)
    with pytest.raises(Conflict) as exc:
        await store.consume_ticket("t-1", **binding(ticket(), now=T0 + 900))  # at expires_at
    assert exc.value.reason == "ticket_expired"
    got = await store.get_ticket("t-1")
    assert got is not None and got.state == "approved"
    await store.expire_tickets(T0 + 901)
    with pytest.raises(Conflict) as exc:
        await store.consume_ticket("t-1", **binding(ticket(), now=T0 + 30))
    assert (exc.value.reason, exc.value.current_state) == ("ticket_expired", "expired")


@pytest.mark.parametrize("state", ["pending", "rejected", "revoked"])
async def test_consume_not_approved(store: Store, state: str) -> None:
    before = await _ticket_in(store, state)
    with pytest.raises(Conflict) as exc:
        await store.consume_ticket("t-1", **binding(ticket()))
    assert (exc.value.reason, exc.value.current_state) == ("ticket_not_approved", state)
    assert await store.get_ticket("t-1") == before


async def test_consume_unknown(store: Store) -> None:
    with pytest.raises(NotFound):
        await store.consume_ticket("nope", **binding(ticket()))


@pytest.mark.parametrize(
    ("field", "value", "stored_command_hash"),
    [
        pytest.param("nonce_hash", "sha256:" + "00" * 32, COMMAND_HASH, id="nonce"),
        pytest.param("subject_id", "mallory", COMMAND_HASH, id="subject"),
        pytest.param("env", "dev", COMMAND_HASH, id="env"),
        pytest.param("action", "databases.drop", COMMAND_HASH, id="action"),
        pytest.param("resource_hash", "sha256:" + "11" * 32, COMMAND_HASH, id="resource"),
        pytest.param("command_hash", "sha256:" + "22" * 32, COMMAND_HASH, id="command-other"),
        pytest.param("command_hash", None, COMMAND_HASH, id="command-missing"),
    ],
)
async def test_consume_binding_mismatch(
    store: Store, field: str, value: str | None, stored_command_hash: str | None
) -> None:
    rec = await approved_ticket(store, command_hash=stored_command_hash)
    with pytest.raises(Conflict) as exc:
        await store.consume_ticket("t-1", **binding(rec, **{field: value}))
    assert (exc.value.reason, exc.value.fields) == ("ticket_binding_mismatch", (field,))
    assert await store.get_ticket("t-1") == rec  # nothing consumed
    assert (await store.consume_ticket("t-1", **binding(rec))).state == "consumed"


async def test_a_ticket_that_binds_no_command_accepts_any(store: Store) -> None:
    """The request's Command-Hash matters only when the ticket binds one (the same rule as the
    chain's pre-check: approvals.binding.mismatched)."""
    rec = await approved_ticket(store, command_hash=None)
    consumed = await store.consume_ticket("t-1", **binding(rec, command_hash=COMMAND_HASH))
    assert consumed.state == "consumed"


async def test_binding_mismatch_names_every_field(store: Store) -> None:
    rec = await approved_ticket(store)
    with pytest.raises(Conflict) as exc:
        await store.consume_ticket("t-1", **binding(rec, env="dev", action="other"))
    assert exc.value.fields == ("env", "action")


async def test_expire_tickets(store: Store) -> None:
    await store.create_ticket(ticket("pending-old", pending_until=T0 + 100))
    await store.create_ticket(ticket("pending-new", pending_until=T0 + 10_000))
    await approved_ticket(store, "approved-old")  # expires_at T0 + 900
    await store.create_ticket(ticket("approved-new"))
    await store.add_review("approved-new", review(), "approved", T0 + 5000, T0 + 10)
    expired = await store.expire_tickets(T0 + 1000)
    assert sorted(t.id for t in expired) == ["approved-old", "pending-old"]
    assert all(t.state == "expired" and t.closed_at == T0 + 1000 for t in expired)
    assert await store.expire_tickets(T0 + 1000) == []
    states = {t.id: t.state for t in (await store.list_tickets())[0]}
    assert states == {
        "pending-old": "expired",
        "pending-new": "pending",
        "approved-old": "expired",
        "approved-new": "approved",
    }


# -------------------------------------------------------------------------------------- tasks


async def test_tasks_are_listed_by_state_oldest_first(store: Store) -> None:
    await store.ensure_task("b-later", "alice", T0 + 2)
    await store.ensure_task("a-earlier", "alice", T0 + 1)
    await store.ensure_task("c-running", "alice", T0)
    await store.append_event("c-running", "started", "ci-bot", {}, T0 + 3, state="running")
    assert [t.id for t in await store.list_tasks("pending")] == ["a-earlier", "b-later"]
    assert [t.id for t in await store.list_tasks("pending", limit=1)] == ["a-earlier"]
    assert [t.id for t in await store.list_tasks("running")] == ["c-running"]
    assert await store.list_tasks("failed") == []
    with pytest.raises(ValueError):
        await store.list_tasks("done")


async def test_tasks_and_events(store: Store) -> None:
    task = await store.ensure_task("task-1", "alice", T0)
    assert (task.state, task.progress, task.result, task.last_seq) == ("pending", 0, None, 0)
    assert await store.ensure_task("task-1", "bob", T0 + 5) == task  # create on first use only
    assert await store.get_task("nope") is None
    e1 = await store.append_event(
        "task-1", "started", "alice", {"step": 1}, T0 + 1, state="running"
    )
    e2 = await store.append_event("task-1", "progress", "alice", [1, 2], T0 + 2, progress=50)
    e3 = await store.append_event(
        "task-1", "finished", "alice", {}, T0 + 3, state="succeeded", progress=100,
        result={"ok": True, "rows": 3},
    )  # fmt: skip
    assert [e.seq for e in (e1, e2, e3)] == [1, 2, 3]
    got = await store.get_task("task-1")
    assert got is not None
    assert (got.state, got.progress, got.result, got.last_seq, got.updated_at) == (
        "succeeded", 100, {"ok": True, "rows": 3}, 3, T0 + 3,
    )  # fmt: skip
    assert got.created_by == "alice"
    assert await store.list_events("task-1") == [e1, e2, e3]
    assert await store.list_events("task-1", after_seq=1, limit=1) == [e2]
    with pytest.raises(NotFound):
        await store.append_event("nope", "x", "alice", {}, T0)
    with pytest.raises(ValueError):
        await store.append_event("task-1", "x", "alice", {}, T0, state="exploded")


async def test_the_first_executor_report_claims_the_task(store: Store) -> None:
    await store.ensure_task("task-1", "alice", T0)
    # An intent (no claimant) neither claims nor is refused.
    await store.append_event("task-1", "installer.run.requested", "alice", {}, T0)
    assert (await store.get_task("task-1")).claimed_by is None  # type: ignore[union-attr]
    await store.append_event("task-1", "started", "ci-bot", {}, T0 + 1, state="running",
                             claimant="ci-bot")
    await store.append_event("task-1", "progress", "ci-bot", {}, T0 + 2, progress=50,
                             claimant="ci-bot")
    with pytest.raises(Conflict) as refused:
        await store.append_event("task-1", "succeeded", "other-bot", {}, T0 + 3,
                                 state="succeeded", claimant="other-bot")
    assert (refused.value.reason, refused.value.current_state) == ("task_claimed", "running")
    task = await store.get_task("task-1")
    assert task is not None
    assert (task.state, task.progress, task.claimed_by, task.last_seq) == (
        "running", 50, "ci-bot", 3)
    with pytest.raises(NotFound):
        await store.append_event("nope", "started", "ci-bot", {}, T0, claimant="ci-bot")


# -------------------------------------------------------------------------------------- audit


async def test_audit_chain_links(store: Store) -> None:
    assert await store.audit_head() == (0, AUDIT_GENESIS_HASH)
    calls: list[tuple[int, str]] = []

    def recording_seal(seq: int, prev: str, entry: dict[str, object],
                       text: str | None = None) -> str:
        calls.append((seq, prev))
        return seal(seq, prev, entry, text)

    entries = [{"n": i, "who": "alice", "ratio": 0.1 + 0.2, "text": "ü"} for i in range(3)]
    recs = [await store.append_audit(e, recording_seal) for e in entries]
    assert [r.seq for r in recs] == [1, 2, 3]
    assert recs[0].prev_hash == AUDIT_GENESIS_HASH
    for prev, cur in itertools.pairwise(recs):
        assert cur.prev_hash == prev.hash
    for r in recs:
        assert r.hash == seal(r.seq, r.prev_hash, r.entry)
    assert calls == [(r.seq, r.prev_hash) for r in recs]
    stored = await store.audit_range()
    assert stored == recs and [r.entry for r in stored] == entries
    assert await store.audit_range(after_seq=1, limit=1) == [recs[1]]
    assert await store.audit_head() == (3, recs[-1].hash)


async def test_audit_append_many_continues_one_chain(store: Store) -> None:
    first = await store.append_audit({"n": 0}, seal)
    batch = await store.append_audit_many([{"n": i, "t": "ü"} for i in range(1, 6)], seal)
    after = await store.append_audit({"n": 6}, seal)
    chain = [first, *batch, after]
    assert [r.seq for r in chain] == list(range(1, 8))
    for prev, cur in itertools.pairwise(chain):
        assert cur.prev_hash == prev.hash
        assert cur.hash == seal(cur.seq, cur.prev_hash, cur.entry)
    assert await store.audit_range() == chain
    assert await store.audit_head() == (7, after.hash)
    assert await store.append_audit_many([], seal) == []


async def test_audit_append_many_seal_failure_appends_nothing(store: Store) -> None:
    def broken(seq: int, prev: str, entry: dict[str, object], text: str | None = None) -> str:
        raise RuntimeError("hsm down")

    with pytest.raises(RuntimeError):
        await store.append_audit_many([{"n": 1}, {"n": 2}], broken)
    assert await store.audit_head() == (0, AUDIT_GENESIS_HASH)
    assert await store.audit_range() == []


async def test_audit_seal_failure_appends_nothing(store: Store) -> None:
    first = await store.append_audit({"n": 1}, seal)

    def broken(seq: int, prev: str, entry: dict[str, object], text: str | None = None) -> str:
        raise RuntimeError("hsm down")

    with pytest.raises(RuntimeError):
        await store.append_audit({"n": 2}, broken)
    assert await store.audit_head() == (1, first.hash)
    second = await store.append_audit({"n": 2}, seal)
    assert (second.seq, second.prev_hash) == (2, first.hash)


async def test_staged_audit_records_join_the_chain_when_sealed(store: Store) -> None:
    first = await store.append_audit({"n": 0}, seal)
    async with store.transaction() as tx:
        a = await tx.stage_audit({"n": 1, "t": "ü"}, T0)
        b = await tx.stage_audit({"n": 2}, T0 + 1)
    with pytest.raises(RuntimeError):
        async with store.transaction() as tx:
            lost = await tx.stage_audit({"n": "rolled back"}, T0)
            raise RuntimeError("the run failed")
    # Staged, committed, not chained yet: the chain and its head do not show them.
    assert await store.audit_range() == [first]
    assert await store.audit_head() == (1, first.hash)
    assert await store.audit_staged(T0 + 10) == (2, T0)
    assert await store.audit_staged(T0) == (0, None)

    sealed = await store.seal_audit(seal, [b, a, lost])
    assert [staged for staged, _ in sealed] == [a, b]  # staging order; the rolled back one: none
    chain = [first, *(record for _, record in sealed)]
    assert [r.seq for r in chain] == [1, 2, 3]
    assert [r.entry for r in chain] == [{"n": 0}, {"n": 1, "t": "ü"}, {"n": 2}]
    for prev, cur in itertools.pairwise(chain):
        assert cur.prev_hash == prev.hash
        assert cur.hash == seal(cur.seq, cur.prev_hash, cur.entry)
    assert await store.audit_range() == chain
    assert await store.audit_head() == (3, chain[-1].hash)
    assert await store.audit_staged(T0 + 10) == (0, None)
    # Sealed once: asking again seals nothing, and direct appends continue the same chain.
    assert await store.seal_audit(seal, [a, b]) == []
    assert await store.seal_audit(seal) == []
    after = await store.append_audit({"n": 3}, seal)
    assert (after.seq, after.prev_hash) == (4, chain[-1].hash)
    # Inside a transaction, sealing commits with it (under the head's lock until COMMIT).
    c = await store.stage_audit({"n": 4}, T0)
    async with store.transaction() as tx:
        assert [(i, r.seq, r.prev_hash) for i, r in await tx.seal_audit(seal, [c])] == [
            (c, 5, after.hash)]
    assert [r.seq for r in await store.audit_range()] == [1, 2, 3, 4, 5]


async def test_sealing_staged_before_a_time_takes_only_older_rows(store: Store) -> None:
    old = [await store.stage_audit({"n": i}, T0 + i) for i in range(3)]
    young = await store.stage_audit({"n": 9}, T0 + 100)
    sealed = await store.seal_audit(seal, staged_before=T0 + 50, limit=2)
    assert [staged for staged, _ in sealed] == old[:2]
    sealed += await store.seal_audit(seal, staged_before=T0 + 50, limit=2)
    assert [staged for staged, _ in sealed] == old
    assert [r.seq for _, r in sealed] == [1, 2, 3]
    assert await store.audit_staged(T0 + 1000) == (1, T0 + 100)
    assert [staged for staged, _ in await store.seal_audit(seal, [young])] == [young]


async def test_a_seal_failure_seals_nothing_and_leaves_the_rows_staged(store: Store) -> None:
    def broken(seq: int, prev: str, entry: dict[str, object], text: str | None = None) -> str:
        raise RuntimeError("hsm down")

    staged = await store.stage_audit({"n": 1}, T0)
    with pytest.raises(RuntimeError):
        await store.seal_audit(broken, [staged])
    assert await store.audit_head() == (0, AUDIT_GENESIS_HASH)
    assert await store.audit_staged(T0 + 1) == (1, T0)
    assert [r.seq for _, r in await store.seal_audit(seal, [staged])] == [1]


async def test_audit_checkpoints_one_per_seq_in_order(store: Store) -> None:
    from service.store.base import AuditCheckpoint

    assert await store.latest_audit_checkpoint() is None
    assert await store.audit_checkpoints() == []
    cps = [AuditCheckpoint(seq, f"sha256:{seq:064x}", f"2026-01-01T00:00:0{seq}.000Z", "kid-1",
                           f"sig-{seq}") for seq in (5, 2, 9)]
    for cp in cps:
        assert await store.add_audit_checkpoint(cp) is True
    # Another worker checkpointing the same record: harmless, the first one stays.
    again = AuditCheckpoint(5, "sha256:" + "f" * 64, "2026-01-01T00:00:08.000Z", "kid-2", "other")
    assert await store.add_audit_checkpoint(again) is False
    ordered = sorted(cps, key=lambda c: c.seq)
    assert await store.audit_checkpoints() == ordered
    assert await store.audit_checkpoints(after_seq=2, limit=1) == [ordered[1]]
    assert await store.latest_audit_checkpoint() == ordered[-1]
    async with store.transaction() as tx:
        assert await tx.add_audit_checkpoint(AuditCheckpoint(11, "sha256:" + "1" * 64, "t", "k", "s"))
        assert (await tx.latest_audit_checkpoint() or again).seq == 11
    with pytest.raises(ValueError):
        await store.audit_checkpoints(limit=0)


# ------------------------------------------------------------------------------- transactions


async def test_concurrent_transactions_fail_alone(store: Store) -> None:
    """Many transactions at once (SQLite group-commits them): each commits or rolls back alone."""

    async def unit(i: int) -> None:
        async with store.transaction() as tx:
            await tx.ensure_task(f"t{i}", "alice", T0)
            await tx.append_event(f"t{i}", "x", "alice", {"i": i}, T0)
            await tx.append_audit({"i": i}, seal)
            if i % 3 == 0:
                raise RuntimeError("this one fails after writing")

    results = await asyncio.gather(*(unit(i) for i in range(30)), return_exceptions=True)
    failed = {i for i, r in enumerate(results) if isinstance(r, RuntimeError)}
    assert failed == {i for i in range(30) if i % 3 == 0}
    for i in range(30):
        task = await store.get_task(f"t{i}")
        assert (task is None) == (i in failed)
    records = await store.audit_range(0, 100)
    assert sorted(r.entry["i"] for r in records) == sorted(set(range(30)) - failed)
    assert [r.seq for r in records] == list(range(1, 21))
    for prev, cur in itertools.pairwise(records):
        assert cur.prev_hash == prev.hash


async def test_transaction_commits_together(store: Store) -> None:
    rec = await approved_ticket(store)
    await store.ensure_task("task-1", "alice", T0)
    async with store.transaction() as tx:
        consumed = await tx.consume_ticket("t-1", **binding(rec))
        await tx.append_event("task-1", "executed", "alice", {"ticket": "t-1"}, T0 + 30)
        await tx.append_audit({"ticket": consumed.id, "outcome": "executed"}, seal)
        assert (await tx.get_ticket("t-1")) == consumed  # the Tx sees its own writes
    got = await store.get_ticket("t-1")
    assert got is not None and got.state == "consumed"
    assert [e.seq for e in await store.list_events("task-1")] == [1]
    assert (await store.audit_head())[0] == 1


async def test_transaction_rolls_back_on_error(store: Store) -> None:
    rec = await approved_ticket(store)
    await store.ensure_task("task-1", "alice", T0)
    with pytest.raises(RuntimeError, match="execution failed"):
        async with store.transaction() as tx:
            await tx.consume_ticket("t-1", **binding(rec))
            await tx.append_event("task-1", "executed", "alice", {}, T0 + 30)
            await tx.append_audit({"ticket": "t-1"}, seal)
            raise RuntimeError("execution failed")
    assert await store.get_ticket("t-1") == rec  # still approved, still redeemable
    assert await store.list_events("task-1") == []
    task = await store.get_task("task-1")
    assert task is not None and task.last_seq == 0
    assert await store.audit_head() == (0, AUDIT_GENESIS_HASH)
    assert await store.audit_range() == []
    # The next attempt starts from a clean slate: seq 1 again, gap-free.
    async with store.transaction() as tx:
        await tx.consume_ticket("t-1", **binding(rec))
        assert (await tx.append_event("task-1", "executed", "alice", {}, T0 + 31)).seq == 1


async def test_transaction_object_is_dead_after_exit(store: Store) -> None:
    async with store.transaction() as tx:
        await tx.claim_once("jti", "x", T0 + 1, T0)
    with pytest.raises(StoreError):
        await tx.claim_once("jti", "y", T0 + 1, T0)
    with pytest.raises(StoreError):  # reads too: the connection may belong to someone else now
        await tx.get_session("s-1")


async def test_store_reads_do_not_wait_for_an_open_write_transaction(store: Store) -> None:
    """Store-level reads run outside the writers' lock and see only committed data."""
    await store.create_session(session())
    async with store.transaction() as tx:
        await tx.revoke_session("s-1", T0 + 5)
        got = await asyncio.wait_for(store.get_session("s-1"), timeout=2)
        assert got == session()  # the revocation is not committed yet
        assert await asyncio.wait_for(store.audit_head(), timeout=2) == (0, AUDIT_GENESIS_HASH)
    got = await store.get_session("s-1")
    assert got is not None and got.revoked_at == T0 + 5


async def test_conflict_inside_transaction_rolls_back_earlier_writes(store: Store) -> None:
    await approved_ticket(store)
    with pytest.raises(Conflict):
        async with store.transaction() as tx:
            await tx.create_session(session())
            await tx.consume_ticket("t-1", **binding(ticket(), env="dev"))
    assert await store.get_session("s-1") is None


async def test_records_are_frozen(store: Store) -> None:
    rec = await approved_ticket(store)
    with pytest.raises(AttributeError):
        rec.state = "consumed"  # type: ignore[misc]
    assert replace(rec, state="consumed").state == "consumed"
