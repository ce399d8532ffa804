"""The audit hash chain in SQL: the single ``audit_head`` row links and serialises appends; the
``audit_checkpoints`` table keeps the signed checkpoints (one per seq)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ..base import AuditCheckpoint, AuditRecord, Seal, StoreError
from .core import MAX_LIST_LIMIT, Row, Unit, dump_json

__all__ = ["AuditSql"]

_INSERT = "INSERT INTO audit_log (seq, prev_hash, hash, entry) VALUES (?, ?, ?, ?)"
# The record and the new head hash in one statement (dialects with writes in WITH).
_INSERT_AND_HEAD = (
    "WITH appended AS (INSERT INTO audit_log (seq, prev_hash, hash, entry) VALUES (?, ?, ?, ?)) "
    "UPDATE audit_head SET hash = ? WHERE id = 1"
)


class AuditSql(Unit):
    """``base.AuditOps`` over the ``audit_log`` and ``audit_head`` tables."""

    __slots__ = ()

    async def append_audit(self, entry: dict[str, Any], seal: Seal) -> AuditRecord:
        return (await self.append_audit_many([entry], seal))[0]

    async def append_audit_many(
        self, entries: Sequence[dict[str, Any]], seal: Seal
    ) -> list[AuditRecord]:
        if not entries:
            return []
        async with self._unit(write=True) as q:
            # Bumping the single head row both reserves the next len(entries) seqs and locks the
            # head until commit (a row lock on PostgreSQL, the write lock on SQLite): appends are
            # serialised across processes and replicas, and RETURNING still shows the previous
            # hash. Three round trips for a whole batch; two for one record on PostgreSQL, where
            # the record and the new head hash go in one statement (the lock is held from the
            # first statement to COMMIT, so each round trip saved shortens the global section).
            head = await q.one(
                "UPDATE audit_head SET seq = seq + ? WHERE id = 1 RETURNING seq, hash",
                len(entries),
            )
            if head is None:
                raise StoreError("audit head row missing")
            last, prev_hash = int(head["seq"]), str(head["hash"])
            records: list[AuditRecord] = []
            rows: list[tuple[Any, ...]] = []
            for seq, entry in enumerate(entries, start=last - len(entries) + 1):
                text = dump_json(entry)
                # Seal what will be read back, so verification recomputes from identical data.
                stored: dict[str, Any] = json.loads(text)
                digest = seal(seq, prev_hash, stored)
                records.append(AuditRecord(seq=seq, prev_hash=prev_hash, hash=digest, entry=stored))
                rows.append((seq, prev_hash, digest, text))
                prev_hash = digest
            if len(rows) == 1 and q.dialect.writes_in_cte:
                await q.exec(_INSERT_AND_HEAD, *rows[0], prev_hash)
                return records
            if len(rows) == 1:
                await q.exec(_INSERT, *rows[0])
            else:
                await q.exec_many(_INSERT, rows)
            await q.exec("UPDATE audit_head SET hash = ? WHERE id = 1", prev_hash)
        return records

    async def audit_range(self, after_seq: int = 0, limit: int = 100) -> list[AuditRecord]:
        if limit < 1:
            raise ValueError("limit must be positive")
        async with self._unit(write=False) as q:
            rows = await q.all(
                "SELECT seq, prev_hash, hash, entry FROM audit_log WHERE seq > ? "
                "ORDER BY seq LIMIT ?",
                after_seq, min(limit, MAX_LIST_LIMIT),
            )  # fmt: skip
        return [
            AuditRecord(
                seq=int(r["seq"]), prev_hash=r["prev_hash"], hash=r["hash"],
                entry=json.loads(r["entry"]),
            )
            for r in rows
        ]  # fmt: skip

    async def audit_head(self) -> tuple[int, str]:
        async with self._unit(write=False) as q:
            row = await q.one("SELECT seq, hash FROM audit_head WHERE id = 1")
        if row is None:
            raise StoreError("audit head row missing")
        return int(row["seq"]), str(row["hash"])

    async def add_audit_checkpoint(self, checkpoint: AuditCheckpoint) -> bool:
        async with self._unit(write=True) as q:
            row = await q.one(
                "INSERT INTO audit_checkpoints (seq, head_hash, at, kid, sig) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT (seq) DO NOTHING RETURNING seq",
                checkpoint.seq, checkpoint.head_hash, checkpoint.at, checkpoint.kid, checkpoint.sig,
            )  # fmt: skip
        return row is not None

    async def audit_checkpoints(
        self, after_seq: int = 0, limit: int = 100
    ) -> list[AuditCheckpoint]:
        if limit < 1:
            raise ValueError("limit must be positive")
        async with self._unit(write=False) as q:
            rows = await q.all(
                "SELECT seq, head_hash, at, kid, sig FROM audit_checkpoints WHERE seq > ? "
                "ORDER BY seq LIMIT ?",
                after_seq, min(limit, MAX_LIST_LIMIT),
            )  # fmt: skip
        return [_checkpoint(r) for r in rows]

    async def latest_audit_checkpoint(self) -> AuditCheckpoint | None:
        async with self._unit(write=False) as q:
            row = await q.one(
                "SELECT seq, head_hash, at, kid, sig FROM audit_checkpoints "
                "ORDER BY seq DESC LIMIT 1"
            )
        return None if row is None else _checkpoint(row)


def _checkpoint(row: Row) -> AuditCheckpoint:
    return AuditCheckpoint(seq=int(row["seq"]), head_hash=str(row["head_hash"]), at=str(row["at"]),
                           kid=str(row["kid"]), sig=str(row["sig"]))

