"""Audit records: canonical JSON (RFC 8785) and the SHA-256 hash chain over it.

``hash = sha256:hex(SHA-256(JCS({"seq", "prev_hash", "entry"})))``. Each record names the hash of
the one before it (the first names 64 zeros), so changing, removing or reordering any stored
record breaks every link after it; ``verify`` finds the first broken one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .. import canonical
from ..redaction import is_secret_field
from ..store.base import AUDIT_GENESIS_HASH, AuditRecord

__all__ = ["Break", "seal", "verify"]



def seal(seq: int, prev_hash: str, entry: dict[str, Any]) -> str:
    """The hash of record ``seq`` holding ``entry`` after ``prev_hash`` (the store's ``Seal``)."""
    doc: dict[str, Any] = {"seq": seq, "prev_hash": prev_hash, "entry": entry}
    return "sha256:" + hashlib.sha256(canonical.dumps(doc)).hexdigest()


def scrub(entry: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``entry`` without credential-bearing keys, at any depth."""
    scrubbed: dict[str, Any] = _scrub(entry)
    return scrubbed


def _scrub(value: Any) -> Any:
    if isinstance(value, dict):
        # Never stored, whatever a caller passes: audit is read by many, and a token, password,
        # OTP or nonce in it would be a credential leak.
        return {k: _scrub(v) for k, v in value.items() if not is_secret_field(k)}
    if isinstance(value, list):
        return [_scrub(v) for v in value]
    return value


@dataclass(frozen=True)
class Break:
    """The first record whose link or hash does not verify."""

    seq: int
    # Of the chain: hash_mismatch | prev_hash_mismatch | seq_gap | missing | head_mismatch;
    # unsealed (acknowledged records staged long ago and still not chained: ``audit.log``).
    # Against signed checkpoints and anchors (``audit.checkpoint``): checkpoint_mismatch,
    # checkpoint_beyond_end, bad_signature, unknown_key, anchor_mismatch, anchor_beyond_end,
    # anchor_bad_signature, anchor_unknown_key, checkpoint_missing (an anchor shows a signed
    # checkpoint no longer stored); against the mirror's records: mirror_mismatch,
    # mirror_beyond_end.
    reason: str
    detail: str = ""

    def __str__(self) -> str:
        text = f"record {self.seq}: {self.reason}"
        return f"{text} ({self.detail})" if self.detail else text


def verify(
    records: Iterable[AuditRecord], *, start: tuple[int, str] = (0, AUDIT_GENESIS_HASH)
) -> tuple[int, Break | None]:
    """Walk ``records`` (ascending seq) from ``start``; return (records checked, first break)."""
    expected_seq, prev = start[0] + 1, start[1]
    checked = 0
    for record in records:
        if record.seq != expected_seq:
            return checked, Break(expected_seq, "seq_gap")
        if record.prev_hash != prev:
            return checked, Break(record.seq, "prev_hash_mismatch")
        if seal(record.seq, record.prev_hash, record.entry) != record.hash:
            return checked, Break(record.seq, "hash_mismatch")
        checked += 1
        prev = record.hash
        expected_seq += 1
    return checked, None
