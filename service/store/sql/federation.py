"""Identity federation in SQL: pending OIDC logins, CLI handoffs, federated sessions and subjects."""
# ruff: noqa: S608  (statements are built from module constants; caller data is always bound)

from __future__ import annotations

import json

from ..base import FederatedSession, FederatedSubject, HandoffRecord, OidcLoginRecord
from .core import Row, Unit

__all__ = ["FederationSql"]

_LOGIN_COLUMNS = (
    "state_hash, provider, purpose, nonce, code_verifier, browser_hash, session_id, "
    "redirect_uri, cli_redirect, cli_challenge, created_at, expires_at"
)


def _login(row: Row) -> OidcLoginRecord:
    return OidcLoginRecord(
        state_hash=row["state_hash"],
        provider=row["provider"],
        purpose=row["purpose"],
        nonce=row["nonce"],
        code_verifier=row["code_verifier"],
        browser_hash=row["browser_hash"],
        session_id=row["session_id"],
        redirect_uri=row["redirect_uri"],
        cli_redirect=row["cli_redirect"],
        cli_challenge=row["cli_challenge"],
        created_at=float(row["created_at"]),
        expires_at=float(row["expires_at"]),
    )


class FederationSql(Unit):
    """``base.FederationOps`` over ``oidc_logins``, ``federation_handoffs``,
    ``federated_sessions`` and ``federated_subjects``."""

    __slots__ = ()

    async def put_oidc_login(self, rec: OidcLoginRecord) -> None:
        async with self._unit(write=True) as q:
            await q.exec(
                f"INSERT INTO oidc_logins ({_LOGIN_COLUMNS}) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                rec.state_hash, rec.provider, rec.purpose, rec.nonce, rec.code_verifier,
                rec.browser_hash, rec.session_id, rec.redirect_uri, rec.cli_redirect,
                rec.cli_challenge, rec.created_at, rec.expires_at,
            )  # fmt: skip

    async def take_oidc_login(self, state_hash: str, now: float) -> OidcLoginRecord | None:
        # One DELETE decides: exactly one caller gets the row, on any worker or replica.
        async with self._unit(write=True) as q:
            row = await q.one(
                f"DELETE FROM oidc_logins WHERE state_hash = ? RETURNING {_LOGIN_COLUMNS}",
                state_hash,
            )
        if row is None:
            return None
        rec = _login(row)
        return rec if rec.expires_at > now else None

    async def put_handoff(self, rec: HandoffRecord) -> None:
        async with self._unit(write=True) as q:
            await q.exec(
                "INSERT INTO federation_handoffs "
                "(code_hash, challenge, session_id, stepped_up, expires_at) VALUES (?, ?, ?, ?, ?)",
                rec.code_hash, rec.challenge, rec.session_id, int(rec.stepped_up), rec.expires_at,
            )  # fmt: skip

    async def take_handoff(self, code_hash: str, now: float) -> HandoffRecord | None:
        async with self._unit(write=True) as q:
            row = await q.one(
                "DELETE FROM federation_handoffs WHERE code_hash = ? "
                "RETURNING code_hash, challenge, session_id, stepped_up, expires_at",
                code_hash,
            )
        if row is None or float(row["expires_at"]) <= now:
            return None
        return HandoffRecord(
            code_hash=row["code_hash"],
            challenge=row["challenge"],
            session_id=row["session_id"],
            stepped_up=bool(row["stepped_up"]),
            expires_at=float(row["expires_at"]),
        )

    async def put_federated_session(self, rec: FederatedSession) -> None:
        async with self._unit(write=True) as q:
            await q.exec(
                "INSERT INTO federated_sessions "
                "(session_id, provider, foreign_sub, groups, updated_at) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT (session_id) DO UPDATE SET provider = excluded.provider, "
                "foreign_sub = excluded.foreign_sub, groups = excluded.groups, "
                "updated_at = excluded.updated_at",
                rec.session_id, rec.provider, rec.foreign_sub,
                json.dumps(sorted(rec.groups)), rec.updated_at,
            )  # fmt: skip

    async def get_federated_session(self, session_id: str) -> FederatedSession | None:
        async with self._unit(write=False) as q:
            row = await q.one(
                "SELECT session_id, provider, foreign_sub, groups, updated_at "
                "FROM federated_sessions WHERE session_id = ?",
                session_id,
            )
        return None if row is None else _federated_session(row)

    async def record_federated_subject(
        self, subject_id: str, kind: str, source: str, at: float
    ) -> None:
        async with self._unit(write=True) as q:
            await q.exec(
                "INSERT INTO federated_subjects (subject_id, kind, source, first_seen, last_seen) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT (subject_id) DO UPDATE SET "
                "kind = excluded.kind, source = excluded.source, last_seen = excluded.last_seen",
                subject_id, kind, source, at, at,
            )  # fmt: skip

    async def list_federated_subjects(self, limit: int = 100) -> list[FederatedSubject]:
        async with self._unit(write=False) as q:
            rows = await q.all(
                "SELECT subject_id, kind, source, first_seen, last_seen FROM federated_subjects "
                "ORDER BY subject_id LIMIT ?",
                max(1, min(limit, 1000)),
            )
        return [
            FederatedSubject(
                subject_id=r["subject_id"],
                kind=r["kind"],
                source=r["source"],
                first_seen=float(r["first_seen"]),
                last_seen=float(r["last_seen"]),
            )
            for r in rows
        ]

    async def last_federated_session(self, subject_id: str) -> FederatedSession | None:
        async with self._unit(write=False) as q:
            row = await q.one(
                "SELECT f.session_id, f.provider, f.foreign_sub, f.groups, f.updated_at "
                "FROM federated_sessions f JOIN sessions s ON s.id = f.session_id "
                "WHERE s.subject_id = ? ORDER BY f.updated_at DESC, f.session_id LIMIT 1",
                subject_id,
            )
        return None if row is None else _federated_session(row)

    async def purge_federation(self, now: float) -> int:
        """Forget pending logins and handoffs past their expiry, and the IdP facts of sessions
        that are gone (purged after their retention); the count."""
        async with self._unit(write=True) as q:
            a = await q.all("DELETE FROM oidc_logins WHERE expires_at <= ? RETURNING 1", now)
            b = await q.all("DELETE FROM federation_handoffs WHERE expires_at <= ? RETURNING 1", now)
            c = await q.all(
                "DELETE FROM federated_sessions WHERE NOT EXISTS "
                "(SELECT 1 FROM sessions WHERE sessions.id = federated_sessions.session_id) "
                "RETURNING 1"
            )
        return len(a) + len(b) + len(c)


def _federated_session(row: Row) -> FederatedSession:
    """A ``federated_sessions`` row (its five columns, by name) as the record."""
    return FederatedSession(
        session_id=row["session_id"],
        provider=row["provider"],
        foreign_sub=row["foreign_sub"],
        groups=tuple(json.loads(row["groups"])),
        updated_at=float(row["updated_at"]),
    )
