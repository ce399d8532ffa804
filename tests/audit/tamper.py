"""What an attacker with write access to the database (and nothing else) does to the audit chain.

The attacker reads every row, rewrites them in Python with the service's own public hash function
(the chain is unkeyed), and writes the table and the head row back, through a plain connection of
their own (``sqlite3`` / ``asyncpg``), never through the service.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, replace
from typing import Any

import asyncpg

from service.audit.record import seal
from service.store.base import AUDIT_GENESIS_HASH

from .conftest import Target


@dataclass(frozen=True)
class Row:
    seq: int
    prev_hash: str
    hash: str
    entry: dict[str, Any]


def rehash(rows: list[Row], start: int = 0) -> list[Row]:
    """Renumber from ``start`` on and recompute every link and hash from there (what the chain
    lets anyone do)."""
    out = rows[:start]
    prev = out[-1].hash if out else AUDIT_GENESIS_HASH
    for i, row in enumerate(rows[start:], start=start):
        seq = i + 1
        digest = seal(seq, prev, row.entry)
        out.append(Row(seq, prev, digest, row.entry))
        prev = digest
    return out


def edit_and_recompute(rows: list[Row], at: int) -> list[Row]:
    edited = replace(rows[at], entry={**rows[at].entry, "outcome": "denied", "status": 403})
    return rehash([*rows[:at], edited, *rows[at + 1:]], at)


def delete_and_renumber(rows: list[Row], at: int) -> list[Row]:
    return rehash([*rows[:at], *rows[at + 1:]], at)


def truncate(rows: list[Row], keep: int) -> list[Row]:
    return rows[:keep]


def forged_append(rows: list[Row], n: int = 2) -> list[Row]:
    forged = [Row(0, "", "", {"action": "approvals.review", "outcome": "executed", "forged": i})
              for i in range(n)]
    return rehash([*rows, *forged], len(rows))


class Attacker:
    """Direct database access to the chain's tables (and the checkpoints table, when asked)."""

    def __init__(self, target: Target) -> None:
        self.target = target

    async def _pg(self) -> asyncpg.Connection:
        assert self.target.schema is not None
        return await asyncpg.connect(self.target.url, timeout=5,
                                     server_settings={"search_path": self.target.schema})

    def _sqlite(self) -> sqlite3.Connection:
        return sqlite3.connect(self.target.state_dir / "controlplane.db")

    async def rows(self) -> list[Row]:
        sql = "SELECT seq, prev_hash, hash, entry FROM audit_log ORDER BY seq"
        if self.target.backend == "sqlite":
            with self._sqlite() as db:
                found = db.execute(sql).fetchall()
        else:
            conn = await self._pg()
            try:
                found = [tuple(r) for r in await conn.fetch(sql)]
            finally:
                await conn.close()
        return [Row(int(s), p, h, json.loads(e)) for s, p, h, e in found]

    async def write(self, rows: list[Row]) -> None:
        """Replace the whole chain with ``rows`` and point the head row at the last of them."""
        head = (rows[-1].seq, rows[-1].hash) if rows else (0, AUDIT_GENESIS_HASH)
        values = [(r.seq, r.prev_hash, r.hash, json.dumps(r.entry, sort_keys=True,
                                                           separators=(",", ":"))) for r in rows]
        await self.execute(
            ["DELETE FROM audit_log", ("UPDATE audit_head SET seq = ?, hash = ? WHERE id = 1", head)],
            insert=("INSERT INTO audit_log (seq, prev_hash, hash, entry) VALUES (?, ?, ?, ?)", values),
        )

    async def execute(self, statements: list[str | tuple[str, tuple[Any, ...]]],
                      insert: tuple[str, list[tuple[Any, ...]]] | None = None) -> None:
        """Run ``statements`` (SQL, or SQL with '?' arguments), then ``insert``, in one
        transaction."""
        steps = [(s, ()) if isinstance(s, str) else s for s in statements]
        if self.target.backend == "sqlite":
            with self._sqlite() as db:
                for sql, args in steps:
                    db.execute(sql, args)
                if insert:
                    db.executemany(*insert)
            return
        conn = await self._pg()
        try:
            async with conn.transaction():
                for sql, args in steps:
                    await conn.execute(_numbered(sql), *args)
                if insert:
                    await conn.executemany(_numbered(insert[0]), insert[1])
        finally:
            await conn.close()


def _numbered(sql: str) -> str:
    for i in range(1, sql.count("?") + 1):
        sql = sql.replace("?", f"${i}", 1)
    return sql
