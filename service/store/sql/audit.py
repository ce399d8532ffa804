"""The audit hash chain in SQL: the single ``audit_head`` row links and serialises appends; the
``audit_checkpoints`` table keeps the signed checkpoints (one per seq).

Two ways in. ``append_audit[_many]`` seals records straight into the chain under the head's lock,
held until the caller's COMMIT. ``stage_audit`` only inserts the entry into ``audit_staged`` (no
global lock: a run's transaction stays off the global section), and ``seal_audit`` later moves a
batch of committed staged rows into the chain in one short transaction of its own under the
head's lock: the global section is paid per batch, not per run. Both ask the caller's
``ChainGuard`` (``audit.tip``) before they extend the head they found: what it raises rolls the
write back, so nothing is chained onto a head the writing worker cannot verify."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ... import canonical
from ..base import (
    AuditCheckpoint,
    AuditRecord,
    ChainGuard,
    CheckedEntry,
    CheckpointSigner,
    Seal,
    StaleStart,
    StoreError,
)
from .core import MAX_LIST_LIMIT, Dialect, Query, Row, Unit, dump_json

__all__ = ["AuditSql", "ChainBroken", "append_locked"]

_INSERT = "INSERT INTO audit_log (seq, prev_hash, hash, entry) VALUES (?, ?, ?, ?)"
_HEAD = "UPDATE audit_head SET seq = ?, hash = ? WHERE id = 1"
# Every record of a batch and the new head in one statement (dialects with writes in WITH).
_INSERT_ALL_AND_HEAD = (
    "WITH appended AS (INSERT INTO audit_log (seq, prev_hash, hash, entry) "
    "SELECT * FROM unnest(?::bigint[], ?::text[], ?::text[], ?::text[])) "
    "UPDATE audit_head SET seq = ?, hash = ? WHERE id = 1"
)
# Taking the head's row lock (a no-op UPDATE: RETURNING shows the committed head after any wait).
_LOCK_HEAD = "UPDATE audit_head SET seq = seq WHERE id = 1 RETURNING seq, hash"
# The head as committed (in a transaction that holds the write lock already, SQLite's BEGIN
# IMMEDIATE: the head no other writer can move).
_READ_HEAD = "SELECT seq, hash FROM audit_head WHERE id = 1"
# The records a ``ChainGuard`` reads to vouch for the head: between its known head and this one.
_SINCE = ("SELECT seq, prev_hash, hash, entry FROM audit_log WHERE seq >= ? AND seq <= ? "
          "ORDER BY seq")
_STAGE = "INSERT INTO audit_staged (staged_at, entry) VALUES (?, ?) RETURNING id"
# Which staged rows a sealing batch takes: ``{ids}`` is a list of placeholders.
_BY_ID = "id IN ({ids})"
# The same on PostgreSQL: one array parameter, so that every batch size is one statement (a
# list of placeholders per size costs asyncpg a prepare per new size and PostgreSQL a plan).
_BY_ID_ARRAY = "id = ANY(?::bigint[])"
_STAGED_BEFORE = "id IN (SELECT id FROM audit_staged WHERE staged_at < ? ORDER BY id LIMIT ?)"
# The head's lock, then the staged rows, in one round trip: the EXISTS on ``head`` makes the
# DELETE wait for the head's lock before it touches any staged row, so two sealers never hold
# each other's rows (the lock order is always head, then rows).
_LOCK_AND_TAKE = (
    "WITH head AS (UPDATE audit_head SET seq = seq WHERE id = 1 RETURNING seq, hash), "
    "taken AS (DELETE FROM audit_staged WHERE {where} AND EXISTS (SELECT 1 FROM head) "
    "RETURNING id, entry) "
    "SELECT taken.id, taken.entry, head.seq, head.hash FROM taken, head"
)
_TAKE = "DELETE FROM audit_staged WHERE {where} RETURNING id, entry"
# Optimistic sealing (dialects with writes in WITH, outside a transaction): read the head and
# the staged rows without any lock, seal in Python, then one statement that moves the head only
# if nobody moved it since (compare and swap on seq) and, only then, takes the staged rows and
# inserts the records. Committing on its own, it holds the head's lock for that statement and
# its commit only: no client round trip and no Python runs under the lock. Any other write of
# the chain moves the head, so a batch that lost the race writes nothing (and is tried again,
# then sealed under the lock).
# Optimistic attempts before sealing under the lock (each lost one held no lock).
_SWAP_ATTEMPTS = 3
_READ_STAGED = (
    "SELECT h.seq, h.hash, s.id, s.entry FROM audit_head h "
    "LEFT JOIN audit_staged s ON s.{where} WHERE h.id = 1"
)
# The same, with the records a ``ChainGuard`` reads to vouch for a head another writer moved
# from the one it knows (``ChainGuard.reads_from``): in the same statement, so in the same
# snapshot as the head, and no read of their own follows (with two workers, most batches').
# None when the head is still that one. Rows of the second kind have ``l_seq`` set.
_READ_STAGED_AND_SINCE = (
    "SELECT h.seq, h.hash, s.id, s.entry, NULL AS l_seq, NULL AS l_prev, NULL AS l_hash "
    "FROM audit_head h LEFT JOIN audit_staged s ON s.{where} WHERE h.id = 1 "
    "UNION ALL SELECT NULL, NULL, NULL, l.entry, l.seq, l.prev_hash, l.hash FROM audit_log l "
    "WHERE l.seq >= ? AND l.seq <= (SELECT seq FROM audit_head WHERE id = 1) "
    "AND NOT EXISTS (SELECT 1 FROM audit_head WHERE id = 1 AND seq = ? AND hash = ?)"
)
_SWAP = (
    "WITH head AS (UPDATE audit_head SET seq = ?, hash = ? WHERE id = 1 AND seq = ? "
    "AND hash = ? RETURNING seq), "
    "taken AS (DELETE FROM audit_staged WHERE id = ANY(?::bigint[]) "
    "AND EXISTS (SELECT 1 FROM head) RETURNING id), "
    "appended AS (INSERT INTO audit_log (seq, prev_hash, hash, entry) "
    "SELECT * FROM unnest(?::bigint[], ?::text[], ?::text[], ?::text[]) "
    "WHERE EXISTS (SELECT 1 FROM head)) "
    "SELECT (SELECT COUNT(*) FROM head) AS moved, (SELECT COUNT(*) FROM taken) AS taken"
)


_ADD_CHECKPOINT = (
    "INSERT INTO audit_checkpoints (seq, head_hash, at, kid, sig) VALUES (?, ?, ?, ?, ?) "
    "ON CONFLICT (seq) DO NOTHING RETURNING seq"
)
_NEWEST_CHECKPOINT = "SELECT COALESCE(MAX(seq), 0) AS seq FROM audit_checkpoints"


class AuditSql(Unit):
    """``base.AuditOps`` over the ``audit_log``, ``audit_head`` and ``audit_staged`` tables."""

    __slots__ = ()

    async def append_audit(self, entry: dict[str, Any], seal: Seal, *,
                           guard: ChainGuard | None = None) -> AuditRecord:
        return (await self.append_audit_many([entry], seal, guard=guard))[0]

    async def append_audit_many(
        self, entries: Sequence[dict[str, Any]], seal: Seal, *, guard: ChainGuard | None = None,
        checkpoint: CheckpointSigner | None = None,
    ) -> list[AuditRecord]:
        if not entries:
            return []
        stored = [(dump_json(e), e) for e in entries]
        async with self._statements() as single:
            if single is not None:
                # Outside a transaction on PostgreSQL (a group commit of reads and refusals):
                # optimistically, two statements and no lock held across a round trip, as
                # sealing does (``_SWAP``); under the lock below only after lost races.
                for _ in range(_SWAP_ATTEMPTS):
                    records = await _swap_append(single, stored, seal, guard)
                    if records is not None:
                        return records
        async with self._unit(write=True) as q:
            # Locking the single head row serialises appends across processes and replicas (a
            # row lock on PostgreSQL, the write lock on SQLite) until COMMIT. Two statements
            # for a whole batch on PostgreSQL (lock, then records + new head in one), since the
            # lock is held from the first statement to COMMIT and each round trip saved
            # shortens the global section.
            head = await q.one(_LOCK_HEAD)
            if head is None:
                raise StoreError("audit head row missing")
            await _vouch(q, (int(head["seq"]), str(head["hash"])), guard)
            records = await _link(q, int(head["seq"]), str(head["hash"]), stored, seal)
            if checkpoint is not None:
                await _checkpoint_in(q, records[-1], checkpoint)
            return records

    async def stage_audit(self, entry: dict[str, Any], at: float) -> int:
        async with self._unit(write=True) as q:
            # A run's record is staged in the run's transaction: naming that transaction here
            # (no extra round trip) lets the store resolve a COMMIT whose answer is lost.
            xact = q.dialect.xact_id
            row = await q.one(_STAGE if xact is None else f"{_STAGE}, {xact} AS xact",
                              at, dump_json(entry))
            if row is not None and xact is not None:
                q.note_xact(str(row["xact"]))
        if row is None:
            raise StoreError("audit record not staged")
        return int(row["id"])

    async def seal_audit(
        self, seal: Seal, ids: Sequence[int] = (), *, staged_before: float | None = None,
        limit: int = MAX_LIST_LIMIT, guard: ChainGuard | None = None,
    ) -> list[tuple[int, AuditRecord]]:
        if not ids and staged_before is None:
            return []
        async with self._statements() as single:
            if single is not None:
                where, args = _staged(single.dialect, ids, staged_before, limit)
                for _ in range(_SWAP_ATTEMPTS):
                    swapped = await _swap(single, where, args, seal, guard)
                    if swapped is not None:
                        return swapped
        async with self._unit(write=True) as q:
            where, args = _staged(q.dialect, ids, staged_before, limit)
            if q.dialect.writes_in_cte:
                rows = await q.all(_LOCK_AND_TAKE.format(where=where), *args)
                if not rows:
                    return []
                last, prev_hash = int(rows[0]["seq"]), str(rows[0]["hash"])
            else:
                head = await q.one(_LOCK_HEAD)
                if head is None:
                    raise StoreError("audit head row missing")
                last, prev_hash = int(head["seq"]), str(head["hash"])
                rows = await q.all(_TAKE.format(where=where), *args)
                if not rows:
                    return []
            await _vouch(q, (last, prev_hash), guard)  # under the head's lock
            # In staging order (RETURNING gives no order); the chain's order is the seal order.
            taken = sorted((int(r["id"]), str(r["entry"])) for r in rows)
            records = await _link(q, last, prev_hash, [(text, None) for _, text in taken], seal)
        return [(staged_id, record) for (staged_id, _), record in zip(taken, records, strict=True)]

    async def audit_staged(self, staged_before: float) -> tuple[int, float | None]:
        async with self._unit(write=False) as q:
            row = await q.one(
                "SELECT COUNT(*) AS n, MIN(staged_at) AS oldest FROM audit_staged "
                "WHERE staged_at < ?", staged_before,
            )  # fmt: skip
        if row is None or not row["n"]:
            return 0, None
        return int(row["n"]), float(row["oldest"])

    async def audit_range(self, after_seq: int = 0, limit: int = 100, *,
                          decoded: bool = True) -> list[AuditRecord]:
        if limit < 1:
            raise ValueError("limit must be positive")
        async with self._unit(write=False) as q:
            rows = await q.all(
                "SELECT seq, prev_hash, hash, entry FROM audit_log WHERE seq > ? "
                "ORDER BY seq LIMIT ?",
                after_seq, min(limit, MAX_LIST_LIMIT),
            )  # fmt: skip
        return [_record(r) if decoded else _stored(r) for r in rows]

    async def audit_head(self) -> tuple[int, str]:
        async with self._unit(write=False) as q:
            row = await q.one(_READ_HEAD)
        if row is None:
            raise StoreError("audit head row missing")
        return int(row["seq"]), str(row["hash"])

    async def add_audit_checkpoint(self, checkpoint: AuditCheckpoint) -> bool:
        async with self._unit(write=True) as q:
            row = await q.one(_ADD_CHECKPOINT, checkpoint.seq, checkpoint.head_hash,
                              checkpoint.at, checkpoint.kid, checkpoint.sig)
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


#: An entry as stored (``dump_json``'s text) and, when the caller has it, the value it encodes.
Stored = tuple[str, "dict[str, Any] | None"]


def _chain(last: int, prev_hash: str, stored: Sequence[Stored], seal: Seal) -> list[AuditRecord]:
    """The records of ``stored`` entries sealed after record ``last``.

    Sealed as they will be read back, so verification recomputes from identical data: the
    text's own value (read back from it unless the caller has it: ``dump_json`` of a value
    whose text is its canonical form reads back equal to it). ``seal`` is given the text only
    where ``canonical.is_canonical`` says it is the entry's canonical form, and hashes it as it
    is."""
    records: list[AuditRecord] = []
    for seq, (text, value) in enumerate(stored, start=last + 1):
        # A value whose text is not its canonical form (a float JCS writes otherwise, a
        # tuple) may not read back equal to it: then what reads back is sealed.
        if type(value) is CheckedEntry:  # its text checked when it was made (no walk here)
            fits, value = value.canonical, dict(value)
        else:
            fits = value is not None and canonical.is_canonical(value, text)
        if fits:
            assert value is not None
            entry, digest = value, seal(seq, prev_hash, value, text)
        else:
            entry = json.loads(text)
            digest = seal(seq, prev_hash, entry,
                          text if canonical.is_canonical(entry, text) else None)
        records.append(AuditRecord.of(seq, prev_hash, digest, entry, text))
        prev_hash = digest
    return records


def _staged(dialect: Dialect, ids: Sequence[int], staged_before: float | None,
            limit: int) -> tuple[str, list[Any]]:
    """The condition on ``audit_staged`` of a sealing batch (its ids, else its age), with its
    arguments."""
    if not ids:
        return _STAGED_BEFORE, [staged_before, limit]
    if dialect.writes_in_cte:  # PostgreSQL: arrays
        return _BY_ID_ARRAY, [list(ids)]
    return _BY_ID.format(ids=", ".join("?" * len(ids))), [*ids]


def _columns(records: Sequence[AuditRecord]) -> list[list[Any]]:
    return [[r.seq for r in records], [r.prev_hash for r in records],
            [r.hash for r in records], [r.text for r in records]]


async def _vouch(q: Query, head: tuple[int, str], guard: ChainGuard | None,
                 read: tuple[tuple[int, str], list[Row]] | None = None) -> None:
    """Let ``guard`` vouch for ``head`` before it is extended: one read of the records since its
    known head, none when ``head`` is that head, nor when ``read`` holds them already (the
    records from the head it names to ``head``, read with it). What it raises rolls the caller back."""
    if guard is None:
        return
    while (start := guard.since(head)) is not None:
        if read is not None and read[0] == start and start[0] <= head[0]:
            rows = read[1]
        else:
            rows = await q.all(_SINCE, min(start[0], head[0]), max(start[0], head[0]))
        read = None
        try:
            guard.vouch(start, head, [_stored(r) for r in rows])
            return
        except StaleStart:
            continue  # the guard dropped the start it gave: the next one is its tip


async def _swap(
    q: Query, where: str, args: Sequence[Any], seal: Seal, guard: ChainGuard | None
) -> list[tuple[int, AuditRecord]] | None:
    """Seal the staged rows ``where`` selects optimistically (see ``_SWAP``); None when another
    writer moved the head first (nothing was written)."""
    rows, (last, prev_hash), read = await _read_head(q, where, args, guard)
    taken = sorted((int(r["id"]), str(r["entry"])) for r in rows if r["id"] is not None)
    if not taken:
        return []
    # Read without the lock: the swap below moves the head only if it is still this one.
    await _vouch(q, (last, prev_hash), guard, read)
    records = _chain(last, prev_hash, [(text, None) for _, text in taken], seal)
    row = await q.one(_SWAP, records[-1].seq, records[-1].hash, last, prev_hash,
                      [staged_id for staged_id, _ in taken], *_columns(records))
    if row is None or not row["moved"]:
        return None
    if int(row["taken"]) != len(taken):  # cannot happen: whoever took them moved the head
        raise StoreError("audit staged rows were sealed twice")
    return [(staged_id, record) for (staged_id, _), record in zip(taken, records, strict=True)]


async def _read_head(q: Query, where: str, args: Sequence[Any], guard: ChainGuard | None
                     ) -> tuple[list[Row], tuple[int, str],
                                tuple[tuple[int, str], list[Row]] | None]:
    """Without a lock: the staged rows ``where`` selects (one row with ``id`` NULL when none),
    the head, and the records ``guard`` will vouch from when the head is no longer the one it
    knows (``_READ_STAGED_AND_SINCE``), all in one statement."""
    known = None if guard is None else guard.reads_from()
    read: tuple[tuple[int, str], list[Row]] | None = None
    if known is None:
        rows = await q.all(_READ_STAGED.format(where=where), *args)
    else:
        rows, since = [], []
        for r in await q.all(_READ_STAGED_AND_SINCE.format(where=where), *args, known[0],
                             *known):
            if r["l_seq"] is None:
                rows.append(r)
            else:
                since.append({"seq": r["l_seq"], "prev_hash": r["l_prev"], "hash": r["l_hash"],
                              "entry": r["entry"]})
        read = (known, sorted(since, key=lambda r: int(r["seq"])))
    if not rows:
        raise StoreError("audit head row missing")
    return rows, (int(rows[0]["seq"]), str(rows[0]["hash"])), read


async def _swap_append(q: Query, stored: Sequence[Stored], seal: Seal,
                       guard: ChainGuard | None) -> list[AuditRecord] | None:
    """Append ``stored`` entries optimistically, as ``_swap`` seals staged rows (``_SWAP`` with
    no staged row to take; the head's read selects none: an empty id array): the head read
    without a lock, then one statement that inserts the
    records only if it moves the head from that one. None when another writer moved it first
    (nothing was written)."""
    _, head, read = await _read_head(q, _BY_ID_ARRAY, [[]], guard)
    await _vouch(q, head, guard, read)
    records = _chain(head[0], head[1], stored, seal)
    row = await q.one(_SWAP, records[-1].seq, records[-1].hash, head[0], head[1], [],
                      *_columns(records))
    return records if row is not None and row["moved"] else None


async def _link(
    q: Query, last: int, prev_hash: str, stored: Sequence[Stored], seal: Seal
) -> list[AuditRecord]:
    """Chain ``stored`` entries after record ``last`` with hash ``prev_hash``: seal each,
    insert them, move the head. The caller holds the head's lock."""
    records = _chain(last, prev_hash, stored, seal)
    end, prev_hash = records[-1].seq, records[-1].hash
    if q.dialect.writes_in_cte:
        await q.exec(_INSERT_ALL_AND_HEAD, *_columns(records), end, prev_hash)
        return records
    rows = [(r.seq, r.prev_hash, r.hash, r.text) for r in records]
    if len(rows) == 1:
        await q.exec(_INSERT, *rows[0])
    else:
        await q.exec_many(_INSERT, rows)
    await q.exec(_HEAD, end, prev_hash)
    return records


async def _checkpoint_in(q: Query, last: AuditRecord, signer: CheckpointSigner) -> None:
    """The checkpoint of ``last``, the head this transaction moves the chain to, stored in it
    when ``signer`` says one is due: first by its own count, then against the newest stored
    checkpoint (another worker's may cover it), read under the same lock. Every ``N`` records
    of a group commit thus cost a few statements of its transaction, not a transaction of their
    own with the head read and the chain verified again (``audit.checkpointer``). A checkpoint
    the store refuses is rolled back alone and reported to ``signer``: the records commit."""
    if not signer.due(last.seq):
        return
    row = await q.one(_NEWEST_CHECKPOINT)
    checkpoint = signer.sign(last.seq, last.hash, int(row["seq"]) if row is not None else 0)
    if checkpoint is None:
        return
    # Its own savepoint: a checkpoint the store refuses never takes the records down with it.
    await q.exec("SAVEPOINT audit_checkpoint")
    try:
        await q.one(_ADD_CHECKPOINT, checkpoint.seq, checkpoint.head_hash, checkpoint.at,
                    checkpoint.kid, checkpoint.sig)
    except StoreError as exc:
        await q.exec("ROLLBACK TO SAVEPOINT audit_checkpoint")
        signer.refused(checkpoint, exc)
    await q.exec("RELEASE SAVEPOINT audit_checkpoint")


class ChainBroken(StoreError):
    """``append_locked`` found the records from the guard's start to the head changed: nothing
    was written; the caller hands them to the guard's ``vouch`` (which raises)."""

    def __init__(self, start: tuple[int, str], head: tuple[int, str],
                 records: list[AuditRecord]) -> None:
        super().__init__("audit head not vouched for")
        self.start, self.head, self.records = start, head, records


async def append_locked(q: Query, entries: Sequence[dict[str, Any]], seal: Seal,
                        guard: ChainGuard | None, start: tuple[int, str] | None,
                        checkpoint: CheckpointSigner | None
                        ) -> tuple[list[AuditRecord], tuple[int, str] | None]:
    """``append_audit_many`` inside a transaction that holds the head's lock already (SQLite:
    its caller's BEGIN IMMEDIATE), on a connection whose statements never suspend: a whole group
    commit as one call on the writer's thread (``SqliteStore.append_audit_many`` drives it there).
    Returns the records and, when the head was not ``start``, the head the guard is to be told
    it verified (``ChainGuard.vouched``, on the caller's thread).

    ``start``: the guard's ``reads_from``, read by the caller. Here the guard is only asked
    ``broken`` (changing nothing, safe on that thread): on a contradiction nothing is written
    and ``ChainBroken`` carries what was read. The records and the checkpoint due are written as
    every other append writes them (``_link``, ``_checkpoint_in``: the checkpointer's ``due``
    reads a count; its ``sign`` and ``refused`` are safe on any thread)."""
    found = await q.one(_READ_HEAD)
    if found is None:
        raise StoreError("audit head row missing")
    head = (int(found["seq"]), str(found["hash"]))
    vouched = None
    if guard is not None and head != start:
        if start is None:
            raise StoreError("audit tip not started")
        since = [_stored(r) for r in await q.all(_SINCE, min(start[0], head[0]),
                                                 max(start[0], head[0]))]
        if guard.broken(start, head, since) is not None:
            raise ChainBroken(start, head, since)
        vouched = head
    records = await _link(q, head[0], head[1], [(dump_json(e), e) for e in entries], seal)
    if checkpoint is not None:
        await _checkpoint_in(q, records[-1], checkpoint)
    return records, vouched


def _stored(row: Row) -> AuditRecord:
    """A record as the tip checks it: its stored text, not decoded (``audit.record.verify`` with
    ``stored_text`` hashes the text as it is, and decodes only one whose hash differs)."""
    return AuditRecord.of(int(row["seq"]), str(row["prev_hash"]), str(row["hash"]), {},
                          str(row["entry"]))


def _record(row: Row) -> AuditRecord:
    text = str(row["entry"])
    return AuditRecord.of(int(row["seq"]), str(row["prev_hash"]), str(row["hash"]),
                          json.loads(text), text)


def _checkpoint(row: Row) -> AuditCheckpoint:
    return AuditCheckpoint(seq=int(row["seq"]), head_hash=str(row["head_hash"]), at=str(row["at"]),
                           kid=str(row["kid"]), sig=str(row["sig"]))

