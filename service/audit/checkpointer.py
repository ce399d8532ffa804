"""Writing signed checkpoints: every N records or T seconds, by whichever worker, never in a request.

Each worker signs only records it committed itself (the log tells it after each commit), never
a head it merely read from the database: a row someone wrote into the database directly is not
signed on its say-so. Nor does it sign its record once the chain no longer holds it as written:
before signing, its tip (``audit.tip``) verifies the stored chain up to the head, and a spoiled
tip signs nothing (the alarm was raised when it was spoiled). A checkpoint is due when this
worker's newest record is ``N`` past the newest stored checkpoint, or when a record of its own
has gone uncovered for ``T`` seconds (a timer), and once more on shutdown, so a cleanly stopped
service leaves its chain signed to the end.

A group commit (``AuditLog``'s batches of reads' and refusals' records) asks while it holds the
head's lock, its tip having vouched for the head it extends (``due``, ``sign``): a checkpoint
due then is signed and stored in that transaction, and commits or not with the records. Every
other commit (a run's own transaction, a sealed batch, PostgreSQL's optimistic appends) is
checked after it committed (``committed``): the checkpoint is then written in the background,
its failure logged and retried at the next chance, never failing the request whose record is
already committed. Workers checkpointing the same record store it once (one per seq).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from .. import clock
from ..config import AuditConfig
from ..deadline import detached
from ..repeats import log_failure
from ..store.base import AuditCheckpoint, AuditRecord, StoreError
from .checkpoint import sign
from .keys import AuditKeyError, AuditKeys
from .log import AuditLog
from .tip import AuditTampered

__all__ = ["Checkpointer", "checkpointing"]

log = logging.getLogger("controlplane.audit")


class Checkpointer:
    """One worker's checkpoints of the records it committed (see the module docstring)."""

    def __init__(self, audit: AuditLog, keys: AuditKeys, *, every_records: int,
                 every_s: float) -> None:
        self.audit, self.keys = audit, keys
        self.every_records, self.every_s = every_records, every_s
        self._latest: AuditRecord | None = None  # the newest record this worker committed
        self._covered = 0  # the newest seq a stored checkpoint is known to cover
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None

    def due(self, seq: int) -> bool:
        """Whether record ``seq``, which this worker is committing in a group commit, is due a
        checkpoint by the count (``store.base.CheckpointSigner``, asked under the head's lock
        after the tip vouched for the head it extends)."""
        return seq - self._covered >= self.every_records

    def sign(self, seq: int, head_hash: str, covered: int) -> AuditCheckpoint | None:
        """The checkpoint of record ``seq`` for the group commit that is committing it, unless
        the newest stored checkpoint (of record ``covered``, read under the same lock) leaves
        none due. Stored in that transaction: written (``checkpointed``) or not with it."""
        self._covered = max(self._covered, covered)
        if seq - self._covered < self.every_records:
            return None
        try:
            return sign(self.keys.signing_key(), seq, head_hash, clock.now())
        except Exception as exc:  # never fails the commit: the records go without it
            # Asked again by every batch while it is due: one line per cause per interval.
            log_failure(log, "audit checkpoint not signed in a group commit", exc,
                        event="audit.checkpoint_unsigned", expected=(AuditKeyError,))
            return None

    def refused(self, checkpoint: AuditCheckpoint, error: StoreError) -> None:
        """The store refused the checkpoint ``sign`` made (the records committed without it):
        logged as a background write's failure is; the next one covers the records."""
        _not_written(error)

    def checkpointed(self, checkpoint: AuditCheckpoint) -> None:
        """A checkpoint ``sign`` made was committed with the records it covers."""
        self._covered = max(self._covered, checkpoint.seq)

    def committed(self, record: AuditRecord) -> None:
        """The newest record of a commit of this worker (the records before it in the commit
        need no telling: only the newest is kept and counted from); starts a checkpoint when
        ``N`` records are uncovered."""
        if self._latest is None or record.seq > self._latest.seq:
            self._latest = record
        if record.seq - self._covered >= self.every_records and (
            self._task is None or self._task.done()
        ):
            # Not bounded by the deadline of the run whose record triggered it.
            self._task = asyncio.create_task(self._catch_up(), context=detached())

    async def checkpoint(self, now: float, *, force: bool = True) -> AuditCheckpoint | None:
        """Sign and store a checkpoint of this worker's newest record, unless a stored one
        covers it (or, without ``force``, one less than ``N`` records before it). Returns the
        checkpoint this call stored, if any."""
        async with self._lock:
            latest = self._latest
            if latest is None or latest.seq <= self._covered:
                return None
            if not await self._vouched(latest):
                return None
            stored = await self.audit.store.latest_audit_checkpoint()
            if stored is not None:
                self._covered = max(self._covered, stored.seq)
            if latest.seq <= self._covered or (
                not force and latest.seq - self._covered < self.every_records
            ):
                return None
            checkpoint = sign(self.keys.signing_key(), latest.seq, latest.hash, now)
            added = await self.audit.store.add_audit_checkpoint(checkpoint)
            self._covered = max(self._covered, latest.seq)
        if not added:
            return None  # another worker signed the same record first
        await self.audit.mirror_checkpoint(checkpoint)
        return checkpoint

    async def _vouched(self, latest: AuditRecord) -> bool:
        """Whether the stored chain, verified from this worker's tip up to its head, still holds
        ``latest`` as this worker committed it."""
        try:
            tip = await self.audit.catch_up()
        except AuditTampered:
            return False  # alarmed once already, when the tip was spoiled
        return tip[0] >= latest.seq

    async def _catch_up(self) -> None:
        # Records committed while a checkpoint was being written may make another one due.
        while await self._quietly(force=False):
            if self._latest is None or self._latest.seq - self._covered < self.every_records:
                return

    async def _quietly(self, *, force: bool) -> bool:
        """``checkpoint``, logging a failure instead of raising it; False when it failed."""
        try:
            await self.checkpoint(clock.now(), force=force)
        except StoreError as exc:
            _not_written(exc)
            return False
        except Exception:
            log.exception("audit checkpoint not written")
            return False
        return True

    async def run(self) -> None:
        """The timer: every ``T`` seconds, a checkpoint if a record of ours is uncovered."""
        while True:
            await asyncio.sleep(self.every_s)
            await self._quietly(force=True)

    async def close(self) -> None:
        """Finish a checkpoint in flight, then the last one (shutdown)."""
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
        await self._quietly(force=True)


def _not_written(error: StoreError) -> None:
    # Every batch (or commit) while one is due tries again: one line per cause per interval.
    log_failure(log, "audit checkpoint not written (store error); the next one covers the "
                "records", error, event="audit.checkpoint_not_written", expected=(StoreError,),
                level=logging.WARNING)


@contextlib.asynccontextmanager
async def checkpointing(audit: AuditLog, config: AuditConfig) -> AsyncIterator[Checkpointer]:
    """Open the audit key ring (creating the first key), attach a checkpointer to ``audit``,
    run its timer; on exit, write the last checkpoint and detach."""
    keys = await asyncio.to_thread(AuditKeys.open, config.keys_dir, now=clock.now())
    checkpointer = Checkpointer(audit, keys, every_records=config.checkpoint_records,
                                every_s=config.checkpoint_interval_s)
    audit.observer = checkpointer
    audit.trusted_keys = keys.public_keys
    timer = asyncio.create_task(checkpointer.run())
    try:
        yield checkpointer
    finally:
        timer.cancel()
        await asyncio.gather(timer, return_exceptions=True)
        await checkpointer.close()
        audit.observer = None
        audit.trusted_keys = None
