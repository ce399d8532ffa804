"""Sessions, one-time claims and login throttling in SQL."""
# ruff: noqa: S608  (statements are built from module constants; caller data is always bound)

from __future__ import annotations

from collections.abc import Sequence

from ..base import Conflict, NotFound, SessionRecord, ThrottleRule, ThrottleVerdict
from .core import Query, Row, Unit, opt_float

__all__ = ["BY_ID", "COLUMNS", "SessionSql", "session_of"]

COLUMNS = (
    "id, subject_id, kind, authn_method, auth_time, created_at, expires_at, step_up_at, "
    "step_up_method, revoked_at"
)
#: One session row by its id (``session_of`` reads it).
BY_ID = f"SELECT {COLUMNS} FROM sessions WHERE id = ?"


def session_of(row: Row, prefix: str = "") -> SessionRecord:
    """A session from ``row``'s ``sessions`` columns (named with ``prefix``)."""
    return SessionRecord(
        id=row[prefix + "id"],
        subject_id=row[prefix + "subject_id"],
        kind=row[prefix + "kind"],
        authn_method=row[prefix + "authn_method"],
        auth_time=float(row[prefix + "auth_time"]),
        created_at=float(row[prefix + "created_at"]),
        expires_at=float(row[prefix + "expires_at"]),
        step_up_at=opt_float(row[prefix + "step_up_at"]),
        step_up_method=row[prefix + "step_up_method"],
        revoked_at=opt_float(row[prefix + "revoked_at"]),
    )


#: Stands for "no limit" / "no slowdown" in the reservation statement (an INTEGER column).
_NEVER = 2**31 - 1

# One conditional upsert per key decides and reserves at once. A new key, or one whose window
# has ended, starts a window with this failure. Otherwise the failure is added only while the
# key is under its limit and the spacing asked by its latest failure has passed; the WHERE is
# evaluated against the committed row under its row lock (PostgreSQL) or the write lock
# (SQLite), so concurrent attempts are counted one by one. No row comes back when refused.
# The spacing: none below ``after`` failures, ``base`` at ``after``, then doubled up to ``max``;
# a key without spacing never compares times (workers' clocks and request order may differ).
_RESERVE = (
    "INSERT INTO login_throttle (key, failures, window_start, last_at, delay_s) "
    "VALUES (?, 1, ?, ?, ?) ON CONFLICT (key) DO UPDATE SET "
    "failures = CASE WHEN login_throttle.window_start <= ? THEN 1 "
    "ELSE login_throttle.failures + 1 END, "
    "window_start = CASE WHEN login_throttle.window_start <= ? THEN excluded.window_start "
    "ELSE login_throttle.window_start END, "
    "delay_s = CASE WHEN login_throttle.window_start <= ? THEN excluded.delay_s "
    "WHEN login_throttle.failures + 1 < ? THEN 0.0 "
    "WHEN login_throttle.failures + 1 = ? OR login_throttle.delay_s * 2 < ? THEN ? "
    "WHEN login_throttle.delay_s * 2 < ? THEN login_throttle.delay_s * 2 "
    "ELSE ? END, "
    "last_at = CASE WHEN login_throttle.last_at > excluded.last_at THEN login_throttle.last_at "
    "ELSE excluded.last_at END "
    "WHERE login_throttle.window_start <= ? OR (login_throttle.failures < ? "
    "AND (login_throttle.delay_s = 0.0 "
    "OR login_throttle.last_at + login_throttle.delay_s <= excluded.last_at)) "
    "RETURNING failures"
)


async def _reserve(q: Query, rule: ThrottleRule, now: float) -> int | None:
    """Reserve one failure on ``rule.key``: the key's failures including it, or None (refused)."""
    after = _NEVER if rule.delay_after is None else max(1, rule.delay_after)
    top = max(0.0, float(rule.delay_max_s))
    base = min(max(0.0, float(rule.delay_base_s)), top)
    limit = _NEVER if rule.limit is None else rule.limit
    cutoff = now - rule.window_s
    first = base if after <= 1 else 0.0
    row = await q.one(
        _RESERVE,
        rule.key, now, now, first,
        cutoff, cutoff, cutoff, after, after, base, base, top, top,
        cutoff, limit,
    )  # fmt: skip
    return None if row is None else int(row["failures"])


async def _get(q: Query, id: str) -> SessionRecord | None:
    row = await q.one(BY_ID, id)
    return None if row is None else session_of(row)


