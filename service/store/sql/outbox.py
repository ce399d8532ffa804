"""The notification outbox in SQL: events written with ticket changes, leased by dispatchers.

Claiming is one ``UPDATE ... WHERE seq IN (SELECT ... LIMIT n) RETURNING``: on PostgreSQL the
inner SELECT takes ``FOR UPDATE SKIP LOCKED``, so concurrent replicas each take different rows
without waiting on each other; on SQLite the writer lock (``BEGIN IMMEDIATE``) serialises
claimers. Either way a leased row is not due again until its lease ends, and an event whose
ticket has an earlier pending event waits for it (events of one ticket go out in order).
"""
# ruff: noqa: S608  (statements are built from module constants; caller data is always bound)

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..base import Conflict, DeliveryRecord, NotFound, OutboxEvent, OutboxState
from .core import MAX_LIST_LIMIT, Query, Row, Unit, opt_float

__all__ = ["OutboxSql", "insert_event"]

_COLUMNS = (
    "seq, id, type, ticket_id, env, at, data, state, attempts, next_attempt_at, window_start, "
    "last_error, finished_at"
)
_DUE = (
    "e.state = 'pending' AND e.next_attempt_at <= ? "
    "AND (e.lease_until IS NULL OR e.lease_until <= ?) "
    "AND NOT EXISTS (SELECT 1 FROM outbox_events p "
    "WHERE p.ticket_id = e.ticket_id AND p.seq < e.seq AND p.state = 'pending')"
)


def _event(q: Query, row: Row, delivered: Sequence[str] = ()) -> OutboxEvent:
    return OutboxEvent(
        id=row["id"],
        type=row["type"],
        ticket_id=row["ticket_id"],
        env=row["env"],
        at=float(row["at"]),
        data=q.dialect.json_out(row["data"]),
        seq=int(row["seq"]),
        state=row["state"],
        attempts=int(row["attempts"]),
        next_attempt_at=float(row["next_attempt_at"]),
        window_start=float(row["window_start"]),
        last_error=row["last_error"],
        finished_at=opt_float(row["finished_at"]),
        delivered_sinks=tuple(sorted(delivered)),
    )


def _delivery(row: Row) -> DeliveryRecord:
    return DeliveryRecord(
        event_id=row["event_id"],
        sink=row["sink"],
        state=row["state"],
        attempts=int(row["attempts"]),
        last_status=None if row["last_status"] is None else int(row["last_status"]),
        last_error=row["last_error"],
        at=float(row["at"]),
    )


async def insert_event(q: Query, event: OutboxEvent) -> None:
    """Write ``event`` in ``q``'s transaction (the ticket change's own): pending, due now."""
    await q.exec(
        "INSERT INTO outbox_events (id, type, ticket_id, env, at, data, state, attempts, "
        "next_attempt_at, window_start) VALUES (?, ?, ?, ?, ?, ?, 'pending', 0, ?, ?)",
        event.id, event.type, event.ticket_id, event.env, event.at,
        q.dialect.json_in(event.data), event.next_attempt_at, event.window_start,
    )  # fmt: skip


