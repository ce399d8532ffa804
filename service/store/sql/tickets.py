"""Approval tickets and their reviews in SQL: every state change is one conditional UPDATE, and
writes its outbox event (``approvals.events``) in the same transaction."""
# ruff: noqa: S608  (statements are built from module constants; caller data is always bound)

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

from ...approvals.binding import BINDING_FIELDS, Binding, mismatched
from ...approvals.events import SYSTEM_ACTOR, ticket_event
from ...approvals.states import TICKET_TRANSITIONS
from ..base import (
    Conflict,
    NotFound,
    ReviewRecord,
    RunRead,
    TaskRead,
    TicketRecord,
)
from .core import MAX_LIST_LIMIT, Query, Row, Unit, opt_float
from .outbox import insert_event
from .sessions import COLUMNS as SESSION_COLUMNS
from .sessions import session_of
from .tasks import TASK_COLUMNS, task_of

__all__ = ["COLUMNS", "TicketSql", "consume_refusal"]

#: A ticket row's columns (the PostgreSQL chain run reads the current ticket with them too).
COLUMNS = (
    "id, subject_id, env, resource, resource_hash, action, command_hash, nonce_hash, state, "
    "requested_by, reason, created_at, pending_until, approved_at, expires_at, consumed_at, "
    "consumed_correlation_id, closed_by, closed_at, approval, command"
)


def _aliased(table: str, columns: str, prefix: str = "") -> str:
    """``table``'s ``columns`` for a select list, each named with ``prefix`` (none: as is)."""
    names = [c.strip() for c in columns.split(",")]
    return ", ".join(f"{table}.{c} AS {prefix}{c}" if prefix else f"{table}.{c}" for c in names)


# The ticket's columns and its reviews' (r_): one row per review, or one with NULL reviews.
_TICKET_AND_REVIEWS = (_aliased("t", COLUMNS) + ", "
                       + _aliased("r", "reviewer, decision, group_name, reason, at", "r_"))
# A ticket with its reviews in one statement: ``source`` is the table or a CTE of ticket rows,
# named t; ``extra``: more columns, or nothing.
_WITH_REVIEWS = (
    "SELECT " + _TICKET_AND_REVIEWS + "{extra} "
    "FROM {source} t LEFT JOIN ticket_reviews r ON r.ticket_id = t.id{where} ORDER BY r.pos"
)
_GET = _WITH_REVIEWS.format(extra="", source="tickets", where=" WHERE t.id = ?")
# The same and, on every row, the task named by the first argument (k_ NULLs: no such task).
_GET_WITH_TASK = _WITH_REVIEWS.format(
    extra=", " + _aliased("k", TASK_COLUMNS, "k_"),
    source="tickets", where=" LEFT JOIN tasks k ON k.id = ? WHERE t.id = ?",
)
# A run's reads in one statement (``get_run_read``): the session (s_ columns), the ticket with
# its reviews (one row per review) and the task (k_), each NULL where there is no such row.
# Driven by a one-row source, so a missing session or ticket still leaves the others.
_RUN_READ = (
    f"SELECT {_aliased('s', SESSION_COLUMNS, 's_')}, {_TICKET_AND_REVIEWS}, "
    f"{_aliased('k', TASK_COLUMNS, 'k_')} FROM (SELECT 1 AS one) o "
    "LEFT JOIN sessions s ON s.id = ? "
    "LEFT JOIN tickets t ON t.id = ? LEFT JOIN ticket_reviews r ON r.ticket_id = t.id "
    "LEFT JOIN tasks k ON k.id = ? ORDER BY r.pos"
)

_CONSUME_SET = (
    "UPDATE tickets SET state = 'consumed', consumed_at = ?, consumed_correlation_id = ? "
    "WHERE id = ? AND state = 'approved' AND expires_at > ? AND nonce_hash = ? "
    "AND subject_id = ? AND env = ? AND action = ? AND resource_hash = ? "
    # A ticket that binds no command accepts any (approvals.binding.mismatched).
    "AND (command_hash IS NULL OR command_hash = ?) "
    f"RETURNING {COLUMNS}"
)
# PostgreSQL: the consuming UPDATE and the reviews of the ticket it consumed, in one round trip.
_CONSUME_WITH_REVIEWS = (
    f"WITH consumed AS ({_CONSUME_SET}) " + _WITH_REVIEWS.format(extra="", source="consumed", where="")
)


def _joined(q: Query, rows: Sequence[Row]) -> TicketRecord | None:
    """The ticket of ``_WITH_REVIEWS`` rows (all of one ticket), or None for no rows."""
    if not rows:
        return None
    reviews = tuple(_review(r, "r_") for r in rows if r["r_reviewer"] is not None)
    return _ticket(q, rows[0], reviews)


