"""The audit log: append sealed records through the store, verify the chain, mirror to JSON lines.

Records are appended inside the caller's transaction when there is one, so a mutation, its
ticket consumption and its audit record commit together (or none does). Records of runs that
change nothing (reads, refusals) are group-committed: they queue while a commit is in flight and
the next commit writes them all, so a durable commit is shared by many requests instead of
paid by each. Every caller still waits until its own record is committed. The optional
JSON-lines sink is written after commit; it is a copy for log shippers, the store is the record.

Committed records are also handed to the worker's checkpointer (``audit.checkpointer``), which
signs checkpoints of them; ``verify_signed`` checks the chain against those signed checkpoints
and against anchors kept outside the database (``audit.checkpoint``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from ..store.base import (
    AUDIT_GENESIS_HASH,
    AuditCheckpoint,
    AuditRecord,
    Store,
    StoreUnavailable,
    Tx,
)
from .checkpoint import Verification, signature_ok, to_doc
from .record import Break, scrub, seal, verify

__all__ = ["AuditLog"]

log = logging.getLogger("controlplane.audit")

#: The most records one group commit writes; more wait for the next one.
MAX_BATCH = 256
_PAGE = 500


class CommitObserver(Protocol):
    """Told of every record this worker committed (the checkpointer)."""

    def committed(self, record: AuditRecord) -> None: ...


class AuditLog:
    """Appends and reads the hash-chained audit log kept in the store."""

    def __init__(self, store: Store | Callable[[], Store], jsonl_path: Path | None = None):
        # A callable resolves the store per call (the service's link, which raises
        # StoreUnavailable while the store is not connected); tools and tests pass a store.
        self._store = store if callable(store) else (lambda: store)
        self.jsonl_path = jsonl_path
        #: Told of each chain record that could not be written (the app wires its metrics).
        self.append_failed: Callable[[], None] = _nothing
        self._sink_lock = asyncio.Lock()
        self._pending: list[tuple[dict[str, Any], asyncio.Future[AuditRecord]]] = []
        self._flusher: asyncio.Task[None] | None = None
        #: Set by the checkpointer of a serving worker; tools and tests leave it None.
        self.observer: CommitObserver | None = None

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
        # Bounded by the store's deadline: a stalled group commit (or a batch queued behind
        # one) answers StoreUnavailable instead of hanging the caller.
        try:
            async with asyncio.timeout(getattr(self.store, "timeout_s", None)):
                return await asyncio.shield(future)
        except TimeoutError:
            future.add_done_callback(_retrieved)  # its outcome is no longer awaited
            raise StoreUnavailable("audit group commit: deadline exceeded") from None

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
        """After commit: copy the record to the JSON-lines sink (best effort: the store is the
        record) and tell the checkpointer."""
        if self.observer is not None:
            self.observer.committed(record)
        await self._sink(
            {"seq": record.seq, "prev_hash": record.prev_hash, "hash": record.hash, **record.entry}
        )

    async def mirror_checkpoint(self, checkpoint: AuditCheckpoint) -> None:
        """Copy a stored checkpoint to the JSON-lines sink (its line is a valid anchor file)."""
        await self._sink(to_doc(checkpoint))

    async def _sink(self, doc: dict[str, Any]) -> None:
        if self.jsonl_path is None:
            return
        line = json.dumps(doc, separators=(",", ":"))
        async with self._sink_lock:
            try:
                await asyncio.to_thread(_append_line, self.jsonl_path, line)
            except OSError as exc:
                log.error("audit sink write failed", extra={"fields": {
                    "event": "audit.mirror_write_failed", "error": exc.strerror}})

    async def records(self, after_seq: int = 0, page: int = 500) -> AsyncIterator[AuditRecord]:
        """Every record after ``after_seq``, in order, fetched a page at a time."""
        while True:
            batch = await self.store.audit_range(after_seq=after_seq, limit=page)
            for record in batch:
                yield record
            if len(batch) < page:
                return
            after_seq = batch[-1].seq

    async def checkpoints(self, after_seq: int = 0) -> AsyncIterator[AuditCheckpoint]:
        """Every stored checkpoint after ``after_seq``, in seq order."""
        while True:
            batch = await self.store.audit_checkpoints(after_seq=after_seq, limit=_PAGE)
            for checkpoint in batch:
                yield checkpoint
            if len(batch) < _PAGE:
                return
            after_seq = batch[-1].seq

    async def verify(self) -> tuple[int, Break | None]:
        """Walk the whole chain (links and hashes only); return (records verified, first break).

        The head is read first: records appended during the walk are verified too, and a chain
        that ends before the recorded head (rows deleted from the end) is a break as well.
        """
        head = await self.store.audit_head()
        checked, broken, _ = await self._walk(lambda record: None)
        return checked, broken or await self._head_break(head, checked)

    async def verify_signed(
        self, keys: Mapping[str, Ed25519PublicKey], anchors: Sequence[AuditCheckpoint] = ()
    ) -> Verification:
        """Walk the chain against every stored checkpoint and every anchor (``keys``: the public
        audit keys by kid). Each must carry a valid signature and name the hash the chain has at
        its seq; the newest one that does, with the chain intact up to it, is the verified head,
        and the records after it are unverifiable. The walk stops at the first record that
        contradicts the chain or a signed head: nothing after it can be vouched for."""
        result = Verification()
        head = await self.store.audit_head()
        signed: dict[int, list[tuple[str, str]]] = {}  # seq -> [(head hash, "checkpoint"|"anchor")]

        def admit(checkpoint: AuditCheckpoint, kind: str) -> None:
            prefix = "" if kind == "checkpoint" else "anchor_"
            key = keys.get(checkpoint.kid)
            if key is None:
                result.problems.append(Break(checkpoint.seq, prefix + "unknown_key",
                                             f"{kind} signed by key {checkpoint.kid}, which is "
                                             "not an audit key here"))
            elif not signature_ok(checkpoint, key):
                result.problems.append(Break(checkpoint.seq, prefix + "bad_signature",
                                             f"the {kind}'s signature does not verify"))
            else:
                signed.setdefault(checkpoint.seq, []).append((checkpoint.head_hash, kind))

        async for checkpoint in self.checkpoints():
            admit(checkpoint, "checkpoint")
        for anchor in anchors:
            admit(anchor, "anchor")

        def confirm(record: AuditRecord) -> Break | None:
            claims = signed.get(record.seq, ())
            for digest, kind in claims:
                if digest != record.hash:
                    return Break(record.seq, f"{kind}_mismatch",
                                 f"a signed {kind} names another hash for this record: the "
                                 "records up to it were changed")
            for _, kind in claims:
                result.checkpoints += kind == "checkpoint"
                result.anchors += kind == "anchor"
            if claims:
                result.verified_seq, result.verified_hash = record.seq, record.hash
            return None

        checked, broken, last = await self._walk(confirm)
        result.records = checked
        walked = broken is None
        broken = broken or await self._head_break(head, checked)
        if broken is not None:
            result.problems.append(broken)
        if walked:
            for seq in sorted(s for s in signed if s > last):
                for _, kind in signed[seq]:
                    result.problems.append(Break(
                        seq, f"{kind}_beyond_end",
                        f"a signed {kind} names record {seq} but the chain ends at {last}: "
                        f"records {last + 1}..{seq} were removed"))
        result.end_seq = max(head[0], last)
        return result

    async def _head_break(self, head: tuple[int, str], checked: int) -> Break | None:
        """A chain that ends before the head row, or whose record there has another hash."""
        head_seq, head_hash = head
        if head_seq > 0:
            at_head = await self.store.audit_range(after_seq=head_seq - 1, limit=1)
            if checked < head_seq or not at_head or at_head[0].seq != head_seq:
                return Break(checked + 1, "missing")
            if at_head[0].hash != head_hash:
                return Break(head_seq, "head_mismatch")
        return None

    async def _walk(
        self, check: Callable[[AuditRecord], Break | None]
    ) -> tuple[int, Break | None, int]:
        """Verify links and hashes in seq order, then ``check`` each verified record; stop at the
        first break of either. Returns (records verified, the break, the last verified seq)."""
        checked = 0
        prev = (0, AUDIT_GENESIS_HASH)
        page: list[AuditRecord] = []

        def take(page: list[AuditRecord]) -> Break | None:
            nonlocal checked, prev
            n, broken = verify(page, start=prev)
            for record in page[:n]:
                found = check(record)
                if found is not None:
                    return found
                checked += 1
                prev = (record.seq, record.hash)
            return broken

        async for record in self.records(page=_PAGE):
            page.append(record)
            if len(page) == _PAGE:
                broken = take(page)
                if broken:
                    return checked, broken, prev[0]
                page = []
        broken = take(page)
        return checked, broken, prev[0]


def _nothing() -> None:
    pass


def _retrieved(future: asyncio.Future[AuditRecord]) -> None:
    if not future.cancelled():
        future.exception()


def _append_line(path: Path, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, (line + "\n").encode("utf-8"))
    finally:
        os.close(fd)