async def _delivered_sinks(q: Query, ids: Sequence[str]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    if ids:
        marks = ", ".join("?" * len(ids))
        for row in await q.all(
            f"SELECT event_id, sink FROM outbox_deliveries WHERE event_id IN ({marks}) "
            "AND state = 'delivered'",
            *ids,
        ):
            found.setdefault(row["event_id"], []).append(row["sink"])
    return found


class OutboxSql(Unit):
    """``base.OutboxOps`` over the ``outbox_events`` and ``outbox_deliveries`` tables."""

    __slots__ = ()

    async def outbox_due(self, now: float) -> bool:
        async with self._unit(write=False, single=True) as q:
            row = await q.one(f"SELECT 1 AS due FROM outbox_events e WHERE {_DUE} LIMIT 1",
                              now, now)
            return row is not None

    async def claim_outbox(
        self, owner: str, now: float, lease_s: float, limit: int
    ) -> list[OutboxEvent]:
        if limit < 1 or lease_s <= 0:
            raise ValueError("limit and lease_s must be positive")
        async with self._unit(write=True) as q:
            # Row locks exist on PostgreSQL only; SQLite's claimer already holds the writer lock.
            lock = " FOR UPDATE SKIP LOCKED" if q.dialect.name == "postgresql" else ""
            rows = await q.all(
                "UPDATE outbox_events SET lease_owner = ?, lease_until = ? WHERE seq IN ("
                f"SELECT e.seq FROM outbox_events e WHERE {_DUE} ORDER BY e.seq LIMIT ?{lock}) "
                f"RETURNING {_COLUMNS}",
                owner, now + lease_s, now, now, min(limit, MAX_LIST_LIMIT),
            )  # fmt: skip
            rows = sorted(rows, key=lambda r: int(r["seq"]))
            delivered = await _delivered_sinks(q, [r["id"] for r in rows])
            return [_event(q, r, delivered.get(r["id"], ())) for r in rows]

    async def settle_outbox(self, now: float, limit: int) -> int:
        if limit < 1:
            raise ValueError("limit must be positive")
        async with self._unit(write=True) as q:
            lock = " FOR UPDATE SKIP LOCKED" if q.dialect.name == "postgresql" else ""
            rows = await q.all(
                "UPDATE outbox_events SET state = 'delivered', attempts = attempts + 1, "
                "finished_at = ?, lease_owner = NULL, lease_until = NULL WHERE seq IN ("
                f"SELECT e.seq FROM outbox_events e WHERE {_DUE} ORDER BY e.seq LIMIT ?{lock}) "
                "RETURNING seq",
                now, now, now, min(limit, MAX_LIST_LIMIT),
            )  # fmt: skip
            return len(rows)

    async def finish_outbox(
        self,
        event_id: str,
        owner: str,
        deliveries: Sequence[DeliveryRecord],
        *,
        state: OutboxState,
        next_attempt_at: float,
        error: str | None,
        now: float,
    ) -> bool:
        if state not in ("pending", "delivered", "dead"):
            raise ValueError(f"invalid outbox state {state!r}")
        async with self._unit(write=True) as q:
            # What reached a sink is recorded whoever holds the lease now: it happened.
            await q.exec_many(
                "INSERT INTO outbox_deliveries (event_id, sink, state, attempts, last_status, "
                "last_error, at) VALUES (?, ?, ?, 1, ?, ?, ?) "
                "ON CONFLICT (event_id, sink) DO UPDATE SET state = excluded.state, "
                "attempts = outbox_deliveries.attempts + 1, last_status = excluded.last_status, "
                "last_error = excluded.last_error, at = excluded.at",
                [(d.event_id, d.sink, d.state, d.last_status, d.last_error, d.at)
                 for d in deliveries],
            )  # fmt: skip
            row = await q.one(
                "UPDATE outbox_events SET state = ?, attempts = attempts + 1, "
                "next_attempt_at = ?, last_error = ?, finished_at = ?, lease_owner = NULL, "
                "lease_until = NULL WHERE id = ? AND lease_owner = ? AND state = 'pending' "
                "RETURNING seq",
                state, next_attempt_at, error, None if state == "pending" else now, event_id,
                owner,
            )  # fmt: skip
            return row is not None

    async def get_outbox_event(self, event_id: str) -> OutboxEvent | None:
        async with self._unit(write=False) as q:
            row = await q.one(f"SELECT {_COLUMNS} FROM outbox_events WHERE id = ?", event_id)
            if row is None:
                return None
            delivered = await _delivered_sinks(q, [event_id])
            return _event(q, row, delivered.get(event_id, ()))

    async def list_outbox(
        self, *, failed: bool = False, limit: int = 50, before_seq: int | None = None
    ) -> list[OutboxEvent]:
        if limit < 1:
            raise ValueError("limit must be positive")
        where: list[str] = []
        args: list[Any] = []
        if failed:
            where.append("(state = 'dead' OR (state = 'pending' AND last_error IS NOT NULL))")
        if before_seq is not None:
            where.append("seq < ?")
            args.append(before_seq)
        clause = f"WHERE {' AND '.join(where)} " if where else ""
        async with self._unit(write=False) as q:
            rows = await q.all(
                f"SELECT {_COLUMNS} FROM outbox_events {clause}ORDER BY seq DESC LIMIT ?",
                *args, min(limit, MAX_LIST_LIMIT),
            )  # fmt: skip
            delivered = await _delivered_sinks(q, [r["id"] for r in rows])
            return [_event(q, r, delivered.get(r["id"], ())) for r in rows]

    async def outbox_deliveries(self, event_id: str) -> list[DeliveryRecord]:
        async with self._unit(write=False) as q:
            rows = await q.all(
                "SELECT event_id, sink, state, attempts, last_status, last_error, at "
                "FROM outbox_deliveries WHERE event_id = ? ORDER BY sink",
                event_id,
            )
            return [_delivery(r) for r in rows]

    async def retry_outbox(self, event_id: str, now: float) -> OutboxEvent:
        async with self._unit(write=True) as q:
            row = await q.one(
                "UPDATE outbox_events SET state = 'pending', attempts = 0, next_attempt_at = ?, "
                "window_start = ?, last_error = NULL, finished_at = NULL, lease_owner = NULL, "
                "lease_until = NULL "
                f"WHERE id = ? AND state = 'dead' RETURNING {_COLUMNS}",
                now, now, event_id,
            )  # fmt: skip
            if row is None:
                current = await q.one("SELECT state FROM outbox_events WHERE id = ?", event_id)
                if current is None:
                    raise NotFound("outbox event", event_id)
                raise Conflict("state_conflict", current_state=current["state"])
            delivered = await _delivered_sinks(q, [event_id])
            return _event(q, row, delivered.get(event_id, ()))

    async def purge_outbox(self, delivered_before: float) -> int:
        async with self._unit(write=True) as q:
            rows = await q.all(
                "DELETE FROM outbox_events WHERE state = 'delivered' AND finished_at < ? "
                "RETURNING seq",
                delivered_before,
            )
            return len(rows)
