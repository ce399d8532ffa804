"""This worker's verified tip of the audit chain: the newest (seq, hash) it knows to be genuine,
and the check that every head it extends or signs descends from it unchanged.

Records after the newest signed checkpoint are vouched for by no signature. Someone with write
access to the database (without the audit key) can edit one and recompute every hash after it;
a worker that chained its next record onto that forged head, and signed a checkpoint over it,
would launder the edit. So a worker extends or signs only a head it can verify from its tip:

- the tip starts at the newest stored checkpoint whose signature verifies with the keys this
  replica is configured with (``AuditLog.trusted_keys``; the chain's start without them), never
  at a head merely read from the database;
- it moves to each record this worker commits (its hash as computed here, never read back) and
  to each head it verified: the stored records from the tip to that head, each hash recomputed
  from its content and its predecessor's hash, the first of them still the tip's own hash. Other
  workers' records pass when they verify from the tip; a rewrite from a record at or before the
  tip changes the tip's record, which is detected. Inside a caller's transaction (``pending``)
  a verified head may include this transaction's own records, which may yet roll back: it is
  only noted, and the tip moves once a record chained onto it is committed (``advance``);
- the check is incremental: nothing to read when the head is the tip (this worker wrote last),
  else one read of the records since the tip, under the head's lock (on PostgreSQL's sealing
  path, before its compare-and-swap, outside the lock), and about 27 us of hashing per record
  read. A worker walks its tip to the head when it starts, and housekeeping and the
  checkpointer move it outside the lock, so the gap stays small. Measured (one record per
  append, local servers): when this worker wrote last, the same statements as without the
  check (PostgreSQL 2, SQLite 3) and the same median (0.59 ms on PostgreSQL); after another
  worker's append, one statement more, about +0.2 ms on PostgreSQL on a quiet machine
  (appending or sealing), within noise on a loaded one.

On a contradiction the tip is spoiled for good: every later append and signature is refused
(``AuditTampered``, a ``StoreError``: a mutation fails closed with 503 ``audit_unavailable``),
and the alarm is raised once (``AuditLog``: log event ``audit.chain_tampered``, metrics,
readiness). A restarted worker trusts the newest signed checkpoint again: check the chain with
``cpctl audit verify --anchor <mirror>`` first.

What this cannot see: a record written by another worker after this worker's tip and rewritten
(with every hash after it) before this worker next reads it verifies from the tip like a
genuine one. That worker itself refuses its next append (the record it wrote is at or before its
own tip), and ``cpctl audit verify --anchor <the JSON-lines mirror>`` compares every mirrored
record with the stored one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NoReturn

from ..store.base import AUDIT_GENESIS_HASH, AuditRecord, ChainGuard, StaleStart, StoreError
from .record import verify

__all__ = ["AuditTampered", "Tip"]

Head = tuple[int, str]


class AuditTampered(StoreError):
    """The chain no longer holds what this worker verified or wrote: it is not extended or signed."""

    def __init__(self, seq: int, reason: str) -> None:
        super().__init__(f"audit record {seq}: {reason}")
        self.seq, self.reason = seq, reason


class Tip:
    """The newest (seq, hash) this worker verified or committed (see the module docstring)."""

    def __init__(self, alarm: Callable[[AuditTampered], None]) -> None:
        self._alarm = alarm
        self._known: Head | None = None  # None: not started (``start``)
        self._spoiled: AuditTampered | None = None
        # Heads verified from the tip inside transactions not known to be committed: seq -> hash.
        self._vouched: dict[int, str] = {}

    @property
    def known(self) -> Head | None:
        return self._known

    @property
    def ok(self) -> bool:
        """False once a contradiction was found (until the worker restarts)."""
        return self._spoiled is None

    def start(self, head: Head = (0, AUDIT_GENESIS_HASH)) -> None:
        """Start from ``head``: a signed checkpoint's (verified by the caller), or the chain's
        start. Its record is compared with what is stored at the first ``vouch``."""
        if self._known is None:
            self._known = head

    def pending(self) -> ChainGuard:
        """The guard for an append inside a caller's transaction (see the module docstring)."""
        return _Pending(self)

    def check(self) -> None:
        """Raise when the tip is spoiled: nothing may be appended or signed."""
        if self._spoiled is not None:
            raise AuditTampered(self._spoiled.seq, self._spoiled.reason)

    def since(self, head: Head) -> Head | None:
        """``ChainGuard.since``: None when ``head`` is the tip; else the tip."""
        self.check()
        if self._known is None:
            raise StoreError("audit tip not started")
        return None if head == self._known else self._known

    def reads_from(self) -> Head | None:
        """``ChainGuard.reads_from``: the tip."""
        return self._known

    def vouch(self, start: Head, head: Head, records: Sequence[AuditRecord], *,
              move: bool = True) -> None:
        """``ChainGuard.vouch``: the stored records between ``start`` (the tip ``since`` gave)
        and ``head`` link the two unchanged, or the tip is spoiled; the tip moves to the newer
        (without ``move``: ``head`` is only noted as verified, for ``advance``)."""
        found = self.broken(start, head, records)
        if found is not None:
            self.spoil(*found)
        if move:
            self.vouched(start, head)
        else:
            self.note(start, head)

    def note(self, start: Head, head: Head) -> None:
        """``head``, verified from ``start`` inside a transaction not known to be committed:
        noted for ``advance`` (see the module docstring), the tip not moved."""
        if head[0] > start[0]:
            self._vouched[head[0]] = head[1]

    @staticmethod
    def broken(start: Head, head: Head, records: Sequence[AuditRecord]) -> tuple[int, str] | None:
        """``ChainGuard.broken``: ``vouch``'s check alone, changing nothing (a store may ask it
        on its writer's thread): None when ``records`` link ``start`` and ``head`` unchanged,
        else the first contradiction, (seq, reason)."""
        low, high = (start, head) if start[0] <= head[0] else (head, start)
        rest = list(records)
        if low[0] > 0:
            if not rest or rest[0].seq != low[0]:
                return low[0], "record_missing"
            if rest[0].hash != low[1]:
                return low[0], "record_changed"
            rest = rest[1:]
        _, broken = verify(rest, start=low, stored_text=True)
        if broken is not None:
            return broken.seq, broken.reason
        end = (rest[-1].seq, rest[-1].hash) if rest else low
        if end[0] != high[0]:
            return end[0] + 1, "record_missing"
        if end[1] != high[1]:
            return high[0], "record_changed"
        return None

    def vouched(self, start: Head, head: Head) -> None:
        """``ChainGuard.vouched``: ``broken`` found the records from ``start`` (a tip this
        guard gave) to ``head`` unchanged, under the head's lock: the tip moves to the newer."""
        self._move(head if head[0] >= start[0] else start)

    def noted(self, head: Head) -> Head | None:
        """The newest head verified inside a transaction (``vouch(move=False)``) that is newer
        than the tip and not newer than ``head``; None without one."""
        known = self._known
        if known is None:
            return None
        best: Head | None = None
        for seq, digest in self._vouched.items():
            if known[0] < seq <= head[0] and (best is None or seq > best[0]):
                best = (seq, digest)
        return best

    def forget_noted(self) -> None:
        """Drop the heads verified inside transactions (one of them did not commit)."""
        self._vouched.clear()

    def advance(self, records: Sequence[AuditRecord]) -> None:
        """Records this worker committed, in chain order: the tip moves along those that link
        onto it or onto a head verified from it (each was chained onto a head vouched for).
        It is walked along the records and moved once, to the last that links (a group commit
        brings a batch of records, each linked onto the one before)."""
        known = self._known
        if known is None:
            return
        seq, digest = known
        vouched = self._vouched
        for record in records:
            if record.seq <= seq:
                continue
            if record.seq == seq + 1 and record.prev_hash == digest:
                seq, digest = record.seq, record.hash
            elif vouched and vouched.get(record.seq - 1) == record.prev_hash and (
                    record.seq != seq + 1 or seq == known[0]):
                # (as when moved record by record: a move forgets the heads vouched up to it)
                seq, digest = record.seq, record.hash
        if seq > known[0]:
            self._move((seq, digest))

    def spoil(self, seq: int, reason: str) -> NoReturn:
        """Record a contradiction at ``seq``: raise the alarm once, refuse from now on."""
        if self._spoiled is None:
            self._spoiled = AuditTampered(seq, reason)
            self._alarm(self._spoiled)
        raise AuditTampered(self._spoiled.seq, self._spoiled.reason)

    def _move(self, head: Head) -> None:
        # Concurrent appends of this worker may have moved the tip further meanwhile.
        if self._known is None or head[0] > self._known[0]:
            self._known = head
            if self._vouched:
                for seq in [s for s in self._vouched if s <= head[0]]:
                    del self._vouched[seq]


