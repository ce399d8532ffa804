"""Signed audit checkpoints: the format, the signature, anchors, and what a verification found.

A checkpoint says "record ``seq`` of the chain has hash ``head_hash``", signed by the service's
audit key (``audit.keys``), which is kept outside the database. Since each record's hash covers
the one before it, a valid checkpoint at ``seq`` vouches for records 1..seq: anyone who rewrites
them, even recomputing every hash, no longer matches the signature they cannot make.

Signed bytes: the RFC 8785 (JCS) canonical JSON of
``{"seq", "head_hash", "at", "kid", "purpose": "controlplane-audit-checkpoint"}``, Ed25519,
``sig`` = base64url without padding. JCS rather than JWS because the checkpoint is stored,
listed and mirrored as those plain fields: JCS gives the exact bytes back from them (the chain's
records are already hashed over JCS), with no second, base64-encoded copy of the payload to keep
consistent; the ``purpose`` member separates these signatures from every other use of a key.

The wire, mirror and anchor form is one flat JSON object: the signed members plus ``sig``. An
anchor file is such an object, or JSON lines in which every line with that ``purpose`` counts (so
the JSON-lines mirror, shipped off the host, is itself an anchor file). The mirror's record lines
(``{"seq", "prev_hash", "hash", ...entry}``) count too: each is checked against its own content
when read, and ``verify`` finds every one of them in the chain with the same hash. They are not
signed, so they vouch for nothing; they contradict a record rewritten after it was mirrored,
which no signature covered yet.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from .. import canonical, clock
from ..store.base import AuditCheckpoint, AuditRecord
from .keys import AuditKey, AuditKeyError
from .record import Break, seal

__all__ = [
    "PURPOSE",
    "Verification",
    "from_doc",
    "read_anchors",
    "sign",
    "signature_ok",
    "signed_bytes",
    "to_doc",
]

PURPOSE = "controlplane-audit-checkpoint"
_SHA256 = re.compile(r"sha256:[0-9a-f]{64}")


def signed_bytes(seq: int, head_hash: str, at: str, kid: str) -> bytes:
    """Exactly what is signed: JCS of the checkpoint's members and its purpose."""
    return canonical.dumps({"seq": seq, "head_hash": head_hash, "at": at, "kid": kid,
                          "purpose": PURPOSE})


def sign(key: AuditKey, seq: int, head_hash: str, now: float) -> AuditCheckpoint:
    """A checkpoint of record ``seq`` (hash ``head_hash``) signed by ``key`` at ``now``."""
    if key.private_key is None:
        raise AuditKeyError(f"audit key {key.kid} is retired: it cannot sign")
    at = clock.iso(now) or ""
    sig = key.private_key.sign(signed_bytes(seq, head_hash, at, key.kid))
    return AuditCheckpoint(seq=seq, head_hash=head_hash, at=at, kid=key.kid,
                           sig=base64.urlsafe_b64encode(sig).decode("ascii").rstrip("="))


def signature_ok(checkpoint: AuditCheckpoint, public_key: Ed25519PublicKey) -> bool:
    try:
        sig = base64.urlsafe_b64decode(checkpoint.sig + "=" * (-len(checkpoint.sig) % 4))
        public_key.verify(sig, signed_bytes(checkpoint.seq, checkpoint.head_hash, checkpoint.at,
                                            checkpoint.kid))
    except (InvalidSignature, ValueError, binascii.Error):
        return False
    return True


def to_doc(checkpoint: AuditCheckpoint) -> dict[str, Any]:
    """The wire / mirror / anchor form."""
    return {"purpose": PURPOSE, "seq": checkpoint.seq, "head_hash": checkpoint.head_hash,
            "at": checkpoint.at, "kid": checkpoint.kid, "sig": checkpoint.sig}


