"""Shared SQL for both backends: the operations, written once over a tiny ``Dialect`` and ``Conn``.

A backend supplies a ``Conn`` (three async calls that run one statement inside the current
transaction) and a ``Dialect`` (placeholder style, JSON encoding, null-safe equality). Everything
else — every statement, every conditional write and every conflict classification — lives here,
so SQLite and PostgreSQL cannot drift apart. Backend modules hold only what really differs:
connecting, beginning transactions, and wrapping driver errors.

Statements are assembled from module constants (column lists, placeholder runs, the dialect's
operator) and never from caller data, which is always bound as a parameter; hence the file-wide
exemption from ruff's S608 below.
"""
# ruff: noqa: S608

from __future__ import annotations

import base64
import binascii
import functools
import hmac
import json
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from importlib import resources
from typing import Any, Protocol

from .base import (
    TASK_STATES,
    TICKET_TRANSITIONS,
    AuditRecord,
    Conflict,
    EventRecord,
    Json,
    NotFound,
    ReviewRecord,
    Seal,
    SessionRecord,
    StoreError,
    TaskRecord,
    TicketRecord,
    Tx,
)

__all__ = ["Conn", "Dialect", "Migration", "SqlStore", "SqlTx", "dump_json", "migrations"]

Row = Mapping[str, Any]

MAX_LIST_LIMIT = 500


def dump_json(value: Any) -> str:
    """Compact, key-sorted JSON: the same value always gives the same text on both backends."""
    return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


@functools.lru_cache(maxsize=512)
def _numbered(sql: str) -> str:
    # Shared statements use '?' placeholders; PostgreSQL wants $1, $2, ... None of the shared
    # statements contains a '?' inside a literal, which is what makes this plain rewrite safe.
    parts = sql.split("?")
    out = [parts[0]]
    for i, part in enumerate(parts[1:], start=1):
        out.append(f"${i}{part}")
    return "".join(out)


@dataclass(frozen=True, slots=True)
class Dialect:
    """What differs in the SQL text and values between the backends."""

    name: str
    numbered_params: bool  # '$1' (PostgreSQL) instead of '?' (SQLite)
    # How a JSON value goes into / comes out of a JSON column. PostgreSQL registers a jsonb codec
    # on its connections, so both are the identity there; SQLite stores text.
    json_in: Callable[[Any], Any]
    json_out: Callable[[Any], Any]
    not_distinct: str  # null-safe equality operator

    def sql(self, text: str) -> str:
        return _numbered(text) if self.numbered_params else text


class Conn(Protocol):
    """One connection inside an open transaction; implementations wrap driver errors."""

    async def execute(self, sql: str, args: Sequence[Any]) -> None: ...
    async def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None: ...
    async def fetchone(self, sql: str, args: Sequence[Any]) -> Row | None: ...
    async def fetchall(self, sql: str, args: Sequence[Any]) -> list[Row]: ...


# ----------------------------------------------------------------------------------- migrations


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str


