"""Published policy revisions and the fleet's active revision in SQL.

``policy_revisions`` is append-only (content-addressed ids). The active revision is the single
``policy_head`` row: an activation is one conditional ``UPDATE ... RETURNING`` on it (a row lock
on PostgreSQL, the write lock on SQLite), so activations from several replicas apply one at a
time and each gets the next ``seq``; the history row is written in the same transaction. On
PostgreSQL a trigger on ``policy_head`` NOTIFYs the replicas (migration 0007).
"""
# ruff: noqa: S608  (statements are built from module constants; caller data is always bound)

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace

from ..base import Conflict, NotFound, PolicyActivation, PolicyRevisionRecord
from .core import MAX_LIST_LIMIT, Row, Unit

__all__ = ["PolicyRevisionSql"]

_COLUMNS = ("id, digest, bundle, signature, kid, author, message, created_at, published_by, "
            "published_at")
_ACTIVATION = ("seq, revision_id, previous_id, kind, activated_by, activated_at, reason, "
               "signature")


def _text(value: object) -> str:
    # ASCII JSON: no U+0000 or surrogate can reach a TEXT column on either backend, and the
    # digest is recomputed from the parsed value (RFC 8785), never from this text.
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _revision(row: Row) -> PolicyRevisionRecord:
    return PolicyRevisionRecord(
        id=row["id"], digest=row["digest"], bundle=json.loads(row["bundle"]),
        signature=json.loads(row["signature"]), kid=row["kid"], author=row["author"],
        message=row["message"], created_at=float(row["created_at"]),
        published_by=row["published_by"], published_at=float(row["published_at"]),
    )


def _activation(row: Row) -> PolicyActivation:
    return PolicyActivation(
        seq=int(row["seq"]), revision_id=row["revision_id"], previous_id=row["previous_id"],
        kind=row["kind"], activated_by=row["activated_by"],
        activated_at=float(row["activated_at"]), reason=row["reason"],
        signature=_signature(row["signature"]),
    )


def _signature(text: str | None) -> dict[str, str] | None:
    # Whatever a writer put there is handed to the verifier as it is (it refuses non-JWS).
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return {"malformed": "not JSON"}
    return value if isinstance(value, dict) else {"malformed": "not an object"}


class PolicyRevisionSql(Unit):
    """``base.PolicyRevisionOps`` over ``policy_revisions``, ``policy_head`` and
    ``policy_activations``."""

    __slots__ = ()

    async def add_policy_revision(self, rec: PolicyRevisionRecord) -> bool:
        async with self._unit(write=True) as q:
            # ON CONFLICT DO NOTHING: a concurrent publisher of the same id neither fails nor
            # overwrites; what is stored is then compared below.
            inserted = await q.one(
                f"INSERT INTO policy_revisions ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (id) DO NOTHING RETURNING id",
                rec.id, rec.digest, _text(rec.bundle), _text(rec.signature), rec.kid, rec.author,
                rec.message, rec.created_at, rec.published_by, rec.published_at,
            )
            if inserted is not None:
                return True
            row = await q.one("SELECT digest FROM policy_revisions WHERE id = ?", rec.id)
        if row is not None and row["digest"] != rec.digest:
            raise Conflict("duplicate_id")
        return False

    async def add_policy_candidate(self, rec: PolicyRevisionRecord) -> None:
        async with self._unit(write=True) as q:
            await q.exec(
                "INSERT INTO policy_candidates (id, digest, bundle, signature, kid, author, "
                "message, created_at, proposed_by, proposed_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING",
                rec.id, rec.digest, _text(rec.bundle), _text(rec.signature), rec.kid, rec.author,
                rec.message, rec.created_at, rec.published_by, rec.published_at,
            )

    async def get_policy_candidate(self, id: str) -> PolicyRevisionRecord | None:
        async with self._unit(write=False) as q:
            row = await q.one(
                "SELECT id, digest, bundle, signature, kid, author, message, created_at, "
                "proposed_by AS published_by, proposed_at AS published_at "
                "FROM policy_candidates WHERE id = ?", id)
        return None if row is None else _revision(row)

    async def get_policy_revision(self, id: str) -> PolicyRevisionRecord | None:
        async with self._unit(write=False) as q:
            row = await q.one(f"SELECT {_COLUMNS} FROM policy_revisions WHERE id = ?", id)
        return None if row is None else _revision(row)

    async def list_policy_revisions(
        self, limit: int = 50, before: float | None = None
    ) -> list[PolicyRevisionRecord]:
        if limit < 1:
            raise ValueError("limit must be positive")
        where, args = ("", []) if before is None else ("WHERE published_at < ? ", [before])
        async with self._unit(write=False) as q:
            rows = await q.all(
                f"SELECT {_COLUMNS} FROM policy_revisions {where}"
                "ORDER BY published_at DESC, id LIMIT ?",
                *args, min(limit, MAX_LIST_LIMIT),
            )
        return [_revision(r) for r in rows]

    async def activate_policy_revision(
        self, revision_id: str, *, kind: str, by: str, at: float, reason: str | None = None,
        expected: str | None = None,
        sign: Callable[[PolicyActivation], dict[str, str]] | None = None, after_seq: int = 0,
    ) -> PolicyActivation:
        async with self._unit(write=True) as q:
            # "": no store revision: every replica runs its own policies.dir again.
            exists = revision_id == "" or await q.one(
                "SELECT id FROM policy_revisions WHERE id = ?", revision_id)
            if not exists:
                raise NotFound("policy revision", revision_id)
            # SET's right-hand sides read the row as it was: previous_id gets the old active id.
            sql = ("UPDATE policy_head SET seq = seq + 1, previous_id = revision_id, "
                   "revision_id = ? WHERE id = 1")
            args: list[object] = [revision_id]
            if expected is not None:
                sql += " AND revision_id = ?"
                args.append(expected)
            head = await q.one(sql + " RETURNING seq, previous_id", *args)
            if head is None:
                raise Conflict("state_conflict")
            seq = int(head["seq"])
            # The head row is locked now: a row written around it (by hand) cannot make this
            # seq collide, and this activation stays the latest.
            top = await q.one("SELECT MAX(seq) AS top FROM policy_activations")
            floor = max(after_seq, int(top["top"]) if top and top["top"] is not None else 0)
            if floor >= seq:
                seq = floor + 1
                await q.exec("UPDATE policy_head SET seq = ? WHERE id = 1", seq)
            activation = PolicyActivation(
                seq=seq, revision_id=revision_id, previous_id=head["previous_id"],
                kind=kind, activated_by=by, activated_at=at, reason=reason,
            )
            if sign is not None:
                activation = replace(activation, signature=sign(activation))
            await q.exec(
                f"INSERT INTO policy_activations ({_ACTIVATION}) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                activation.seq, revision_id, activation.previous_id, kind, by, at, reason,
                None if activation.signature is None else _text(activation.signature),
            )
        return activation

    async def active_policy(self) -> PolicyActivation | None:
        async with self._unit(write=False) as q:
            row = await q.one(
                f"SELECT {_ACTIVATION} FROM policy_activations ORDER BY seq DESC LIMIT 1"
            )
        return None if row is None else _activation(row)

    async def policy_activations(self, limit: int = 50) -> list[PolicyActivation]:
        if limit < 1:
            raise ValueError("limit must be positive")
        async with self._unit(write=False) as q:
            rows = await q.all(
                f"SELECT {_ACTIVATION} FROM policy_activations ORDER BY seq DESC LIMIT ?",
                min(limit, MAX_LIST_LIMIT),
            )
        return [_activation(r) for r in rows]
