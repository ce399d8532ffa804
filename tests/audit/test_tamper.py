"""The four rewrites an attacker with database access can make to the hash chain, on SQLite and
PostgreSQL, each against ``cpctl audit verify``.

Before signed checkpoints all four verified as intact (the chain is unkeyed: anyone can recompute
it). Now the chain is checked against checkpoints the service signed with a key that is not in
the database, and against an anchor file kept elsewhere.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from service import clock
from service.audit.checkpoint import sign, to_doc
from service.audit.checkpointer import Checkpointer
from service.audit.keys import AuditKeys
from service.audit.log import AuditLog
from service.cli import audit
from service.store import Store

from . import tamper
from .conftest import Target

RECORDS = 12
CHECKPOINTS = (4, 8, 12)  # where the service signed, in these tests


async def build_chain(store: Store, target: Target, mirror: Path | None = None) -> AuditLog:
    """12 records, as the service writes them, with signed checkpoints at 4, 8 and 12 (and the
    JSON-lines mirror of them all at ``mirror``)."""
    log = AuditLog(store, mirror)
    keys = AuditKeys.open(target.state_dir / "audit-keys", now=clock.now())
    checkpointer = Checkpointer(log, keys, every_records=1000, every_s=3600)
    log.observer = checkpointer
    for i in range(1, RECORDS + 1):
        record = await log.append({"action": "approvals.read", "outcome": "executed", "n": i})
        await log.mirror(record)
        if i in CHECKPOINTS:
            assert (await checkpointer.checkpoint(clock.now())) is not None
    assert [c.seq async for c in log.checkpoints()] == list(CHECKPOINTS)
    return log


async def verify(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    """``cpctl audit verify --json`` (in a thread: the command runs its own event loop)."""
    capsys.readouterr()
    code = await asyncio.to_thread(audit.run, ["verify", "--json", *argv])
    return code, json.loads(capsys.readouterr().out)


async def anchor_file(store: Store, path: Path) -> Path:
    """What an operator keeps off the host: the newest checkpoint (``cpctl audit checkpoint``)."""
    newest = await store.latest_audit_checkpoint()
    assert newest is not None
    await asyncio.to_thread(path.write_text, json.dumps(to_doc(newest)))
    return path


def span(result: dict[str, Any]) -> tuple[int, int] | None:
    gap = result["unverifiable"]
    return None if gap is None else (gap["first"], gap["last"])


async def test_an_untouched_chain_verifies_to_its_signed_head(
    store: Store, target: Target, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    await build_chain(store, target)
    head = await store.audit_head()
    code, result = await verify(capsys)
    assert code == 0, result
    assert result["status"] == "ok" and result["ok"] and result["problems"] == []
    assert result["verified_head"] == {"seq": 12, "hash": head[1]}
    assert (result["verified"], result["checkpoints"], span(result)) == (12, 3, None)
    code, result = await verify(capsys, "--anchor", str(await anchor_file(store, tmp_path / "a")))
    assert code == 0 and result["anchors"] == 1
    capsys.readouterr()
    assert await asyncio.to_thread(audit.run, ["verify"]) == 0
    assert capsys.readouterr().out.startswith(
        f"audit chain ok: 12 records verified (head seq 12); signed head: seq 12 {head[1]}")


# (rewrite, the first contradiction, the verified head, the unverifiable records, exit code)
REWRITES: dict[str, tuple[Any, tuple[int, str], int, tuple[int, int], int]] = {
    "edit+recompute": (lambda rows: tamper.edit_and_recompute(rows, 5),
                       (8, "checkpoint_mismatch"), 4, (5, 12), 1),
    "delete+renumber": (lambda rows: tamper.delete_and_renumber(rows, 5),
                        (8, "checkpoint_mismatch"), 4, (5, 11), 1),
    "truncate+fix head": (lambda rows: tamper.truncate(rows, 7),
                          (8, "checkpoint_beyond_end"), 4, (5, 7), 1),
    # Records after the newest checkpoint are not signed: named as unverifiable, exit 3.
    "forged append": (lambda rows: tamper.forged_append(rows, 2), None, 12, (13, 14), 3),
}


@pytest.mark.parametrize("kind", list(REWRITES))
async def test_a_rewritten_and_rehashed_chain_is_detected(
    store: Store, target: Target, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    rewrite, first, verified, unverifiable, exit_code = REWRITES[kind]
    await build_chain(store, target)
    attacker = tamper.Attacker(target)
    rows = rewrite(await attacker.rows())
    await attacker.write(rows)
    # The rewrite is internally consistent: the chain alone can no longer tell.
    assert await AuditLog(store).verify() == (len(rows), None)
    code, result = await verify(capsys)
    assert code == exit_code, result
    assert (result["break"] and (result["break"]["seq"], result["break"]["reason"])) == first
    assert result["verified_head"]["seq"] == verified
    assert span(result) == unverifiable
    capsys.readouterr()
    await asyncio.to_thread(audit.run, ["verify"])
    out = capsys.readouterr().out
    first_unverifiable, last = unverifiable
    assert f"records {first_unverifiable}..{last}" in out and "unverifiable" in out


# What the anchor must catch when the attacker also deleted the checkpoint rows (expected break).
ANCHORED: dict[str, tuple[Any, tuple[int, str] | None, int]] = {
    "edit+recompute": (lambda rows: tamper.edit_and_recompute(rows, 5), (12, "anchor_mismatch"), 1),
    "delete+renumber": (lambda rows: tamper.delete_and_renumber(rows, 5),
                        (12, "anchor_beyond_end"), 1),
    "truncate+fix head": (lambda rows: tamper.truncate(rows, 7), (12, "anchor_beyond_end"), 1),
    # The chain itself is intact: the deleted checkpoints, which the anchor shows were signed,
    # are the contradiction (deleting every checkpoint is no longer "not signed yet").
    "forged append": (lambda rows: tamper.forged_append(rows, 2), (12, "checkpoint_missing"), 1),
}


@pytest.mark.parametrize("kind", list(ANCHORED))
async def test_an_anchor_detects_it_when_the_checkpoints_are_gone_too(
    store: Store, target: Target, capsys: pytest.CaptureFixture[str], tmp_path: Path, kind: str
) -> None:
    rewrite, first, exit_code = ANCHORED[kind]
    await build_chain(store, target)
    anchor = await anchor_file(store, tmp_path / "anchor.json")
    attacker = tamper.Attacker(target)
    await attacker.write(rewrite(await attacker.rows()))
    await attacker.execute(["DELETE FROM audit_checkpoints"])
    # Without the anchor, nothing signed is left to contradict: only "unverifiable" remains.
    code, result = await verify(capsys)
    assert code == 3 and result["verified_head"] is None and result["problems"] == []
    code, result = await verify(capsys, "--anchor", str(anchor))
    assert code == exit_code, result
    assert (result["break"] and (result["break"]["seq"], result["break"]["reason"])) == first


async def test_forged_checkpoint_rows_do_not_verify(
    store: Store, target: Target, capsys: pytest.CaptureFixture[str]
) -> None:
    """Rewriting the chain and its checkpoint rows without the key: the signatures fail."""
    await build_chain(store, target)
    attacker = tamper.Attacker(target)
    rows = tamper.edit_and_recompute(await attacker.rows(), 5)
    await attacker.write(rows)
    await attacker.execute([("UPDATE audit_checkpoints SET head_hash = ? WHERE seq = ?", (r.hash, r.seq))
                            for r in (rows[7], rows[11])])
    code, result = await verify(capsys)
    assert code == 1
    assert [(p["seq"], p["reason"]) for p in result["problems"]] == [
        (8, "bad_signature"), (12, "bad_signature")]
    assert result["verified_head"]["seq"] == 4


async def test_with_the_audit_key_only_an_anchor_detects_it(
    store: Store, target: Target, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """An attacker who also holds the audit key re-signs the rewritten chain: the database is
    consistent again, and only a checkpoint kept outside it contradicts the rewrite."""
    await build_chain(store, target)
    anchor = await anchor_file(store, tmp_path / "anchor.json")
    attacker = tamper.Attacker(target)
    rows = tamper.edit_and_recompute(await attacker.rows(), 5)
    await attacker.write(rows)
    stolen = AuditKeys.load(target.state_dir / "audit-keys").signing_key()
    await attacker.execute(["DELETE FROM audit_checkpoints"])
    for seq in CHECKPOINTS:
        assert await store.add_audit_checkpoint(sign(stolen, seq, rows[seq - 1].hash, clock.now()))
    code, result = await verify(capsys)
    assert code == 0, result  # the limit of checkpoints alone: documented
    code, result = await verify(capsys, "--anchor", str(anchor))
    assert code == 1 and result["break"] == {"seq": 12, "reason": "anchor_mismatch"}


# The tail after the newest checkpoint (13, 14), then what the attacker does to it, the exit
# code and first break of ``verify`` without an anchor, then with the mirror as the anchor.
TAILS: dict[str, tuple[Any, tuple[int, tuple[int, str] | None], tuple[int, tuple[int, str]]]] = {
    # Rewritten, and then signed by a service that chained onto the forged head: laundered for
    # the checkpoints, not for the mirror, which holds record 13 as it was written.
    "rewritten, then signed": (lambda rows: tamper.edit_and_recompute(rows, 12), (0, None),
                               (1, (13, "mirror_mismatch"))),
    "rewritten": (lambda rows: tamper.edit_and_recompute(rows, 12), (3, None),
                  (1, (13, "mirror_mismatch"))),
    "removed": (lambda rows: tamper.truncate(rows, 12), (0, None), (1, (13, "mirror_beyond_end"))),
}


@pytest.mark.parametrize("kind", list(TAILS))
async def test_the_mirror_contradicts_a_rewritten_unsigned_tail(
    store: Store, target: Target, capsys: pytest.CaptureFixture[str], tmp_path: Path, kind: str
) -> None:
    rewrite, (plain, plain_break), (anchored, anchored_break) = TAILS[kind]
    mirror = tmp_path / "audit.jsonl"
    log = await build_chain(store, target, mirror)
    for i in (13, 14):  # not signed yet
        await log.mirror(await log.append({"action": "approvals.read", "outcome": "executed",
                                           "n": i}))
    attacker = tamper.Attacker(target)
    rows = rewrite(await attacker.rows())
    await attacker.write(rows)
    if kind.endswith("signed"):
        key = AuditKeys.load(target.state_dir / "audit-keys").signing_key()
        assert await store.add_audit_checkpoint(sign(key, 14, rows[13].hash, clock.now()))
    code, result = await verify(capsys)
    assert (code, result["break"] and (result["break"]["seq"], result["break"]["reason"])) == (
        plain, plain_break)
    code, result = await verify(capsys, "--anchor", str(mirror))
    assert code == anchored, result
    assert (result["break"]["seq"], result["break"]["reason"]) == anchored_break
    assert result["verified_head"]["seq"] == 12 and result["mirrored"] == 12


async def test_a_mirror_line_changed_is_not_evidence(
    store: Store, target: Target, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A record line whose hash is not its content's cannot contradict anything: the anchor
    cannot be read (exit 2), rather than a verdict on the chain."""
    mirror = tmp_path / "audit.jsonl"
    await build_chain(store, target, mirror)
    lines = mirror.read_text().splitlines()
    doc = json.loads(lines[0])
    lines[0] = json.dumps({**doc, "outcome": "denied"})
    mirror.write_text("\n".join(lines) + "\n")
    capsys.readouterr()
    code = await asyncio.to_thread(audit.run, ["verify", "--anchor", str(mirror)])
    assert code == 2
    assert "mirrored record 1: its hash is not its content's" in capsys.readouterr().err


async def test_checkpoints_an_anchor_shows_were_deleted_are_a_break(
    store: Store, target: Target, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Exit 3 ("not signed yet") is not what deleting checkpoints looks like when an anchor or
    the mirror shows they were signed: exit 1."""
    mirror = tmp_path / "audit.jsonl"
    await build_chain(store, target, mirror)
    await tamper.Attacker(target).execute(["DELETE FROM audit_checkpoints WHERE seq > 4"])
    code, result = await verify(capsys)
    assert code == 3 and result["verified_head"]["seq"] == 4
    code, result = await verify(capsys, "--anchor", str(mirror))
    assert code == 1 and [(p["seq"], p["reason"]) for p in result["problems"]] == [
        (8, "checkpoint_missing"), (12, "checkpoint_missing")]