def migrations(dialect_dir: str) -> list[Migration]:
    """The ``NNNN_name.sql`` files of ``migrations/<dialect_dir>/``, in version order."""
    root = resources.files(__package__).joinpath("migrations", dialect_dir)
    found: list[Migration] = []
    for entry in root.iterdir():
        name = entry.name
        if not name.endswith(".sql"):
            continue
        prefix = name.split("_", 1)[0]
        if not prefix.isdigit():
            raise StoreError(f"migration file without a version prefix: {name}")
        found.append(Migration(int(prefix), name, entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise StoreError(f"duplicate migration versions in {dialect_dir}")
    return found


def pending_migrations(available: list[Migration], applied: set[int]) -> list[Migration]:
    """Migrations still to apply; refuses a database migrated by a newer build (fail closed)."""
    known = {m.version for m in available}
    unknown = sorted(applied - known)
    if unknown:
        raise StoreError(f"database schema version {unknown[-1]} is newer than this build")
    return [m for m in available if m.version not in applied]


# ---------------------------------------------------------------------------------- row mapping

_TICKET_COLUMNS = (
    "id, subject_id, env, resource, resource_hash, action, command_hash, nonce_hash, state, "
    "requested_by, reason, created_at, pending_until, approved_at, expires_at, consumed_at, "
    "consumed_correlation_id, closed_by, closed_at, approval"
)
_SESSION_COLUMNS = (
    "id, subject_id, kind, authn_method, auth_time, created_at, expires_at, step_up_at, "
    "step_up_method, revoked_at"
)
_TASK_COLUMNS = "id, state, progress, result, created_by, created_at, updated_at, last_seq"
_EVENT_COLUMNS = "task_id, seq, kind, at, actor, data"


def _opt_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _session(row: Row) -> SessionRecord:
    return SessionRecord(
        id=row["id"],
        subject_id=row["subject_id"],
        kind=row["kind"],
        authn_method=row["authn_method"],
        auth_time=float(row["auth_time"]),
        created_at=float(row["created_at"]),
        expires_at=float(row["expires_at"]),
        step_up_at=_opt_float(row["step_up_at"]),
        step_up_method=row["step_up_method"],
        revoked_at=_opt_float(row["revoked_at"]),
    )


def _review(row: Row) -> ReviewRecord:
    return ReviewRecord(
        reviewer=row["reviewer"],
        decision=row["decision"],
        group=row["group_name"],
        reason=row["reason"],
        at=float(row["at"]),
    )


def _task(row: Row, d: Dialect) -> TaskRecord:
    result = row["result"]
    return TaskRecord(
        id=row["id"],
        state=row["state"],
        progress=int(row["progress"]),
        result=None if result is None else d.json_out(result),
        created_by=row["created_by"],
        created_at=float(row["created_at"]),
        updated_at=float(row["updated_at"]),
        last_seq=int(row["last_seq"]),
    )


def _event(row: Row, d: Dialect) -> EventRecord:
    return EventRecord(
        task_id=row["task_id"],
        seq=int(row["seq"]),
        kind=row["kind"],
        at=float(row["at"]),
        actor=row["actor"],
        data=d.json_out(row["data"]),
    )


def _audit(row: Row) -> AuditRecord:
    return AuditRecord(
        seq=int(row["seq"]),
        prev_hash=row["prev_hash"],
        hash=row["hash"],
        entry=json.loads(row["entry"]),
    )


def _encode_cursor(created_at: float, id: str) -> str:
    raw = json.dumps([created_at, id], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_cursor(cursor: str) -> tuple[float, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        created_at, id = json.loads(raw)
        if not isinstance(id, str) or not isinstance(created_at, int | float):
            raise TypeError
        return float(created_at), id
    except (binascii.Error, ValueError, TypeError) as exc:
        raise ValueError("invalid ticket list cursor") from exc


# ------------------------------------------------------------------------------------ operations


class SqlTx:
    """The operations of ``base.Tx`` over one connection inside one open transaction."""

    def __init__(self, conn: Conn, dialect: Dialect) -> None:
        self._conn = conn
        self._d = dialect
        self._open = True

    def _close(self) -> None:
        # A Tx must not outlive its transaction: a late write would run outside it (or on a
        # connection already handed to someone else).
        self._open = False

    def _check(self) -> None:
        if not self._open:
            raise StoreError("transaction is closed")

    async def _exec(self, sql: str, *args: Any) -> None:
        self._check()
        await self._conn.execute(self._d.sql(sql), args)

    async def _exec_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        self._check()
        await self._conn.executemany(self._d.sql(sql), rows)

    async def _one(self, sql: str, *args: Any) -> Row | None:
        self._check()
        return await self._conn.fetchone(self._d.sql(sql), args)

    async def _all(self, sql: str, *args: Any) -> list[Row]:
        self._check()
        return await self._conn.fetchall(self._d.sql(sql), args)

    # ------------------------------------------------------------------------------- sessions

    async def create_session(self, rec: SessionRecord) -> None:
        row = await self._one(
            f"INSERT INTO sessions ({_SESSION_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (id) DO NOTHING RETURNING id",
            rec.id, rec.subject_id, rec.kind, rec.authn_method, rec.auth_time, rec.created_at,
            rec.expires_at, rec.step_up_at, rec.step_up_method, rec.revoked_at,
        )  # fmt: skip
        if row is None:
            raise Conflict("duplicate_id")

    async def get_session(self, id: str) -> SessionRecord | None:
        row = await self._one(f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE id = ?", id)
        return None if row is None else _session(row)

    async def revoke_session(self, id: str, at: float) -> bool:
        row = await self._one(
            "UPDATE sessions SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL RETURNING id",
            at, id,
        )  # fmt: skip
        return row is not None

    async def record_step_up(self, id: str, at: float, method: str) -> SessionRecord:
        row = await self._one(
            "UPDATE sessions SET step_up_at = ?, step_up_method = ? "
            "WHERE id = ? AND revoked_at IS NULL AND expires_at > ? "
            f"RETURNING {_SESSION_COLUMNS}",
            at, method, id, at,
        )  # fmt: skip
        if row is not None:
            return _session(row)
        current = await self.get_session(id)
        if current is None:
            raise NotFound("session", id)
        if current.revoked_at is not None:
            raise Conflict("session_revoked")
        raise Conflict("session_expired")

    # ------------------------------------------------------------------------ one-time values

    async def claim_once(self, namespace: str, key: str, expires_at: float, now: float) -> bool:
        # One statement decides: insert, or take over a row whose claim has expired. A live
        # claim makes the conditional DO UPDATE a no-op, so RETURNING yields nothing.
        row = await self._one(
            "INSERT INTO once_claims (namespace, key, expires_at, claimed_at) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (namespace, key) DO UPDATE "
            "SET expires_at = excluded.expires_at, claimed_at = excluded.claimed_at "
            "WHERE once_claims.expires_at <= excluded.claimed_at "
            "RETURNING key",
            namespace, key, expires_at, now,
        )  # fmt: skip
        return row is not None

    # ------------------------------------------------------------------------ login throttling

    async def record_failure(self, key: str, at: float) -> None:
        await self._exec("INSERT INTO login_failures (key, at) VALUES (?, ?)", key, at)

    async def count_failures(self, key: str, since: float) -> int:
        row = await self._one(
            "SELECT COUNT(*) AS n FROM login_failures WHERE key = ? AND at >= ?", key, since
        )
        return 0 if row is None else int(row["n"])

    async def clear_failures(self, key: str) -> None:
        await self._exec("DELETE FROM login_failures WHERE key = ?", key)

    # ------------------------------------------------------------------------- housekeeping

    async def purge_expired(
        self, now: float, failures_before: float, sessions_before: float
    ) -> tuple[int, int, int]:
        # An expired claim no longer blocks anything (claim_once takes it over), a failure older
        # than the throttling window is never counted again, and no token of an expired session
        # verifies: all three only grow the tables. (Audit records keep session ids as text.)
        claims = await self._all("DELETE FROM once_claims WHERE expires_at <= ? RETURNING 1", now)
        failures = await self._all(
            "DELETE FROM login_failures WHERE at < ? RETURNING 1", failures_before
        )
        sessions = await self._all(
            "DELETE FROM sessions WHERE expires_at < ? RETURNING 1", min(now, sessions_before)
        )
        return len(claims), len(failures), len(sessions)

    # ------------------------------------------------------------------------------- tickets

    async def _reviews(self, ticket_ids: Sequence[str]) -> dict[str, tuple[ReviewRecord, ...]]:
        if not ticket_ids:
            return {}
        marks = ", ".join("?" * len(ticket_ids))
        rows = await self._all(
            "SELECT ticket_id, reviewer, decision, group_name, reason, at FROM ticket_reviews "
            f"WHERE ticket_id IN ({marks}) ORDER BY ticket_id, pos",
            *ticket_ids,
        )
        grouped: dict[str, list[ReviewRecord]] = {}
        for row in rows:
            grouped.setdefault(row["ticket_id"], []).append(_review(row))
        return {k: tuple(v) for k, v in grouped.items()}

    def _ticket(self, row: Row, reviews: tuple[ReviewRecord, ...]) -> TicketRecord:
        d = self._d
        return TicketRecord(
            id=row["id"],
            subject_id=row["subject_id"],
            env=row["env"],
            resource=d.json_out(row["resource"]),
            resource_hash=row["resource_hash"],
            action=row["action"],
            command_hash=row["command_hash"],
            nonce_hash=row["nonce_hash"],
            state=row["state"],
            requested_by=row["requested_by"],
            reason=row["reason"],
            created_at=float(row["created_at"]),
            pending_until=float(row["pending_until"]),
            approved_at=_opt_float(row["approved_at"]),
            expires_at=_opt_float(row["expires_at"]),
            consumed_at=_opt_float(row["consumed_at"]),
            consumed_correlation_id=row["consumed_correlation_id"],
            closed_by=row["closed_by"],
            approval=d.json_out(row["approval"]),
            reviews=reviews,
            closed_at=_opt_float(row["closed_at"]),
        )

    async def _tickets(self, rows: list[Row]) -> list[TicketRecord]:
        reviews = await self._reviews([r["id"] for r in rows])
        return [self._ticket(r, reviews.get(r["id"], ())) for r in rows]

    async def create_ticket(self, rec: TicketRecord) -> None:
        if rec.state != "pending" or rec.reviews:
            # Tickets are born pending and reviewed through add_review, so the state machine
            # (and the one-review-per-reviewer rule) cannot be skipped at creation.
            raise ValueError("a ticket is created pending and without reviews")
        d = self._d
        row = await self._one(
            f"INSERT INTO tickets ({_TICKET_COLUMNS}) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (id) DO NOTHING RETURNING id",
            rec.id, rec.subject_id, rec.env, d.json_in(rec.resource), rec.resource_hash,
            rec.action, rec.command_hash, rec.nonce_hash, rec.state, rec.requested_by,
            rec.reason, rec.created_at, rec.pending_until, rec.approved_at, rec.expires_at,
            rec.consumed_at, rec.consumed_correlation_id, rec.closed_by, rec.closed_at,
            d.json_in(rec.approval),
        )  # fmt: skip
        if row is None:
            raise Conflict("duplicate_id")

    async def get_ticket(self, id: str) -> TicketRecord | None:
        row = await self._one(f"SELECT {_TICKET_COLUMNS} FROM tickets WHERE id = ?", id)
        if row is None:
            return None
        return (await self._tickets([row]))[0]

    async def list_tickets(
        self,
        state: str | None = None,
        env: str | None = None,
        subject_id: str | None = None,
        limit: int = 50,
        before: str | None = None,
    ) -> tuple[list[TicketRecord], str | None]:
        if limit < 1:
            raise ValueError("limit must be positive")
        limit = min(limit, MAX_LIST_LIMIT)
        where: list[str] = []
        args: list[Any] = []
        for column, value in (("state", state), ("env", env), ("subject_id", subject_id)):
            if value is not None:
                where.append(f"{column} = ?")
                args.append(value)
        if before is not None:
            # Keyset pagination on (created_at, id): stable while new tickets arrive.
            created_at, id = _decode_cursor(before)
            where.append("(created_at < ? OR (created_at = ? AND id < ?))")
            args += [created_at, created_at, id]
        clause = f"WHERE {' AND '.join(where)} " if where else ""
        rows = await self._all(
            f"SELECT {_TICKET_COLUMNS} FROM tickets {clause}"
            "ORDER BY created_at DESC, id DESC LIMIT ?",
            *args, limit + 1,
        )  # fmt: skip
        more = len(rows) > limit
        rows = rows[:limit]
        cursor = _encode_cursor(float(rows[-1]["created_at"]), rows[-1]["id"]) if more else None
        return await self._tickets(rows), cursor

    async def add_review(
        self,
        id: str,
        review: ReviewRecord,
        new_state: str | None,
        approved_expires_at: float | None,
        now: float,
    ) -> TicketRecord:
        if new_state == "approved":
            if approved_expires_at is None:
                raise ValueError("approving needs approved_expires_at")
            sets = "state = 'approved', approved_at = ?, expires_at = ?"
            set_args: list[Any] = [now, approved_expires_at]
        elif new_state == "rejected":
            sets = "state = 'rejected', closed_at = ?, closed_by = ?"
            set_args = [now, review.reviewer]
        elif new_state is None:
            # No decision yet (quorum not reached): the no-op SET still takes the row lock, so
            # concurrent reviews of one ticket are serialised.
            sets, set_args = "state = state", []
        else:
            raise ValueError(f"a review cannot move a ticket to {new_state!r}")
        if review.decision not in ("approve", "reject"):
            raise ValueError(f"invalid review decision {review.decision!r}")
        row = await self._one(
            f"UPDATE tickets SET {sets} WHERE id = ? AND state = 'pending' AND pending_until > ? "
            f"RETURNING {_TICKET_COLUMNS}",
            *set_args, id, now,
        )  # fmt: skip
        if row is None:
            current = await self._one("SELECT state FROM tickets WHERE id = ?", id)
            if current is None:
                raise NotFound("ticket", id)
            if current["state"] != "pending":
                raise Conflict("not_pending", current_state=current["state"])
            raise Conflict("expired", current_state="pending")
        inserted = await self._one(
            "INSERT INTO ticket_reviews "
            "(ticket_id, reviewer, pos, decision, group_name, reason, at) "
            "VALUES (?, ?, (SELECT COUNT(*) + 1 FROM ticket_reviews WHERE ticket_id = ?), "
            "?, ?, ?, ?) ON CONFLICT (ticket_id, reviewer) DO NOTHING RETURNING reviewer",
            id, review.reviewer, id, review.decision, review.group, review.reason, review.at,
        )  # fmt: skip
        if inserted is None:
            # Raising rolls back the state change made above in the same transaction.
            raise Conflict("duplicate_review", current_state="pending")
        return (await self._tickets([row]))[0]

    async def transition_ticket(
        self, id: str, from_states: tuple[str, ...], to_state: str, at: float, by: str
    ) -> TicketRecord:
        if to_state in ("approved", "consumed"):
            raise ValueError(f"use {'add_review' if to_state == 'approved' else 'consume_ticket'}")
        if not from_states:
            raise ValueError("from_states is empty")
        for state in from_states:
            if to_state not in TICKET_TRANSITIONS.get(state, frozenset()):
                raise ValueError(f"illegal ticket transition {state} -> {to_state}")
        marks = ", ".join("?" * len(from_states))
        row = await self._one(
            "UPDATE tickets SET state = ?, closed_at = ?, closed_by = ? "
            f"WHERE id = ? AND state IN ({marks}) RETURNING {_TICKET_COLUMNS}",
            to_state, at, by, id, *from_states,
        )  # fmt: skip
        if row is None:
            current = await self._one("SELECT state FROM tickets WHERE id = ?", id)
            if current is None:
                raise NotFound("ticket", id)
            raise Conflict("state_conflict", current_state=current["state"])
        return (await self._tickets([row]))[0]

    async def consume_ticket(
        self,
        id: str,
        *,
        nonce_hash: str,
        subject_id: str,
        env: str,
        action: str,
        resource_hash: str,
        command_hash: str | None,
        now: float,
        correlation_id: str,
    ) -> TicketRecord:
        # The decision is this one conditional UPDATE: of any number of concurrent attempts on
        # any number of processes or replicas, the database lets exactly one match the row.
        row = await self._one(
            "UPDATE tickets SET state = 'consumed', consumed_at = ?, consumed_correlation_id = ? "
            "WHERE id = ? AND state = 'approved' AND expires_at > ? AND nonce_hash = ? "
            "AND subject_id = ? AND env = ? AND action = ? AND resource_hash = ? "
            f"AND command_hash {self._d.not_distinct} ? "
            f"RETURNING {_TICKET_COLUMNS}",
            now, correlation_id, id, now, nonce_hash, subject_id, env, action, resource_hash,
            command_hash,
        )  # fmt: skip
        if row is not None:
            return (await self._tickets([row]))[0]
        # Miss: re-read only to say why. Nothing here can change the outcome.
        current = await self._one(f"SELECT {_TICKET_COLUMNS} FROM tickets WHERE id = ?", id)
        if current is None:
            raise NotFound("ticket", id)
        state = current["state"]
        if state == "consumed":
            raise Conflict("ticket_consumed", current_state=state)
        if state == "expired" or (
            state == "approved" and (current["expires_at"] is None or current["expires_at"] <= now)
        ):
            raise Conflict("ticket_expired", current_state=state)
        if state != "approved":
            raise Conflict("ticket_not_approved", current_state=state)
        presented = {
            "nonce_hash": nonce_hash,
            "subject_id": subject_id,
            "env": env,
            "action": action,
            "resource_hash": resource_hash,
            "command_hash": command_hash,
        }
        mismatched = tuple(
            name for name, value in presented.items() if not _same(current[name], value)
        )
        raise Conflict("ticket_binding_mismatch", current_state=state, fields=mismatched)

    async def expire_tickets(self, now: float) -> list[TicketRecord]:
        rows = await self._all(
            "UPDATE tickets SET state = 'expired', closed_at = ? "
            "WHERE (state = 'pending' AND pending_until <= ?) "
            "OR (state = 'approved' AND expires_at <= ?) "
            f"RETURNING {_TICKET_COLUMNS}",
            now, now, now,
        )  # fmt: skip
        rows = sorted(rows, key=lambda r: (r["created_at"], r["id"]))
        return await self._tickets(rows)

    # --------------------------------------------------------------------------------- tasks

    async def ensure_task(self, id: str, created_by: str, at: float) -> TaskRecord:
        await self._exec(
            "INSERT INTO tasks (id, state, progress, result, created_by, created_at, updated_at, "
            "last_seq) VALUES (?, 'pending', 0, NULL, ?, ?, ?, 0) ON CONFLICT (id) DO NOTHING",
            id, created_by, at, at,
        )  # fmt: skip
        task = await self.get_task(id)
        if task is None:  # pragma: no cover - the row was just inserted or already there
            raise StoreError("task vanished")
        return task

    async def get_task(self, id: str) -> TaskRecord | None:
        row = await self._one(f"SELECT {_TASK_COLUMNS} FROM tasks WHERE id = ?", id)
        return None if row is None else _task(row, self._d)

    async def append_event(
        self,
        task_id: str,
        kind: str,
        actor: str,
        data: Json,
        at: float,
        *,
        state: str | None = None,
        progress: int | None = None,
        result: Json | None = None,
    ) -> EventRecord:
        if state is not None and state not in TASK_STATES:
            raise ValueError(f"invalid task state {state!r}")
        d = self._d
        # Incrementing last_seq on the task row locks it until commit, so concurrent writers in
        # any process queue up here and seqs come out gap-free: a rolled-back append rolls back
        # its increment too.
        row = await self._one(
            "UPDATE tasks SET last_seq = last_seq + 1, updated_at = ?, "
            "state = COALESCE(?, state), progress = COALESCE(?, progress), "
            "result = COALESCE(?, result) WHERE id = ? RETURNING last_seq",
            at, state, progress, None if result is None else d.json_in(result), task_id,
        )  # fmt: skip
        if row is None:
            raise NotFound("task", task_id)
        seq = int(row["last_seq"])
        await self._exec(
            f"INSERT INTO task_events ({_EVENT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)",
            task_id, seq, kind, at, actor, d.json_in(data),
        )  # fmt: skip
        return EventRecord(task_id=task_id, seq=seq, kind=kind, at=float(at), actor=actor,
                           data=data)  # fmt: skip

    async def list_events(
        self, task_id: str, after_seq: int = 0, limit: int = 100
    ) -> list[EventRecord]:
        if limit < 1:
            raise ValueError("limit must be positive")
        rows = await self._all(
            f"SELECT {_EVENT_COLUMNS} FROM task_events WHERE task_id = ? AND seq > ? "
            "ORDER BY seq LIMIT ?",
            task_id, after_seq, min(limit, MAX_LIST_LIMIT),
        )  # fmt: skip
        return [_event(r, self._d) for r in rows]

    # --------------------------------------------------------------------------------- audit

    async def append_audit(self, entry: dict[str, Any], seal: Seal) -> AuditRecord:
        # Bumping the single head row both reserves the next seq and locks the head until commit
        # (a row lock on PostgreSQL, the write lock on SQLite): appends are serialised across
        # processes and replicas, and RETURNING still shows the previous hash.
        head = await self._one(
            "UPDATE audit_head SET seq = seq + 1 WHERE id = 1 RETURNING seq, hash"
        )
        if head is None:
            raise StoreError("audit head row missing")
        seq, prev_hash = int(head["seq"]), str(head["hash"])
        text = dump_json(entry)
        # Seal what will be read back, so verification recomputes from identical data.
        stored: dict[str, Any] = json.loads(text)
        digest = seal(seq, prev_hash, stored)
        await self._exec(
            "INSERT INTO audit_log (seq, prev_hash, hash, entry) VALUES (?, ?, ?, ?)",
            seq, prev_hash, digest, text,
        )  # fmt: skip
        await self._exec("UPDATE audit_head SET hash = ? WHERE id = 1", digest)
        return AuditRecord(seq=seq, prev_hash=prev_hash, hash=digest, entry=stored)

    async def append_audit_many(
        self, entries: Sequence[dict[str, Any]], seal: Seal
    ) -> list[AuditRecord]:
        # Group commit: one head bump reserves len(entries) seqs (and takes the head lock), the
        # chain is sealed here in order, and one batched INSERT writes every record. Three round
        # trips for the whole batch instead of three per record.
        if not entries:
            return []
        head = await self._one(
            "UPDATE audit_head SET seq = seq + ? WHERE id = 1 RETURNING seq, hash", len(entries)
        )
        if head is None:
            raise StoreError("audit head row missing")
        last, prev_hash = int(head["seq"]), str(head["hash"])
        records: list[AuditRecord] = []
        rows: list[tuple[Any, ...]] = []
        for seq, entry in enumerate(entries, start=last - len(entries) + 1):
            text = dump_json(entry)
            stored: dict[str, Any] = json.loads(text)
            digest = seal(seq, prev_hash, stored)
            records.append(AuditRecord(seq=seq, prev_hash=prev_hash, hash=digest, entry=stored))
            rows.append((seq, prev_hash, digest, text))
            prev_hash = digest
        await self._exec_many(
            "INSERT INTO audit_log (seq, prev_hash, hash, entry) VALUES (?, ?, ?, ?)", rows
        )
        await self._exec("UPDATE audit_head SET hash = ? WHERE id = 1", prev_hash)
        return records

    async def audit_range(self, after_seq: int = 0, limit: int = 100) -> list[AuditRecord]:
        if limit < 1:
            raise ValueError("limit must be positive")
        rows = await self._all(
            "SELECT seq, prev_hash, hash, entry FROM audit_log WHERE seq > ? ORDER BY seq LIMIT ?",
            after_seq, min(limit, MAX_LIST_LIMIT),
        )  # fmt: skip
        return [_audit(r) for r in rows]

    async def audit_head(self) -> tuple[int, str]:
        row = await self._one("SELECT seq, hash FROM audit_head WHERE id = 1")
        if row is None:
            raise StoreError("audit head row missing")
        return int(row["seq"]), str(row["hash"])


def _same(stored: Any, presented: Any) -> bool:
    if stored is None or presented is None:
        return stored is presented
    # Constant-time for the nonce hash; harmless for the other bindings.
    return hmac.compare_digest(str(stored).encode(), str(presented).encode())


# --------------------------------------------------------------------------------------- store


class SqlStore:
    """The ``base.Store`` surface: each operation is its own transaction over ``_transaction``."""

    dialect: Dialect

    def _transaction(self, *, write: bool) -> AbstractAsyncContextManager[Conn]:
        """Open a transaction on a pooled connection (backend-specific); commit on clean exit."""
        raise NotImplementedError

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Tx]:
        """Group operations: all commit together, or an exception rolls them all back.

        Do not call the store's own methods while holding a transaction: they run on another
        connection and, on SQLite, would wait for the lock this transaction holds.
        """
        async with self._tx(write=True) as tx:
            yield tx

    @asynccontextmanager
    async def _tx(self, *, write: bool = True) -> AsyncIterator[SqlTx]:
        async with self._transaction(write=write) as conn:
            tx = SqlTx(conn, self.dialect)
            try:
                yield tx
            finally:
                tx._close()

    # sessions
    async def create_session(self, rec: SessionRecord) -> None:
        async with self._tx() as tx:
            await tx.create_session(rec)

    async def get_session(self, id: str) -> SessionRecord | None:
        async with self._tx(write=False) as tx:
            return await tx.get_session(id)

    async def revoke_session(self, id: str, at: float) -> bool:
        async with self._tx() as tx:
            return await tx.revoke_session(id, at)

    async def record_step_up(self, id: str, at: float, method: str) -> SessionRecord:
        async with self._tx() as tx:
            return await tx.record_step_up(id, at, method)

    # one-time values
    async def claim_once(self, namespace: str, key: str, expires_at: float, now: float) -> bool:
        async with self._tx() as tx:
            return await tx.claim_once(namespace, key, expires_at, now)

    # login throttling
    async def record_failure(self, key: str, at: float) -> None:
        async with self._tx() as tx:
            await tx.record_failure(key, at)

    async def count_failures(self, key: str, since: float) -> int:
        async with self._tx(write=False) as tx:
            return await tx.count_failures(key, since)

    async def clear_failures(self, key: str) -> None:
        async with self._tx() as tx:
            await tx.clear_failures(key)

    async def purge_expired(
        self, now: float, failures_before: float, sessions_before: float
    ) -> tuple[int, int, int]:
        async with self._tx() as tx:
            return await tx.purge_expired(now, failures_before, sessions_before)

    # tickets
    async def create_ticket(self, rec: TicketRecord) -> None:
        async with self._tx() as tx:
            await tx.create_ticket(rec)

    async def get_ticket(self, id: str) -> TicketRecord | None:
        async with self._tx(write=False) as tx:
            return await tx.get_ticket(id)

    async def list_tickets(
        self,
        state: str | None = None,
        env: str | None = None,
        subject_id: str | None = None,
        limit: int = 50,
        before: str | None = None,
    ) -> tuple[list[TicketRecord], str | None]:
        async with self._tx(write=False) as tx:
            return await tx.list_tickets(state, env, subject_id, limit, before)

    async def add_review(
        self,
        id: str,
        review: ReviewRecord,
        new_state: str | None,
        approved_expires_at: float | None,
        now: float,
    ) -> TicketRecord:
        async with self._tx() as tx:
            return await tx.add_review(id, review, new_state, approved_expires_at, now)

    async def transition_ticket(
        self, id: str, from_states: tuple[str, ...], to_state: str, at: float, by: str
    ) -> TicketRecord:
        async with self._tx() as tx:
            return await tx.transition_ticket(id, from_states, to_state, at, by)

    async def consume_ticket(
        self,
        id: str,
        *,
        nonce_hash: str,
        subject_id: str,
        env: str,
        action: str,
        resource_hash: str,
        command_hash: str | None,
        now: float,
        correlation_id: str,
    ) -> TicketRecord:
        async with self._tx() as tx:
            return await tx.consume_ticket(
                id,
                nonce_hash=nonce_hash,
                subject_id=subject_id,
                env=env,
                action=action,
                resource_hash=resource_hash,
                command_hash=command_hash,
                now=now,
                correlation_id=correlation_id,
            )

    async def expire_tickets(self, now: float) -> list[TicketRecord]:
        async with self._tx() as tx:
            return await tx.expire_tickets(now)

    # tasks
    async def ensure_task(self, id: str, created_by: str, at: float) -> TaskRecord:
        async with self._tx() as tx:
            return await tx.ensure_task(id, created_by, at)

    async def get_task(self, id: str) -> TaskRecord | None:
        async with self._tx(write=False) as tx:
            return await tx.get_task(id)

    async def append_event(
        self,
        task_id: str,
        kind: str,
        actor: str,
        data: Json,
        at: float,
        *,
        state: str | None = None,
        progress: int | None = None,
        result: Json | None = None,
    ) -> EventRecord:
        async with self._tx() as tx:
            return await tx.append_event(
                task_id, kind, actor, data, at, state=state, progress=progress, result=result
            )

    async def list_events(
        self, task_id: str, after_seq: int = 0, limit: int = 100
    ) -> list[EventRecord]:
        async with self._tx(write=False) as tx:
            return await tx.list_events(task_id, after_seq, limit)

    # audit
    async def append_audit(self, entry: dict[str, Any], seal: Seal) -> AuditRecord:
        async with self._tx() as tx:
            return await tx.append_audit(entry, seal)

    async def append_audit_many(
        self, entries: Sequence[dict[str, Any]], seal: Seal
    ) -> list[AuditRecord]:
        async with self._tx() as tx:
            return await tx.append_audit_many(entries, seal)

    async def audit_range(self, after_seq: int = 0, limit: int = 100) -> list[AuditRecord]:
        async with self._tx(write=False) as tx:
            return await tx.audit_range(after_seq, limit)

    async def audit_head(self) -> tuple[int, str]:
        async with self._tx(write=False) as tx:
            return await tx.audit_head()
