"""A worker's verified tip of the chain (``audit.tip``), on SQLite and PostgreSQL, against an
attacker who rewrites the unsigned tail in the database and recomputes every hash after it.

Several workers append to one chain: each is an ``AuditLog`` of its own on the same store, as
the worker processes and replicas of a deployment are. Each mirrors to the same JSON-lines file.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from service import clock
from service.audit.checkpointer import Checkpointer
from service.audit.keys import AuditKeys
from service.audit.log import AuditLog
from service.audit.record import verify as record_verify
from service.audit.tip import AuditTampered
from service.cli import audit
from service.store import Store
from service.store.base import AuditRecord
from service.store.sql import audit as sql_audit
from service.store.sql.core import Query

from . import tamper
from .conftest import Target


def worker(store: Store, target: Target, mirror: Path) -> tuple[AuditLog, Checkpointer]:
    """One worker as the service wires it: a log trusting this replica's audit keys, and its
    checkpointer (signing only when asked, in these tests)."""
    log = AuditLog(store, mirror)
    keys = AuditKeys.open(target.state_dir / "audit-keys", now=clock.now())
    checkpointer = Checkpointer(log, keys, every_records=1000, every_s=3600)
    log.observer, log.trusted_keys = checkpointer, keys.public_keys
    return log, checkpointer


async def write(log: AuditLog, n: int, who: str) -> list[AuditRecord]:
    """``n`` records committed and mirrored, as a run's recording does."""
    records = []
    for i in range(n):
        record = await log.append({"action": "approvals.read", "outcome": "executed",
                                   "worker": who, "i": i})
        await log.mirror(record)
        records.append(record)
    return records


async def rewrite_from(target: Target, seq: int) -> None:
    """Edit record ``seq`` and recompute the chain from it to the head (checkpoints untouched)."""
    attacker = tamper.Attacker(target)
    await attacker.write(tamper.edit_and_recompute(await attacker.rows(), seq - 1))