class SessionSql(Unit):
    """``base.SessionOps`` over the ``sessions``, ``once_claims`` and ``login_throttle`` tables."""

    __slots__ = ()

    async def create_session(self, rec: SessionRecord) -> None:
        async with self._unit(write=True) as q:
            row = await q.one(
                f"INSERT INTO sessions ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (id) DO NOTHING RETURNING id",
                rec.id, rec.subject_id, rec.kind, rec.authn_method, rec.auth_time, rec.created_at,
                rec.expires_at, rec.step_up_at, rec.step_up_method, rec.revoked_at,
            )  # fmt: skip
            if row is None:
                raise Conflict("duplicate_id")

    async def get_session(self, id: str) -> SessionRecord | None:
        async with self._unit(write=False, single=True) as q:
            return await _get(q, id)

    def session_now(self, id: str) -> tuple[SessionRecord | None] | None:
        """``get_session`` where it can answer without waiting (a 1-tuple of its answer);
        None here: every read is awaited."""
        return None

    async def revoke_session(self, id: str, at: float) -> bool:
        async with self._unit(write=True) as q:
            row = await q.one(
                "UPDATE sessions SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL "
                "RETURNING id",
                at, id,
            )  # fmt: skip
        return row is not None

    async def revoke_subject_sessions(self, subject_id: str, at: float) -> int:
        async with self._unit(write=True) as q:
            rows = await q.all(
                "UPDATE sessions SET revoked_at = ? WHERE subject_id = ? AND revoked_at IS NULL "
                "AND expires_at > ? RETURNING id",
                at, subject_id, at,
            )  # fmt: skip
        return len(rows)

    async def record_step_up(self, id: str, at: float, method: str) -> SessionRecord:
        async with self._unit(write=True) as q:
            row = await q.one(
                "UPDATE sessions SET step_up_at = ?, step_up_method = ? "
                "WHERE id = ? AND revoked_at IS NULL AND expires_at > ? "
                f"RETURNING {COLUMNS}",
                at, method, id, at,
            )  # fmt: skip
            if row is not None:
                return session_of(row)
            current = await _get(q, id)
            if current is None:
                raise NotFound("session", id)
            if current.revoked_at is not None:
                raise Conflict("session_revoked")
            raise Conflict("session_expired")

    # ------------------------------------------------------------------------ one-time values

    async def claim_once(self, namespace: str, key: str, expires_at: float, now: float) -> bool:
        # One statement decides: insert, or take over a row whose claim has expired. A live
        # claim makes the conditional DO UPDATE a no-op, so RETURNING yields nothing.
        async with self._unit(write=True) as q:
            row = await q.one(
                "INSERT INTO once_claims (namespace, key, expires_at, claimed_at) "
                "VALUES (?, ?, ?, ?) ON CONFLICT (namespace, key) DO UPDATE "
                "SET expires_at = excluded.expires_at, claimed_at = excluded.claimed_at "
                "WHERE once_claims.expires_at <= excluded.claimed_at "
                "RETURNING key",
                namespace, key, expires_at, now,
            )  # fmt: skip
        return row is not None

    # ------------------------------------------------------------------------ login throttling

    async def reserve_attempt(self, rules: Sequence[ThrottleRule], now: float) -> ThrottleVerdict:
        # Keys in one order everywhere, so two attempts never wait for each other's rows in a
        # cycle (PostgreSQL row locks); a refusal rolls every key of this attempt back.
        ordered = sorted(rules, key=lambda r: r.key)
        counts: dict[str, int] = {}
        refused: dict[str, int] = {}
        retry_at = now
        async with self._unit(write=True) as q:
            savepoint = len(ordered) > 1
            if savepoint:
                await q.exec("SAVEPOINT throttle_attempt")
            for rule in ordered:
                granted = await _reserve(q, rule, now)
                if granted is not None:
                    counts[rule.key] = granted
                    continue
                row = await q.one(
                    "SELECT failures, window_start, last_at, delay_s FROM login_throttle WHERE key = ?",
                    rule.key,
                )
                if row is None:  # unreachable: a refusal needs the row
                    continue
                failures = int(row["failures"])
                refused[rule.key] = failures
                if rule.limit is not None and failures >= rule.limit:
                    until = float(row["window_start"]) + rule.window_s
                else:
                    until = float(row["last_at"]) + float(row["delay_s"])
                retry_at = max(retry_at, until)
            if savepoint:
                if refused:
                    await q.exec("ROLLBACK TO SAVEPOINT throttle_attempt")
                await q.exec("RELEASE SAVEPOINT throttle_attempt")
        if refused:
            return ThrottleVerdict(False, refused, tuple(refused), retry_at)
        return ThrottleVerdict(True, counts)

    async def release_failure(self, key: str, reserved_at: float) -> None:
        async with self._unit(write=True) as q:
            await q.exec(
                "UPDATE login_throttle SET failures = failures - 1 "
                "WHERE key = ? AND failures > 0 AND window_start <= ?",
                key, reserved_at,
            )  # fmt: skip

    async def clear_failures(self, key: str) -> None:
        async with self._unit(write=True) as q:
            await q.exec("DELETE FROM login_throttle WHERE key = ?", key)

    async def count_failures(self, key: str, now: float, window_s: float) -> int:
        async with self._unit(write=False) as q:
            row = await q.one(
                "SELECT failures FROM login_throttle WHERE key = ? AND window_start > ?",
                key, now - window_s,
            )  # fmt: skip
        return 0 if row is None else int(row["failures"])

    # ---------------------------------------------------------------------------- housekeeping

    async def purge_expired(
        self, now: float, failures_before: float, sessions_before: float
    ) -> tuple[int, int, int]:
        # An expired claim no longer blocks anything (claim_once takes it over), a throttle key
        # whose window has ended starts afresh at its next failure, and no token of an expired session
        # verifies: all three only grow the tables. (Audit records keep session ids as text.)
        async with self._unit(write=True) as q:
            claims = await q.all("DELETE FROM once_claims WHERE expires_at <= ? RETURNING 1", now)
            failures = await q.all(
                "DELETE FROM login_throttle WHERE window_start < ? RETURNING 1", failures_before
            )
            sessions = await q.all(
                "DELETE FROM sessions WHERE expires_at < ? RETURNING 1", min(now, sessions_before)
            )
        return len(claims), len(failures), len(sessions)
