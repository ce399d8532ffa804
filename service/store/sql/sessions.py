"""Sessions, one-time claims and login failures in SQL."""
# ruff: noqa: S608  (statements are built from module constants; caller data is always bound)

from __future__ import annotations

from ..base import Conflict, NotFound, SessionRecord
from .core import Query, Row, Unit, opt_float

__all__ = ["SessionSql"]

_COLUMNS = (
    "id, subject_id, kind, authn_method, auth_time, created_at, expires_at, step_up_at, "
    "step_up_method, revoked_at"
)


def _session(row: Row) -> SessionRecord:
    return SessionRecord(
        id=row["id"],
        subject_id=row["subject_id"],
        kind=row["kind"],
        authn_method=row["authn_method"],
        auth_time=float(row["auth_time"]),
        created_at=float(row["created_at"]),
        expires_at=float(row["expires_at"]),
        step_up_at=opt_float(row["step_up_at"]),
        step_up_method=row["step_up_method"],
        revoked_at=opt_float(row["revoked_at"]),
    )


async def _get(q: Query, id: str) -> SessionRecord | None:
    row = await q.one(f"SELECT {_COLUMNS} FROM sessions WHERE id = ?", id)
    return None if row is None else _session(row)


class SessionSql(Unit):
    """``base.SessionOps`` over the ``sessions``, ``once_claims`` and ``login_failures`` tables."""

    __slots__ = ()

    async def create_session(self, rec: SessionRecord) -> None:
        async with self._unit(write=True) as q:
            row = await q.one(
                f"INSERT INTO sessions ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (id) DO NOTHING RETURNING id",
                rec.id, rec.subject_id, rec.kind, rec.authn_method, rec.auth_time, rec.created_at,
                rec.expires_at, rec.step_up_at, rec.step_up_method, rec.revoked_at,
            )  # fmt: skip
            if row is None:
                raise Conflict("duplicate_id")

    async def get_session(self, id: str) -> SessionRecord | None:
        async with self._unit(write=False) as q:
            return await _get(q, id)

    async def revoke_session(self, id: str, at: float) -> bool:
        async with self._unit(write=True) as q:
            row = await q.one(
                "UPDATE sessions SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL "
                "RETURNING id",
                at, id,
            )  # fmt: skip
        return row is not None

    async def record_step_up(self, id: str, at: float, method: str) -> SessionRecord:
        async with self._unit(write=True) as q:
            row = await q.one(
                "UPDATE sessions SET step_up_at = ?, step_up_method = ? "
                "WHERE id = ? AND revoked_at IS NULL AND expires_at > ? "
                f"RETURNING {_COLUMNS}",
                at, method, id, at,
            )  # fmt: skip
            if row is not None:
                return _session(row)
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

    async def record_failure(self, key: str, at: float) -> None:
        async with self._unit(write=True) as q:
            await q.exec("INSERT INTO login_failures (key, at) VALUES (?, ?)", key, at)

    async def count_failures(self, key: str, since: float) -> int:
        async with self._unit(write=False) as q:
            row = await q.one(
                "SELECT COUNT(*) AS n FROM login_failures WHERE key = ? AND at >= ?", key, since
            )
        return 0 if row is None else int(row["n"])

    async def clear_failures(self, key: str) -> None:
        async with self._unit(write=True) as q:
            await q.exec("DELETE FROM login_failures WHERE key = ?", key)

    # ---------------------------------------------------------------------------- housekeeping

    async def purge_expired(
        self, now: float, failures_before: float, sessions_before: float
    ) -> tuple[int, int, int]:
        # An expired claim no longer blocks anything (claim_once takes it over), a failure older
        # than the throttling window is never counted again, and no token of an expired session
        # verifies: all three only grow the tables. (Audit records keep session ids as text.)
        async with self._unit(write=True) as q:
            claims = await q.all("DELETE FROM once_claims WHERE expires_at <= ? RETURNING 1", now)
            failures = await q.all(
                "DELETE FROM login_failures WHERE at < ? RETURNING 1", failures_before
            )
            sessions = await q.all(
                "DELETE FROM sessions WHERE expires_at < ? RETURNING 1", min(now, sessions_before)
            )
        return len(claims), len(failures), len(sessions)