async def verify(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    capsys.readouterr()
    code = await asyncio.to_thread(audit.run, ["verify", "--json", *argv])
    return code, json.loads(capsys.readouterr().out)


def alarms(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [r.fields for r in caplog.records  # type: ignore[attr-defined]
            if getattr(r, "fields", {}).get("event") == "audit.chain_tampered"]


async def test_a_worker_neither_extends_nor_signs_its_rewritten_tail(
    store: Store, target: Target, tmp_path: Path, caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    mirror = tmp_path / "audit.jsonl"
    log, checkpointer = worker(store, target, mirror)
    await write(log, 4, "a")
    assert (await checkpointer.checkpoint(clock.now())) is not None  # signed up to 4
    await write(log, 3, "a")  # 5..7: the unsigned tail
    await rewrite_from(target, 5)
    with caplog.at_level(logging.ERROR, logger="controlplane.audit"):
        with pytest.raises(AuditTampered):
            await log.append({"action": "approvals.read", "outcome": "executed"})
        assert await store.audit_head() == (7, (await tamper.Attacker(target).rows())[-1].hash)
        assert await checkpointer.checkpoint(clock.now()) is None
        if store.stages_audit:  # PostgreSQL: a run's staged record is not sealed onto it either
            async with store.transaction() as tx:
                staged = await log.stage({"action": "approvals.create", "outcome": "executed"}, tx)
            with pytest.raises(AuditTampered):
                await log.settle(staged)
        with pytest.raises(AuditTampered):
            await log.sweep(clock.now() + 3600)
        with pytest.raises(AuditTampered):  # refused from now on, whatever the head
            await log.append({"action": "approvals.read", "outcome": "executed"})
    assert not log.tip.ok
    assert [(a["seq"], a["reason"], a["known_seq"]) for a in alarms(caplog)] == [
        (7, "record_changed", 7)]  # one alarm
    assert (await store.latest_audit_checkpoint()).seq == 4  # type: ignore[union-attr]
    code, result = await verify(capsys, "--anchor", str(mirror))
    assert code == 1 and result["break"] == {"seq": 5, "reason": "mirror_mismatch"}


async def test_workers_verify_each_others_records_without_a_false_alarm(
    store: Store, target: Target, tmp_path: Path, caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    mirror = tmp_path / "audit.jsonl"
    (a, a_signs), (b, b_signs) = worker(store, target, mirror), worker(store, target, mirror)
    with caplog.at_level(logging.ERROR, logger="controlplane.audit"):
        for _ in range(3):
            await write(a, 2, "a")
            await write(b, 3, "b")
            assert await a_signs.checkpoint(clock.now()) is not None
            await asyncio.gather(write(a, 2, "a"), write(b, 2, "b"))
            assert await b_signs.checkpoint(clock.now()) is not None
        # Whichever wrote last signs the head.
        await a_signs.checkpoint(clock.now())
        await b_signs.checkpoint(clock.now())
    assert alarms(caplog) == [] and a.tip.ok and b.tip.ok
    head = await store.audit_head()
    assert await b.catch_up() == head and await a.catch_up() == head
    code, result = await verify(capsys, "--anchor", str(mirror))
    assert code == 0, result
    assert result["mirrored"] == head[0] == 27


async def test_a_rewrite_from_before_a_workers_tip_is_found(
    store: Store, target: Target, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Records of another worker that this one verified before appending its own are part of
    what it knows: rewriting them changes the record at its tip."""
    mirror = tmp_path / "audit.jsonl"
    (a, a_signs), (b, _) = worker(store, target, mirror), worker(store, target, mirror)
    await write(a, 4, "a")
    assert await a_signs.checkpoint(clock.now()) is not None
    await write(b, 3, "b")  # 5..7
    await write(a, 1, "a")  # 8: a verified 5..7 first
    await rewrite_from(target, 6)
    with caplog.at_level(logging.ERROR, logger="controlplane.audit"):
        with pytest.raises(AuditTampered):
            await a.append({"action": "approvals.read", "outcome": "executed"})
        with pytest.raises(AuditTampered):
            await b.append({"action": "approvals.read", "outcome": "executed"})
    assert [(x["seq"], x["known_seq"]) for x in alarms(caplog)] == [(8, 8), (7, 7)]


async def test_catching_up_reads_records_as_stored_and_finds_an_edit_among_them(
    store: Store, target: Target, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The walk to the head (the checkpointer's, before it signs) reads other workers' records
    as their stored text, not decoded, and still finds one edited in place."""
    mirror = tmp_path / "audit.jsonl"
    (a, _), (b, _) = worker(store, target, mirror), worker(store, target, mirror)
    await write(a, 2, "a")
    await write(b, 3, "b")  # 3..5
    assert await a.catch_up() == await store.audit_head()
    assert all(r.entry == {} and r.text for r in await store.audit_range(decoded=False))
    await write(b, 3, "b")  # 6..8: a has not seen them
    edited = json.dumps({"action": "approvals.read", "outcome": "executed", "worker": "mallory",
                         "i": 1}, sort_keys=True, separators=(",", ":"))
    await tamper.Attacker(target).execute([("UPDATE audit_log SET entry = ? WHERE seq = ?",
                                            (edited, 7))])
    with caplog.at_level(logging.ERROR, logger="controlplane.audit"):
        with pytest.raises(AuditTampered):
            await a.catch_up()
    assert [(x["seq"], x["reason"]) for x in alarms(caplog)] == [(7, "hash_mismatch")]


async def test_a_rewrite_no_worker_can_see_is_named_by_the_mirror(
    store: Store, target: Target, tmp_path: Path, caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The residual: records worker b wrote after worker a's tip, rewritten before a read them,
    verify from a's tip like genuine ones; a extends and signs them. b refuses its next append
    (its own record changed), and the mirror names the rewritten record."""
    mirror = tmp_path / "audit.jsonl"
    (a, a_signs), (b, _) = worker(store, target, mirror), worker(store, target, mirror)
    await write(a, 4, "a")
    assert await a_signs.checkpoint(clock.now()) is not None
    await write(b, 3, "b")  # 5..7, after a's tip
    await rewrite_from(target, 6)
    await write(a, 1, "a")  # 8: accepted, and signed
    assert (await a_signs.checkpoint(clock.now())).seq == 8  # type: ignore[union-attr]
    with caplog.at_level(logging.ERROR, logger="controlplane.audit"):
        with pytest.raises(AuditTampered):
            await b.append({"action": "approvals.read", "outcome": "executed"})
    assert [x["seq"] for x in alarms(caplog)] == [7]
    code, result = await verify(capsys)
    assert code == 0, result  # the signatures alone cannot tell
    code, result = await verify(capsys, "--anchor", str(mirror))
    assert code == 1 and result["break"] == {"seq": 6, "reason": "mirror_mismatch"}
    assert result["verified_head"]["seq"] == 4


async def test_a_worker_starts_from_the_newest_signed_checkpoint(
    store: Store, target: Target, tmp_path: Path
) -> None:
    """A worker that just started knows the newest checkpoint its keys verify, not the head the
    database shows: a rewrite that reaches back into the signed records is refused."""
    mirror = tmp_path / "audit.jsonl"
    first, signs = worker(store, target, mirror)
    await write(first, 4, "a")
    assert await signs.checkpoint(clock.now()) is not None
    await write(first, 2, "a")
    await rewrite_from(target, 3)
    restarted, _ = worker(store, target, mirror)
    with pytest.raises(AuditTampered):
        await restarted.append({"action": "approvals.read", "outcome": "executed"})
    await tamper.Attacker(target).execute([
        ("UPDATE audit_checkpoints SET head_hash = ? WHERE seq = 4",
         ((await tamper.Attacker(target).rows())[3].hash,))])
    forged, _ = worker(store, target, mirror)  # the checkpoint row no longer verifies
    with pytest.raises(AuditTampered):
        await forged.append({"action": "approvals.read", "outcome": "executed"})


async def test_appends_in_a_transaction_that_rolls_back_raise_no_alarm(
    store: Store, target: Target, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A transaction's second append verifies the first one's uncommitted record: the tip must
    not move onto it before it is committed, or the rollback would look like a deleted record."""
    log, _ = worker(store, target, tmp_path / "audit.jsonl")
    await write(log, 2, "a")
    entry = {"action": "approvals.expire", "outcome": "executed"}
    with caplog.at_level(logging.ERROR, logger="controlplane.audit"):
        with pytest.raises(RuntimeError):
            async with store.transaction() as tx:
                await log.append(entry, tx)
                await log.append(entry, tx)
                raise RuntimeError("the run failed: its transaction rolls back")
        await write(log, 2, "a")
        async with store.transaction() as tx:
            records = [await log.append(entry, tx) for _ in range(3)]
        await log.mirror_many(records)  # committed: the tip moves along them
        assert log.tip.known == await store.audit_head() == (7, records[-1].hash)
        await write(log, 1, "a")
        assert await log.catch_up() == await store.audit_head()
    assert alarms(caplog) == [] and log.tip.ok


async def test_a_transactions_appends_verify_only_what_is_new_and_a_stale_note_is_dropped(
    store: Store, target: Target, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Each append in one transaction starts from the head the previous one verified (not from
    the tip: that would re-read every record since it, for every append); a noted head whose
    transaction rolled back is dropped and the append verifies from the tip, with no alarm."""

    log, _ = worker(store, target, tmp_path / "audit.jsonl")
    other, _ = worker(store, target, tmp_path / "audit.jsonl")
    await write(log, 1, "a")
    await write(other, 3, "b")  # records 2..4, which ``log`` has not seen
    read: list[tuple[int, int]] = []
    real = sql_audit._vouch

    class Counted:
        """The guard, noting every start it gives (the store reads from there to the head)."""

        def __init__(self, guard: Any) -> None:
            self.guard = guard

        def since(self, head: tuple[int, str]) -> tuple[int, str] | None:
            start = self.guard.since(head)
            if start is not None:
                read.append((start[0], head[0]))
            return start

        def vouch(self, *args: Any) -> None:
            self.guard.vouch(*args)

    async def counting(q, head, guard, read=None):
        await real(q, head, None if guard is None else Counted(guard), read)

    entry = {"action": "approvals.expire", "outcome": "executed"}
    sql_audit._vouch = counting
    try:
        with caplog.at_level(logging.ERROR, logger="controlplane.audit"):
            async with store.transaction() as tx:
                records = [await log.append(entry, tx) for _ in range(4)]
            # The first append verifies 1..4; each later one only the record before it.
            assert read == [(1, 4), (4, 5), (5, 6), (6, 7)]
            await log.mirror_many(records)
            assert log.tip.known == (8, records[-1].hash)
            # A transaction that rolls back leaves notes of heads that never committed.
            with pytest.raises(RuntimeError):
                async with store.transaction() as tx:
                    await log.append(entry, tx)
                    await log.append(entry, tx)  # notes head 9, its own uncommitted record
                    raise RuntimeError("rolled back")
            await write(other, 2, "b")  # 9 and 10 are now other records
            read.clear()
            async with store.transaction() as tx:
                await log.append(entry, tx)
            assert read[0] == (9, 10)  # the stale note first, then from the tip
            assert read[1] == (8, 10)
    finally:
        sql_audit._vouch = real
    assert alarms(caplog) == [] and log.tip.ok


@pytest.mark.postgres
@pytest.mark.parametrize("target", ["postgres"], indirect=True)  # SQLite stages nothing
async def test_a_sealing_batch_reads_what_it_vouches_for_with_the_head(
    store: Store, target: Target, tmp_path: Path, caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """PostgreSQL seals staged records optimistically: the records another worker appended
    since this worker's tip come with the head and the staged rows, in one statement (no read
    of their own), and a change to one the tip knew is still found."""
    assert store.stages_audit
    sent: list[str] = []
    real_all = Query.all

    async def all_(self: Query, sql: str, *args: Any) -> Any:
        sent.append(sql)
        return await real_all(self, sql, *args)

    monkeypatch.setattr(Query, "all", all_)
    mirror = tmp_path / "audit.jsonl"
    (a, _), (b, _) = worker(store, target, mirror), worker(store, target, mirror)

    async def run(log: AuditLog) -> AuditRecord | None:
        async with store.transaction() as tx:
            staged = await log.stage({"action": "installer.run", "outcome": "executed"}, tx)
        return await log.settle(staged)

    await write(b, 1, "b")
    await write(a, 3, "a")  # 2..4, which b has not seen
    sent.clear()
    sealed = await run(b)
    assert sealed is not None and sealed.seq == 5 and b.tip.known == (5, sealed.hash)
    assert not any(sql == sql_audit._SINCE for sql in sent)
    assert any("UNION ALL" in sql for sql in sent)
    await write(a, 2, "a")  # 6, 7
    await rewrite_from(target, 5)  # b's own record, and every hash after it
    with caplog.at_level(logging.ERROR, logger="controlplane.audit"):
        with pytest.raises(AuditTampered):
            await run(b)
    assert [(x["seq"], x["reason"]) for x in alarms(caplog)] == [(5, "record_changed")]


@pytest.mark.postgres
@pytest.mark.parametrize("target", ["postgres"], indirect=True)  # SQLite: one writer a file
async def test_a_group_commit_appends_without_holding_the_heads_lock(
    store: Store, target: Target, tmp_path: Path, caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Records appended outside a caller's transaction (the group commit of reads and
    refusals) join the chain as sealing does on PostgreSQL: the head read without a lock, then
    one statement that appends only if the head is still that one. Two workers racing lose
    swaps and try again; the chain they leave verifies, with no alarm."""
    sent: list[str] = []
    real_all, real_one = Query.all, Query.one

    async def all_(self: Query, sql: str, *args: Any) -> Any:
        sent.append(sql)
        return await real_all(self, sql, *args)

    async def one(self: Query, sql: str, *args: Any) -> Any:
        sent.append(sql)
        return await real_one(self, sql, *args)

    monkeypatch.setattr(Query, "all", all_)
    monkeypatch.setattr(Query, "one", one)
    mirror = tmp_path / "audit.jsonl"
    (a, _), (b, _) = worker(store, target, mirror), worker(store, target, mirror)
    await write(a, 2, "a")
    await write(b, 2, "b")
    sent.clear()
    entry = {"action": "databases.list", "outcome": "executed"}
    with caplog.at_level(logging.ERROR, logger="controlplane.audit"):
        for _ in range(3):
            await asyncio.gather(*(a.append(entry) for _ in range(4)),
                                 *(b.append(entry) for _ in range(4)))
    assert sent and sql_audit._LOCK_HEAD not in sent and sql_audit._SWAP in sent
    assert alarms(caplog) == [] and a.tip.ok and b.tip.ok
    chain = await store.audit_range(limit=100)
    assert [r.seq for r in chain] == list(range(1, 29))
    assert record_verify(chain) == (28, None)
