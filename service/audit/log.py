"""The audit log: append sealed records through the store, verify the chain, mirror to JSON lines.

Records are appended inside the caller's transaction when there is one, so a mutation, its
ticket consumption and its audit record commit together (or none does). Records of runs that
change nothing (reads, refusals) are group-committed: they queue while a commit is in flight and
the next commit writes them all, so a durable commit is shared by many requests instead of
paid by each. Every caller still waits until its own record is committed. The optional
JSON-lines sink is written after commit; it is a copy for log shippers, the store is the record.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from ..store.base import AUDIT_GENESIS_HASH, AuditRecord, Store, Tx
from .record import Break, scrub, seal, verify

__all__ = ["AuditLog"]

log = logging.getLogger("controlplane.audit")

#: The most records one group commit writes; more wait for the next one.
MAX_BATCH = 256


class AuditLog:
    """Appends and reads the hash-chained audit log kept in the store."""

    def __init__(self, store: Store | Callable[[], Store], jsonl_path: Path | None = None):
        # A callable resolves the store per call (the service's link, which raises
        # StoreUnavailable while the store is not connected); tools and tests pass a store.
        self._store = store if callable(store) else (lambda: store)
        self.jsonl_path = jsonl_path
        self._sink_lock = asyncio.Lock()
        self._pending: list[tuple[dict[str, Any], asyncio.Future[AuditRecord]]] = []
        self._flusher: asyncio.Task[None] | None = None

    @property
    def store(self) -> Store:
        return self._store()

    async def append(self, entry: dict[str, Any], tx: Tx | None = None) -> AuditRecord:
        """Seal and append ``entry`` (scrubbed of credentials): in ``tx`` when given, else in the
        next group commit. Returns once the record is committed; raises what the commit raised."""
        if tx is not None:
            return await tx.append_audit(scrub(entry), seal)
        future: asyncio.Future[AuditRecord] = asyncio.get_running_loop().create_future()
        self._pending.append((scrub(entry), future))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush())
        # shield: a caller that goes away must not cancel the commit others are waiting for.
        return await asyncio.shield(future)

    async def _flush(self) -> None:
        while self._pending:
            batch, self._pending = self._pending[:MAX_BATCH], self._pending[MAX_BATCH:]
            try:
                records = await self.store.append_audit_many([e for e, _ in batch], seal)
            except Exception as exc:
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            for (_, future), record in zip(batch, records, strict=True):
                if not future.done():
                    future.set_result(record)

    async def mirror(self, record: AuditRecord) -> None:
        """Copy a committed record to the JSON-lines sink (best effort: the store is the record)."""
        if self.jsonl_path is None:
            return
        line = json.dumps(
            {"seq": record.seq, "prev_hash": record.prev_hash, "hash": record.hash, **record.entry},
            separators=(",", ":"),
        )
        async with self._sink_lock:
            try:
                await asyncio.to_thread(_append_line, self.jsonl_path, line)
            except OSError as exc:
                log.error("audit sink write failed", extra={"fields": {"error": exc.strerror}})

    async def records(self, after_seq: int = 0, page: int = 500) -> AsyncIterator[AuditRecord]:
        """Every record after ``after_seq``, in order, fetched a page at a time."""
        while True:
            batch = await self.store.audit_range(after_seq=after_seq, limit=page)
            for record in batch:
                yield record
            if len(batch) < page:
                return
            after_seq = batch[-1].seq

    async def verify(self) -> tuple[int, Break | None]:
        """Walk the whole chain; return (records verified, first break or None).

        The head is read first: records appended during the walk are verified too, and a chain
        that ends before the recorded head (rows deleted from the end) is a break as well.
        """
        head_seq, head_hash = await self.store.audit_head()
        checked, broken = await self._walk()
        if broken is None and head_seq > 0:
            at_head = await self.store.audit_range(after_seq=head_seq - 1, limit=1)
            if checked < head_seq or not at_head or at_head[0].seq != head_seq:
                return checked, Break(checked + 1, "missing")
            if at_head[0].hash != head_hash:
                return checked, Break(head_seq, "head_mismatch")
        return checked, broken

    async def _walk(self) -> tuple[int, Break | None]:
        checked = 0
        prev = (0, AUDIT_GENESIS_HASH)
        page: list[AuditRecord] = []
        async for record in self.records():
            page.append(record)
            if len(page) == 500:
                n, broken = verify(page, start=prev)
                checked += n
                if broken:
                    return checked, broken
                prev = (page[-1].seq, page[-1].hash)
                page = []
        n, broken = verify(page, start=prev)
        return checked + n, broken


def _append_line(path: Path, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, (line + "\n").encode("utf-8"))
    finally:
        os.close(fd)