def _review(row: Row, prefix: str = "") -> ReviewRecord:
    """A review from ``row``'s ``ticket_reviews`` columns (named with ``prefix``)."""
    return ReviewRecord(
        reviewer=row[prefix + "reviewer"],
        decision=row[prefix + "decision"],
        group=row[prefix + "group_name"],
        reason=row[prefix + "reason"],
        at=float(row[prefix + "at"]),
    )


def _ticket(q: Query, row: Row, reviews: tuple[ReviewRecord, ...]) -> TicketRecord:
    d = q.dialect
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
        approved_at=opt_float(row["approved_at"]),
        expires_at=opt_float(row["expires_at"]),
        consumed_at=opt_float(row["consumed_at"]),
        consumed_correlation_id=row["consumed_correlation_id"],
        closed_by=row["closed_by"],
        approval=d.json_out(row["approval"]),
        reviews=reviews,
        closed_at=opt_float(row["closed_at"]),
        command=None if row["command"] is None else d.json_out(row["command"]),
    )


async def _tickets(q: Query, rows: Sequence[Row]) -> list[TicketRecord]:
    """Ticket rows with their reviews (one extra query for all of them)."""
    grouped: dict[str, list[ReviewRecord]] = {}
    if rows:
        ids = [r["id"] for r in rows]
        marks = ", ".join("?" * len(ids))
        for review in await q.all(
            "SELECT ticket_id, reviewer, decision, group_name, reason, at FROM ticket_reviews "
            f"WHERE ticket_id IN ({marks}) ORDER BY ticket_id, pos",
            *ids,
        ):
            grouped.setdefault(review["ticket_id"], []).append(_review(review))
    return [_ticket(q, r, tuple(grouped.get(r["id"], ()))) for r in rows]


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


def consume_refusal(id: str, current: Row | None, presented: Binding, now: float) -> Exception:
    """Why ``consume_ticket`` matched no row, from the ticket as it is now."""
    if current is None:
        return NotFound("ticket", id)
    state = current["state"]
    if state == "consumed":
        return Conflict("ticket_consumed", current_state=state)
    if state == "expired" or (
        state == "approved" and (current["expires_at"] is None or current["expires_at"] <= now)
    ):
        return Conflict("ticket_expired", current_state=state)
    if state != "approved":
        return Conflict("ticket_not_approved", current_state=state)
    # The same comparison the chain's pre-check makes (approvals.binding.mismatched).
    bound = SimpleNamespace(**{name: current[name] for name in BINDING_FIELDS})
    return Conflict("ticket_binding_mismatch", current_state=state,
                    fields=mismatched(bound, presented))


