"""Published token signing keys in SQL: one row per key, the public half only."""

from __future__ import annotations

from collections.abc import Sequence

from ..base import PublishedKey
from .core import Unit

__all__ = ["SigningKeySql"]


class SigningKeySql(Unit):
    """``base.PublishedKeyOps`` over the ``published_signing_keys`` table."""

    __slots__ = ()

    async def publish_signing_keys(self, keys: Sequence[PublishedKey], now: float) -> None:
        async with self._unit(write=True) as q:
            if keys:
                # The key material of a kid never changes (kid is its thumbprint); only the
                # window does: a retired key gets its end, a re-published active key loses it.
                await q.exec_many(
                    "INSERT INTO published_signing_keys (kid, public_key, created_at, verify_until) "
                    "VALUES (?, ?, ?, ?) ON CONFLICT (kid) DO UPDATE "
                    "SET verify_until = excluded.verify_until",
                    [(k.kid, k.public_key, k.created_at, k.verify_until) for k in keys],
                )  # fmt: skip
            await q.exec(
                "DELETE FROM published_signing_keys "
                "WHERE verify_until IS NOT NULL AND verify_until < ?",
                now,
            )

    async def published_signing_keys(self, now: float) -> list[PublishedKey]:
        async with self._unit(write=False) as q:
            rows = await q.all(
                "SELECT kid, public_key, created_at, verify_until FROM published_signing_keys "
                "WHERE verify_until IS NULL OR verify_until >= ? ORDER BY created_at, kid",
                now,
            )  # fmt: skip
        return [
            PublishedKey(
                kid=str(r["kid"]),
                public_key=str(r["public_key"]),
                created_at=float(r["created_at"]),
                verify_until=None if r["verify_until"] is None else float(r["verify_until"]),
            )
            for r in rows
        ]
