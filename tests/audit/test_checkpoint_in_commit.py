"""A checkpoint due when a group commit moves the head is signed and stored in that commit's
transaction (``store.base.CheckpointSigner``, ``Checkpointer.due`` / ``sign``): it commits, or
not, with the records it covers, and costs no transaction of its own.

Workers are ``AuditLog``s of their own on one store, wired as the service wires them. SQLite's
group commits hold the head's lock in a transaction; PostgreSQL's first try optimistic appends
that commit without one (checkpointed after they committed, as before: the last test) and take
the lock in a transaction only after losing races, which the other tests force there.
"""

from __future__ import annotations

import asyncio

import pytest

from service import clock
from service.audit.checkpoint import signature_ok
from service.audit.checkpointer import Checkpointer
from service.audit.keys import AuditKeyError, AuditKeys
from service.audit.log import AuditLog
from service.audit.record import seal
from service.store import Store
from service.store.base import AuditCheckpoint, AuditRecord, StoreError
from service.store.sql import audit as sql_audit

from .conftest import Target

EVERY = 5


def worker(store: Store, target: Target, name: str) -> tuple[AuditLog, Checkpointer]:
    log = AuditLog(store)
    keys = AuditKeys.open(target.state_dir / "audit-keys", now=clock.now())
    checkpointer = Checkpointer(log, keys, every_records=EVERY, every_s=3600)
    log.observer, log.trusted_keys = checkpointer, keys.public_keys
    return log, checkpointer


async def group_commit(log: AuditLog, n: int, who: str) -> list[AuditRecord]:
    """``n`` records appended at once: one group commit (the batch holds them all)."""
    return list(await asyncio.gather(*(
        log.append({"action": "databases.list", "outcome": "executed", "worker": who, "i": i})
        for i in range(n))))


@pytest.fixture
def under_the_lock(target: Target, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every group commit in a transaction under the head's lock (on PostgreSQL, as after its
    optimistic attempts lost their races)."""
    if target.backend == "postgres":
        monkeypatch.setattr(sql_audit, "_SWAP_ATTEMPTS", 0)


in_commit = pytest.mark.usefixtures("under_the_lock")
postgres = pytest.mark.parametrize(
    "target", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True)


@in_commit
async def test_a_group_commit_stores_the_checkpoint_due_with_its_records(
        store: Store, target: Target) -> None:
    log, checkpointer = worker(store, target, "a")
    records = await group_commit(log, 7, "a")
    assert [r.seq for r in records] == list(range(1, 8))
    # Stored by the commit itself: no record was mirrored, nothing ran in the background.
    assert checkpointer._task is None
    [checkpoint] = await store.audit_checkpoints()
    assert (checkpoint.seq, checkpoint.head_hash) == (7, records[-1].hash)
    assert signature_ok(checkpoint, checkpointer.keys.public_keys()[checkpoint.kid])
    for record in records:  # as the runs' recordings tell it, once answered
        await log.mirror(record)
    await asyncio.sleep(0)
    assert checkpointer._task is None  # covered: no second checkpoint of the same records
    assert len(await store.audit_checkpoints()) == 1


@in_commit
async def test_a_newer_checkpoint_of_another_worker_covers_the_head(
        store: Store, target: Target) -> None:
    a, _ = worker(store, target, "a")
    b, b_checkpointer = worker(store, target, "b")
    await group_commit(a, 6, "a")  # A signs record 6
    await group_commit(b, 3, "b")  # 7..9: due by B's count, not by the stored checkpoint
    assert [c.seq for c in await store.audit_checkpoints()] == [6]
    records = await group_commit(b, 2, "b")  # 10, 11: five past 6
    assert [c.seq for c in await store.audit_checkpoints()] == [6, 11]
    assert (await store.audit_checkpoints())[-1].head_hash == records[-1].hash
    assert b_checkpointer._task is None


class _Unstorable:
    """Signs a checkpoint the store refuses (a NOT NULL column left empty)."""

    def __init__(self) -> None:
        self.asked: list[int] = []
        self.refusals: list[tuple[int, StoreError]] = []

    def due(self, seq: int) -> bool:
        self.asked.append(seq)
        return True

    def sign(self, seq: int, head_hash: str, covered: int) -> AuditCheckpoint:
        return AuditCheckpoint(seq=seq, head_hash=head_hash, at=clock.iso(clock.now()) or "",
                               kid=None, sig="x")  # type: ignore[arg-type]

    def refused(self, checkpoint: AuditCheckpoint, error: StoreError) -> None:
        self.refusals.append((checkpoint.seq, error))


@in_commit
async def test_a_checkpoint_the_store_refuses_never_takes_its_records_down(
        store: Store, target: Target) -> None:
    await store.append_audit_many([{"n": 0}], seal)
    signer = _Unstorable()
    records = await store.append_audit_many([{"n": 1}, {"n": 2}], seal, checkpoint=signer)
    assert signer.asked == [3]  # asked once, for the head the batch moves to
    assert [seq for seq, _ in signer.refusals] == [3]
    assert await store.audit_head() == (3, records[-1].hash)  # the records committed
    assert await store.audit_checkpoints() == []
    # The transaction went on after the savepoint: the next batch appends as usual.
    assert [r.seq for r in await store.append_audit_many([{"n": 3}], seal)] == [4]


@postgres
async def test_an_optimistic_append_is_checkpointed_after_it_committed(
        store: Store, target: Target) -> None:
    log, checkpointer = worker(store, target, "a")
    signer = Checkpointer.sign
    signed_in: list[int] = []
    checkpointer.sign = lambda *a: signed_in.append(a[0]) or signer(checkpointer, *a)  # type: ignore[method-assign]
    records = await group_commit(log, 7, "a")
    assert signed_in == []  # not asked: no transaction to store it in
    # The batch told the checkpointer once it committed: its own task checkpoints the records.
    assert checkpointer._task is not None
    await checkpointer._task
    [checkpoint] = await store.audit_checkpoints()
    assert (checkpoint.seq, checkpoint.head_hash) == (7, records[-1].hash)


@in_commit
async def test_a_checkpoint_that_cannot_be_signed_never_fails_the_commit(
        store: Store, target: Target, monkeypatch: pytest.MonkeyPatch) -> None:
    log, checkpointer = worker(store, target, "a")

    def retired() -> None:
        raise AuditKeyError("audit key k1 is retired: it cannot sign")

    monkeypatch.setattr(checkpointer.keys, "signing_key", retired)
    records = await group_commit(log, 7, "a")
    assert await store.audit_head() == (7, records[-1].hash)
    assert await store.audit_checkpoints() == []