class TicketSql(Unit):
    """``base.TicketOps`` over the ``tickets`` and ``ticket_reviews`` tables."""

    __slots__ = ()

    async def create_ticket(self, rec: TicketRecord) -> None:
        if rec.state != "pending" or rec.reviews:
            # Tickets are born pending and reviewed through add_review, so the state machine
            # (and the one-review-per-reviewer rule) cannot be skipped at creation.
            raise ValueError("a ticket is created pending and without reviews")
        async with self._unit(write=True) as q:
            d = q.dialect
            row = await q.one(
                f"INSERT INTO tickets ({COLUMNS}) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (id) DO NOTHING RETURNING id",
                rec.id, rec.subject_id, rec.env, d.json_in(rec.resource), rec.resource_hash,
                rec.action, rec.command_hash, rec.nonce_hash, rec.state, rec.requested_by,
                rec.reason, rec.created_at, rec.pending_until, rec.approved_at, rec.expires_at,
                rec.consumed_at, rec.consumed_correlation_id, rec.closed_by, rec.closed_at,
                d.json_in(rec.approval), None if rec.command is None else d.json_in(rec.command),
            )  # fmt: skip
            if row is None:
                raise Conflict("duplicate_id")
            await insert_event(q, ticket_event("requested", rec, actor=rec.requested_by,
                                               at=rec.created_at))

    async def get_ticket(self, id: str) -> TicketRecord | None:
        # One statement, so one snapshot without a transaction (the ticket and its reviews agree).
        async with self._unit(write=False, single=True) as q:
            return _joined(q, await q.all(_GET, id))

    async def get_ticket_and_task(self, id: str, task_id: str
                                  ) -> tuple[TicketRecord | None, TaskRead | None]:
        async with self._unit(write=False, single=True) as q:
            rows = await q.all(_GET_WITH_TASK, task_id, id)
            if not rows:
                return None, None
            task = task_of(q, rows[0], "k_") if rows[0]["k_id"] is not None else None
            return _joined(q, rows), TaskRead(task_id, task)

    async def get_run_read(self, session_id: str, ticket_id: str, task_id: str | None) -> RunRead:
        async with self._unit(write=False, single=True) as q:
            rows = await q.all(_RUN_READ, session_id, ticket_id, task_id)
            first = rows[0]  # the one-row source: never none
            session = session_of(first, "s_") if first["s_id"] is not None else None
            ticket = _joined(q, rows) if first["id"] is not None else None
            task = None
            if task_id is not None:
                found = task_of(q, first, "k_") if first["k_id"] is not None else None
                task = TaskRead(task_id, found)
        return RunRead(session, ticket_id, ticket, task)

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
        async with self._unit(write=False) as q:
            rows = await q.all(
                f"SELECT {COLUMNS} FROM tickets {clause}"
                "ORDER BY created_at DESC, id DESC LIMIT ?",
                *args, limit + 1,
            )  # fmt: skip
            more = len(rows) > limit
            rows = rows[:limit]
            cursor = _encode_cursor(float(rows[-1]["created_at"]), rows[-1]["id"]) if more else None
            return await _tickets(q, rows), cursor

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
        async with self._unit(write=True) as q:
            row = await q.one(
                f"UPDATE tickets SET {sets} WHERE id = ? AND state = 'pending' "
                f"AND pending_until > ? RETURNING {COLUMNS}",
                *set_args, id, now,
            )  # fmt: skip
            if row is None:
                current = await q.one("SELECT state FROM tickets WHERE id = ?", id)
                if current is None:
                    raise NotFound("ticket", id)
                if current["state"] != "pending":
                    raise Conflict("not_pending", current_state=current["state"])
                raise Conflict("expired", current_state="pending")
            inserted = await q.one(
                "INSERT INTO ticket_reviews "
                "(ticket_id, reviewer, pos, decision, group_name, reason, at) "
                "VALUES (?, ?, (SELECT COUNT(*) + 1 FROM ticket_reviews WHERE ticket_id = ?), "
                "?, ?, ?, ?) ON CONFLICT (ticket_id, reviewer) DO NOTHING RETURNING reviewer",
                id, review.reviewer, id, review.decision, review.group, review.reason, review.at,
            )  # fmt: skip
            if inserted is None:
                # Raised inside the unit: it rolls back the state change made above.
                raise Conflict("duplicate_review", current_state="pending")
            ticket = (await _tickets(q, [row]))[0]
            await insert_event(q, ticket_event(new_state or "reviewed", ticket,
                                               actor=review.reviewer, at=now, review=review))
            return ticket

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
        async with self._unit(write=True) as q:
            row = await q.one(
                "UPDATE tickets SET state = ?, closed_at = ?, closed_by = ? "
                f"WHERE id = ? AND state IN ({marks}) RETURNING {COLUMNS}",
                to_state, at, by, id, *from_states,
            )  # fmt: skip
            if row is None:
                current = await q.one("SELECT state FROM tickets WHERE id = ?", id)
                if current is None:
                    raise NotFound("ticket", id)
                raise Conflict("state_conflict", current_state=current["state"])
            ticket = (await _tickets(q, [row]))[0]
            await insert_event(q, ticket_event(to_state, ticket, actor=by, at=at))
            return ticket

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
        async with self._unit(write=True) as q:
            # The decision is this one conditional UPDATE: of any number of concurrent attempts
            # on any number of processes or replicas, the database lets exactly one match the row.
            args = (now, correlation_id, id, now, nonce_hash, subject_id, env, action,
                    resource_hash, command_hash)  # fmt: skip
            ticket: TicketRecord | None
            if q.dialect.writes_in_cte:
                ticket = _joined(q, await q.all(_CONSUME_WITH_REVIEWS, *args))
            else:
                row = await q.one(_CONSUME_SET, *args)
                ticket = None if row is None else (await _tickets(q, [row]))[0]
            if ticket is not None:
                await insert_event(q, ticket_event("consumed", ticket, actor=subject_id, at=now,
                                                   correlation_id=correlation_id))
                return ticket
            # Miss: re-read only to say why. Nothing here can change the outcome.
            current = await q.one(f"SELECT {COLUMNS} FROM tickets WHERE id = ?", id)
            presented = Binding(nonce_hash, subject_id, env, action, resource_hash, command_hash)
            raise consume_refusal(id, current, presented, now)

    async def expire_tickets(self, now: float) -> list[TicketRecord]:
        async with self._unit(write=True) as q:
            rows = await q.all(
                "UPDATE tickets SET state = 'expired', closed_at = ? "
                "WHERE (state = 'pending' AND pending_until <= ?) "
                "OR (state = 'approved' AND expires_at <= ?) "
                f"RETURNING {COLUMNS}",
                now, now, now,
            )  # fmt: skip
            rows = sorted(rows, key=lambda r: (r["created_at"], r["id"]))
            tickets = await _tickets(q, rows)
            for ticket in tickets:
                await insert_event(q, ticket_event("expired", ticket, actor=SYSTEM_ACTOR, at=now))
            return tickets