def from_doc(doc: Mapping[str, Any]) -> AuditCheckpoint:
    """A checkpoint from its JSON form; ValueError when it is not one."""
    if doc.get("purpose") != PURPOSE:
        raise ValueError("not an audit checkpoint (purpose)")
    seq, head_hash = doc.get("seq"), doc.get("head_hash")
    at, kid, sig = doc.get("at"), doc.get("kid"), doc.get("sig")
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 1:
        raise ValueError("checkpoint seq must be a positive integer")
    if not isinstance(head_hash, str) or not _SHA256.fullmatch(head_hash):
        raise ValueError("checkpoint head_hash must be sha256:<64 hex>")
    if not all(isinstance(v, str) and v for v in (at, kid, sig)):
        raise ValueError("checkpoint at, kid and sig must be non-empty strings")
    return AuditCheckpoint(seq=seq, head_hash=head_hash, at=str(at), kid=str(kid), sig=str(sig))


#: The members of a mirrored record line besides its entry's.
_RECORD_MEMBERS = ("seq", "prev_hash", "hash")


def read_anchors(text: str) -> tuple[list[AuditCheckpoint], list[AuditRecord]]:
    """The checkpoints and the mirrored records in an anchor file (one JSON object, or JSON
    lines); ValueError if it holds neither, or a record line whose hash is not its content's."""
    try:
        docs: list[Any] = [json.loads(text)]
    except json.JSONDecodeError:
        try:
            docs = [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError as exc:
            raise ValueError(f"not JSON or JSON lines (line {exc.lineno})") from None
    dicts = [d for d in docs if isinstance(d, dict)]
    anchors = [from_doc(d) for d in dicts if d.get("purpose") == PURPOSE]
    records = [_record(d) for d in dicts if "purpose" not in d and "hash" in d]
    if not anchors and not records:
        raise ValueError("no audit checkpoint or record in the anchor file")
    return anchors, records


def _record(doc: Mapping[str, Any]) -> AuditRecord:
    """A mirrored record line, its hash recomputed from its content (else ValueError)."""
    seq, prev_hash, digest = (doc.get(k) for k in _RECORD_MEMBERS)
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 1:
        raise ValueError("a mirrored record's seq must be a positive integer")
    if not all(isinstance(h, str) and _SHA256.fullmatch(h) for h in (prev_hash, digest)):
        raise ValueError(f"mirrored record {seq}: prev_hash and hash must be sha256:<64 hex>")
    entry = {k: v for k, v in doc.items() if k not in _RECORD_MEMBERS}
    if seal(seq, str(prev_hash), entry) != digest:
        raise ValueError(f"mirrored record {seq}: its hash is not its content's (the line was "
                         "changed)")
    return AuditRecord(seq=seq, prev_hash=str(prev_hash), hash=str(digest), entry=entry)


@dataclass
class Verification:
    """What walking the chain against its signed checkpoints (and anchors) found."""

    records: int = 0          # records walked whose links and hashes verify
    end_seq: int = 0          # the chain's last seq as stored (head row or last record)
    verified_seq: int = 0     # newest record a valid checkpoint or anchor confirms (0: none),
    verified_hash: str | None = None  # with every record up to it intact
    checkpoints: int = 0      # valid checkpoints that matched the chain
    anchors: int = 0          # anchors that matched the chain
    mirrored: int = 0         # mirrored records (anchor files' record lines) that matched it
    problems: list[Break] = field(default_factory=list)

    @property
    def broken(self) -> Break | None:
        return min(self.problems, key=lambda b: b.seq) if self.problems else None

    @property
    def unverifiable(self) -> tuple[int, int] | None:
        """The records no valid checkpoint vouches for: after the verified head, to the end."""
        return (self.verified_seq + 1, self.end_seq) if self.end_seq > self.verified_seq else None

    @property
    def status(self) -> str:
        """``ok``; ``unanchored`` (intact, but the newest records are not signed yet); ``broken``."""
        if self.problems:
            return "broken"
        return "unanchored" if self.unverifiable else "ok"
