"""The audit log: append sealed records through the store, verify the chain, mirror to JSON lines.

Records are appended inside the caller's transaction when there is one, so a mutation, its
ticket consumption and its audit record commit together (or none does). Records of runs that
change nothing (reads, refusals) are group-committed: they queue while a commit is in flight and
the next commit writes them all, so a durable commit is shared by many requests instead of
paid by each; each commit first lets the event loop run a few turns (``GATHER_TURNS``), so the
requests already on their way join it. Every caller still waits until its own record is
committed. The optional JSON-lines sink is written after commit; it is a copy for log shippers,
the store is the record.

Where the store is shared by several writing processes (``Store.stages_audit``: PostgreSQL), a
run's transaction does not append its record to the chain: it only stages it (``stage``: an
insert without any global lock, committed with the mutation, so it is durable when the run is
acknowledged). After COMMIT the run waits (``settle``) while this worker's sealer chains the
staged records of all its waiting runs in one batch (``Store.seal_audit``: on PostgreSQL one
statement that holds the chain head's lock only while it runs and commits): the cluster-wide
serialised section is paid once per batch instead of being held by every run until its COMMIT.
A record whose worker stopped before sealing it is sealed by any worker's ``sweep`` once it is
``STAGED_GRACE_S`` old; ``verify_signed`` reports unsealed ones older than ``UNSEALED_PROBLEM_S``.

Committed records are also handed to the worker's checkpointer (``audit.checkpointer``), which
signs checkpoints of them; ``verify_signed`` checks the chain against those signed checkpoints
and against anchors kept outside the database (``audit.checkpoint``), and against every record
of the JSON-lines mirror given as an anchor.

Every append, seal and sweep first lets this worker's ``Tip`` (``audit.tip``) vouch for the head
it extends: a head it did not write and cannot verify from the last head it knows is refused,
and the alarm is raised (log event ``audit.chain_tampered``, ``integrity_failed``, ``tip.ok``).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import math
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Any, Protocol, TypeVar

from aiohttp import web
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from .. import clock
from ..deadline import Waiting, detached
from ..store.base import (
    AUDIT_GENESIS_HASH,
    AuditCheckpoint,
    AuditRecord,
    CheckpointSigner,
    Store,
    StoreError,
    StoreUnavailable,
    Tx,
)
from .checkpoint import Verification, signature_ok, to_doc
from .record import Break, prepare, seal, verify
from .resolution import Resolver
from .tip import AuditTampered, Tip

__all__ = ["AUDIT", "AuditLog"]

log = logging.getLogger("controlplane.audit")

#: The most records one group commit (or one sealing batch) writes; more wait for the next one.
MAX_BATCH = 256
#: Turns of the event loop a group commit lets run before it takes its batch. A commit costs
#: its writer ~75-100 us of CPU whatever it holds (the WAL's fdatasync alone ~40 us), and under
#: load the answers of one commit bring the next requests within a few turns: taken at once,
#: the batch is the few records that came in while the last commit ran. A turn with nothing
#: ready costs a few us, so an idle worker's record waits ~10-40 us more. Measured on the
#: authorized read (2 workers, SQLite): CPU per read 179 -> 127 us at 16 connections, 111-117
#: -> 85-103 us at 64, p99 unchanged, against taking the batch at once (bench/RESULTS.md).
GATHER_TURNS = 8
#: A staged record this old (seconds) is sealed by whichever worker sweeps first (housekeeping
#: sweeps every 30 s).
STAGED_GRACE_S = 10.0
#: How long (seconds) a sealing batch waits, at most, for the stagings still in flight when it
#: starts: their records join it instead of each needing a batch of their own (see ``_seal``).
GATHER_S = 0.005
#: ``verify_signed`` reports staged records older than this as a problem: no worker sweeps.
UNSEALED_PROBLEM_S = 120.0
_PAGE = 500
_T = TypeVar("_T")


#: A record waiting for a group commit: its entry, its caller's future, the caller's deadline.
_Member = tuple[dict[str, Any], "asyncio.Future[AuditRecord]", float]


class CommitObserver(CheckpointSigner, Protocol):
    """Told of the newest record of each commit of this worker (``committed``: what it counts
    needs no other), and asked by its group commits for a checkpoint of the head they move to
    (the checkpointer)."""

    def committed(self, record: AuditRecord) -> None: ...
    def checkpointed(self, checkpoint: AuditCheckpoint) -> None: ...


class _BatchSigner:
    """The observer as one group commit's ``CheckpointSigner``: keeps what it signed, which
    the batch tells the observer of once it committed."""

    __slots__ = ("observer", "signed")

    def __init__(self, observer: CommitObserver) -> None:
        self.observer = observer
        self.signed: AuditCheckpoint | None = None

    def due(self, seq: int) -> bool:
        return self.observer.due(seq)

    def sign(self, seq: int, head_hash: str, covered: int) -> AuditCheckpoint | None:
        self.signed = self.observer.sign(seq, head_hash, covered)
        return self.signed

    def refused(self, checkpoint: AuditCheckpoint, error: StoreError) -> None:
        self.signed = None
        self.observer.refused(checkpoint, error)


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
        # Records waiting for the next group commit, and the batch being committed: each with
        # its caller's future and the loop time by which the caller is answered (``_expire``).
        self._pending: list[_Member] = []
        self._committing: list[_Member] = []
        self._flusher: asyncio.Task[None] | None = None
        self._watchdog: asyncio.TimerHandle | None = None
        # Staging id -> its settler, in arrival order; one sealer task works through them.
        self._unsealed: dict[int, asyncio.Future[AuditRecord | None]] = {}
        self._sealer: asyncio.Task[None] | None = None
        # The sink's writes of checkpoints group commits stored (held until done).
        self._mirroring: set[asyncio.Task[None]] = set()
        # One future per staging whose statement (a run's whole call, on PostgreSQL) is out.
        self._staging: set[asyncio.Future[None]] = set()
        #: Set by the checkpointer of a serving worker; tools and tests leave it None.
        self.observer: CommitObserver | None = None
        #: Runs whose COMMIT went unanswered, resolved once the store answers (the app closes it).
        self.resolver = Resolver()
        #: The audit public keys of this replica (set with the checkpointer): the tip starts at
        #: the newest checkpoint they verify. Without them (tools, tests) it starts at record 0.
        self.trusted_keys: Callable[[], Mapping[str, Ed25519PublicKey]] | None = None
        #: Told once when the chain is found changed under this worker (the app's metrics).
        self.integrity_failed: Callable[[], None] = _nothing
        self.tip = Tip(self._alarm)

    @property
    def store(self) -> Store:
        return self._store()

    async def append(self, entry: dict[str, Any], tx: Tx | None = None,
                     known: AbstractSet[str] = frozenset()) -> AuditRecord:
        """Seal and append ``entry`` (scrubbed of credentials): in ``tx`` when given, else in the
        next group commit. Returns once the record is committed; raises what the commit raised.
        ``known``: the members the caller vouches for (``record.prepare``)."""
        if tx is not None:
            await self._ready()
            # The transaction may still roll back: the tip moves once it is committed (mirror).
            return await tx.append_audit(prepare(entry, known), seal, guard=self.tip.pending())
        loop = asyncio.get_running_loop()
        future: asyncio.Future[AuditRecord] = loop.create_future()
        # Bounded by the store's deadline (or what is left of the request's): a stalled commit
        # (or one queued behind it) answers StoreUnavailable instead of hanging the caller. One
        # timer watches every waiting caller (``_expire``), not one per caller: the commit is
        # shared, and a timer each was ~5% of an authorized read's CPU.
        waiting = self._waiting()
        deadline = waiting.at
        self._pending.append((prepare(entry, known), future, deadline))
        if deadline < math.inf and (self._watchdog is None or deadline < self._watchdog.when()):
            self._watch(loop, deadline)
        if self._flusher is None or self._flusher.done():
            # It commits every run's record: none of their deadlines is its own.
            self._flusher = asyncio.create_task(self._flush(), context=detached())
        # A caller that goes away cancels its own future, never the commit (a task of its own)
        # others are waiting for, which then skips it.
        with waiting:
            return await future

    def _waiting(self) -> Waiting:
        """A caller's wait on the store from now: answered by the store's deadline, or what is
        left of the request's (``service.deadline``; inf without one), and charged to it."""
        return Waiting(getattr(self.store, "timeout_s", None))

    def _watch(self, loop: asyncio.AbstractEventLoop, at: float) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
        self._watchdog = loop.call_at(at, self._expire)

    def _expire(self) -> None:
        """The group commit's deadline timer: answer every caller whose deadline has passed
        (StoreUnavailable; its record may still commit with the batch, unanswered), then wait
        for the next deadline of a caller still waiting."""
        self._watchdog = None
        loop = asyncio.get_running_loop()
        now, following = loop.time(), math.inf
        for _, future, deadline in itertools.chain(self._committing, self._pending):
            if future.done():
                continue
            if deadline <= now:
                future.set_exception(StoreUnavailable("audit group commit: deadline exceeded"))
            else:
                following = min(following, deadline)
        if following < math.inf:
            self._watch(loop, following)

    @property
    def stages(self) -> bool:
        """Whether runs' transactions stage their records (``stage``) instead of appending."""
        return bool(getattr(self.store, "stages_audit", False))

    async def stage(self, entry: dict[str, Any], tx: Tx,
                    known: AbstractSet[str] = frozenset()) -> int:
        """Stage ``entry`` (scrubbed) in ``tx``: it commits with ``tx`` but is not chained yet.
        Returns its staging id, for ``settle`` once ``tx`` committed. ``known``: as ``append``'s."""
        out: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._staging.add(out)
        try:
            return await tx.stage_audit(prepare(entry, known), clock.now())
        finally:
            self._staging.discard(out)
            out.set_result(None)

    async def settle(self, staged: int) -> AuditRecord | None:
        """After the staging transaction committed: wait until this worker's sealer has chained
        the record (with every other one waiting) and mirrored it. Returns the sealed record,
        or None when another worker's sweep sealed it first; raises what sealing raised."""
        future = self._unsealed.get(staged)
        shared = future is not None  # somebody waits for it already (a resolver's retry)
        if future is None:
            future = asyncio.get_running_loop().create_future()
            self._unsealed[staged] = future
        if self._sealer is None or self._sealer.done():
            self._sealer = asyncio.create_task(self._seal(), context=detached())
        return await self._batched(future, "audit sealing", shared=shared)

    async def _batched(self, future: asyncio.Future[_T], what: str, *,
                       shared: bool = False) -> _T:
        # A caller that goes away cancels what it awaits: its own future, never the commit (a
        # task of its own) others are waiting for, which then skips it; a future another
        # caller also awaits is shielded.
        # Bounded by the store's deadline (or what is left of the request's): a stalled batch
        # (or one queued behind it) answers StoreUnavailable instead of hanging the caller.
        waiting = self._waiting()
        deadline = waiting.at
        try:
            with waiting:
                async with asyncio.timeout_at(None if deadline == math.inf else deadline):
                    return await (asyncio.shield(future) if shared else future)
        except TimeoutError:
            future.add_done_callback(_retrieved)  # its outcome is no longer awaited
            raise StoreUnavailable(f"{what}: deadline exceeded") from None

    async def _seal(self) -> None:
        """Seal what is staged, a batch at a time. A batch first waits (up to ``GATHER_S``) for
        the stagings in flight as it starts: under load a run's call and its sealing overlap,
        and without the wait nearly every run sealed alone (about 1.2 runs a batch on the
        PostgreSQL chain bench: three statements a run for sealing, where one batch's three
        serve many)."""
        while self._unsealed:
            if self._staging:
                await asyncio.wait(list(self._staging), timeout=GATHER_S)
                await asyncio.sleep(0)  # the runs they answered reach ``settle`` first
            ids = list(itertools.islice(self._unsealed, MAX_BATCH))
            try:
                await self._ready()
                sealed = await self.store.seal_audit(seal, ids, guard=self.tip)
            except Exception as exc:  # the staged rows stay durable: a later sweep seals them
                for staged in ids:
                    future = self._unsealed.pop(staged)
                    if not future.done():
                        future.set_exception(exc)
                continue
            await self.mirror_many([record for _, record in sealed])
            records = dict(sealed)
            for staged in ids:
                future = self._unsealed.pop(staged)
                if not future.done():
                    future.set_result(records.get(staged))

    async def sweep(self, now: float) -> int:
        """Seal the records staged before ``now - STAGED_GRACE_S`` and still unsealed (their
        worker stopped, or failed to seal them); returns how many this call sealed."""
        total = 0
        await self._ready()
        while True:
            sealed = await self.store.seal_audit(seal, staged_before=now - STAGED_GRACE_S,
                                                 limit=MAX_BATCH, guard=self.tip)
            await self.mirror_many([record for _, record in sealed])
            total += len(sealed)
            if len(sealed) < MAX_BATCH:
                return total

    async def _flush(self) -> None:
        while self._pending:
            for _ in range(GATHER_TURNS):  # the requests on their way join this batch
                await asyncio.sleep(0)
            batch, self._pending = self._pending[:MAX_BATCH], self._pending[MAX_BATCH:]
            self._committing = batch
            signer = _BatchSigner(self.observer) if self.observer is not None else None
            try:
                await self._ready()
                records = await self.store.append_audit_many([e for e, _, _ in batch], seal,
                                                             guard=self.tip, checkpoint=signer)
            except Exception as exc:
                for _, future, _ in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            finally:
                self._committing = []
            # The tip and the checkpointer are told of the batch here, once (``mirror_soon``
            # with ``told``: the runs it answers do not tell them again, record by record).
            self.tip.advance(records)
            checkpoint = None
            if signer is not None and signer.signed is not None:  # committed with the batch
                checkpoint = signer.signed
                signer.observer.checkpointed(checkpoint)
            if self.observer is not None and records:
                self.observer.committed(records[-1])  # (the batch is in chain order)
            for (_, future, _), record in zip(batch, records, strict=True):
                if not future.done():
                    future.set_result(record)
            if checkpoint is not None and self.jsonl_path is not None:
                # Not awaited here, where the next batch waits: after the runs the batch
                # answered, which mirror its records as they resume.
                task = asyncio.create_task(self.mirror_checkpoint(checkpoint),
                                           context=detached())
                self._mirroring.add(task)
                task.add_done_callback(self._mirroring.discard)

    async def mirror(self, record: AuditRecord) -> None:
        """After commit: copy the record to the JSON-lines sink (best effort: the store is the
        record) and tell the checkpointer."""
        await self.mirror_many([record])

    async def mirror_many(self, records: Sequence[AuditRecord]) -> None:
        """``mirror`` for committed records in chain order, in one write to the sink."""
        sink = self.mirror_soon(records)
        if sink is not None:
            await sink

    def mirror_soon(self, records: Sequence[AuditRecord], *, told: bool = False
                    ) -> Awaitable[None] | None:
        """``mirror_many`` up to the sink's write: the tip and the checkpointer are told now
        (``told``: they were, records a group commit of ``append`` wrote); returns the write to
        await, None when no sink is configured (so the chain's read, which mirrors every run,
        makes no coroutine for it)."""
        if not records:
            return None
        if not told:
            self.tip.advance(records)
            if self.observer is not None:
                self.observer.committed(max(records, key=_seq))
        if self.jsonl_path is None:  # (no copy of every entry for a sink not configured)
            return None
        return self._sink(*(
            {"seq": r.seq, "prev_hash": r.prev_hash, "hash": r.hash, **r.entry}
            for r in records
        ))

    async def mirror_checkpoint(self, checkpoint: AuditCheckpoint) -> None:
        """Copy a stored checkpoint to the JSON-lines sink (its line is a valid anchor file)."""
        await self._sink(to_doc(checkpoint))

    async def _sink(self, *docs: dict[str, Any]) -> None:
        if self.jsonl_path is None:
            return
        line = "\n".join(json.dumps(doc, separators=(",", ":")) for doc in docs)
        async with self._sink_lock:
            try:
                await asyncio.to_thread(_append_line, self.jsonl_path, line)
            except OSError as exc:
                log.error("audit sink write failed", extra={"fields": {
                    "event": "audit.mirror_write_failed", "error": exc.strerror}})

    async def catch_up(self) -> tuple[int, str]:
        """Move the tip to the stored head, verifying the records since it a page at a time
        (housekeeping and the checkpointer, outside the head's lock, so that appends find little
        to read under it). Returns the tip; raises ``AuditTampered`` when the chain changed."""
        await self._ready()
        return await self._to_head()

    async def _to_head(self) -> tuple[int, str]:
        known = self.tip.known
        assert known is not None  # started by _ready
        head = await self.store.audit_head()
        if head[0] < known[0]:  # ``known`` is committed: a head read after it cannot be older
            self.tip.spoil(head[0] + 1, "record_missing")
        while (start := self.tip.since(head)) is not None and start[0] <= head[0]:
            page = [r for r in await self.store.audit_range(after_seq=max(start[0] - 1, 0),
                                                            limit=_PAGE, decoded=False)
                    if r.seq <= head[0]]
            last = page[-1] if page else None
            # A short page must reach the head; a full one is vouched for up to its end.
            end = head if last is None or len(page) < _PAGE else (last.seq, last.hash)
            self.tip.vouch(start, end, page)
        known = self.tip.known
        assert known is not None
        return known

    async def _ready(self) -> None:
        """Before extending the chain: refuse when the tip is spoiled; start it once (and walk
        it to the head at once, outside the head's lock)."""
        self.tip.check()
        if self.tip.known is None:
            self.tip.start(await self._trusted_start())
            await self._to_head()

    async def _trusted_start(self) -> tuple[int, str]:
        """The newest stored checkpoint, when its signature verifies with this replica's keys
        (a signature that does not spoils the tip); else record 0."""
        keys = self.trusted_keys() if self.trusted_keys is not None else None
        newest = None if keys is None else await self.store.latest_audit_checkpoint()
        if keys is None or newest is None:
            return 0, AUDIT_GENESIS_HASH
        key = keys.get(newest.kid)
        if key is None or not signature_ok(newest, key):
            self.tip.spoil(newest.seq, "checkpoint_unverifiable")
        return newest.seq, newest.head_hash

    def _alarm(self, tampered: AuditTampered) -> None:
        known = self.tip.known
        log.error("audit chain changed under this worker: it neither extends nor signs it "
                  "(cpctl audit verify --anchor <mirror> names what changed)",
                  extra={"fields": {"event": "audit.chain_tampered", "seq": tampered.seq,
                                    "reason": tampered.reason,
                                    "known_seq": None if known is None else known[0]}})
        self.integrity_failed()

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
        self, keys: Mapping[str, Ed25519PublicKey], anchors: Sequence[AuditCheckpoint] = (),
        mirrored: Sequence[AuditRecord] = (),
    ) -> Verification:
        """Walk the chain against every stored checkpoint and every anchor (``keys``: the public
        audit keys by kid). Each must carry a valid signature and name the hash the chain has at
        its seq; the newest one that does, with the chain intact up to it, is the verified head,
        and the records after it are unverifiable. Every ``mirrored`` record (the JSON-lines
        mirror's) must be in the chain with its hash, and every valid anchor still stored as a
        checkpoint. The walk stops at the first record that contradicts the chain, a signed head
        or the mirror: nothing after it can be vouched for."""
        result = Verification()
        head = await self.store.audit_head()
        signed: dict[int, list[tuple[str, str]]] = {}  # seq -> [(head hash, "checkpoint"|"anchor")]
        stored: set[int] = set()  # seqs with a stored checkpoint
        copies: dict[int, str] = {}  # seq -> the hash the mirror holds
        for copy in mirrored:
            if copies.setdefault(copy.seq, copy.hash) != copy.hash:
                result.problems.append(Break(copy.seq, "mirror_mismatch",
                                             "the mirror holds two hashes for this record"))

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
            stored.add(checkpoint.seq)
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
            copy = copies.get(record.seq)
            if copy is not None and copy != record.hash:
                return Break(record.seq, "mirror_mismatch",
                             "the JSON-lines mirror holds another hash for this record: it was "
                             "changed after it was written")
            result.mirrored += copy is not None
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
            beyond = [seq for seq in copies if seq > last]
            if beyond:
                result.problems.append(Break(
                    min(beyond), "mirror_beyond_end",
                    f"the mirror holds records up to {max(beyond)} but the chain ends at "
                    f"{last}: records were removed"))
        # A checkpoint an anchor (or the mirror) shows was signed is evidence, not a gap: gone
        # from the store, it was deleted (exit 1), not "not signed yet" (exit 3).
        for seq in sorted({s for s, claims in signed.items()
                           if any(kind == "anchor" for _, kind in claims)} - stored):
            result.problems.append(Break(
                seq, "checkpoint_missing",
                f"an anchor holds a signed checkpoint of record {seq} that is no longer stored: "
                "checkpoints were deleted"))
        result.end_seq = max(head[0], last)
        unsealed, oldest = await self.store.audit_staged(clock.now() - UNSEALED_PROBLEM_S)
        if unsealed:
            result.problems.append(Break(
                result.end_seq + 1, "unsealed",
                f"{unsealed} acknowledged records staged since {clock.iso(oldest)} are "
                f"not sealed into the chain after {UNSEALED_PROBLEM_S:g} s (no worker sweeps "
                "them)"))
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


#: The audit log over the store.
AUDIT: web.AppKey[AuditLog] = web.AppKey("audit")


def _seq(record: AuditRecord) -> int:
    return record.seq


def _nothing() -> None:
    pass


def _retrieved(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def _append_line(path: Path, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, (line + "\n").encode("utf-8"))
    finally:
        os.close(fd)