class _Pending:
    """``Tip`` as the guard of an append inside a caller's transaction: verifies, never moves.

    It starts from the newest head it already verified inside a transaction (``noted``), not
    from the tip: a transaction's appends (a group-committed SQLite batch holds many, under the
    writers' lock) would otherwise each re-read and re-verify every record since the tip, the
    ones the earlier appends verified included. A noted head whose record is no longer the one
    verified (its transaction did not commit) is dropped, with every other note, and the store
    asks again (``StaleStart``): from the tip."""

    def __init__(self, tip: Tip) -> None:
        self._tip = tip

    def since(self, head: Head) -> Head | None:
        start = self._tip.since(head)
        if start is None:
            return None
        noted = self._tip.noted(head)
        if noted is None:
            return start
        return None if noted == head else noted

    def reads_from(self) -> Head | None:
        """None: ``since`` may start from a noted head, which only it can tell."""
        return None

    def vouch(self, start: Head, head: Head, records: Sequence[AuditRecord]) -> None:
        if start != self._tip.known and (
                not records or records[0].seq != start[0] or records[0].hash != start[1]):
            self._tip.forget_noted()
            raise StaleStart(f"audit head {start[0]} was verified in a transaction that did not "
                             "commit")
        self._tip.vouch(start, head, records, move=False)

    broken = staticmethod(Tip.broken)

    def vouched(self, start: Head, head: Head) -> None:
        """Noted, as ``vouch`` notes: the transaction may still roll back."""
        self._tip.note(start, head)
