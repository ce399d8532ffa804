"""Signing keys: an Ed25519 key ring on disk, RFC 7638 key ids, JWKS (RFC 7517, RFC 8037).

Layout: one immutable file per key, ``<kid>.json`` (mode 0600) holding the PKCS#8 private key and
its creation time. The newest key signs; an older key is retired the moment a newer one exists and
stays in the JWKS for ``retain_s`` (max token lifetime + clock skew) so every token it signed can
still be verified, then it is deleted. Files are never rewritten, so a process only has to notice
new or deleted names; several worker processes share one directory (creation under ``flock``,
files written with ``O_EXCL`` and moved into place with an atomic rename).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import itertools
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from ..atomicfile import exclusive, write_private

__all__ = [
    "ALG",
    "KeyRing",
    "KeyRingError",
    "SigningKey",
    "load_public_key",
    "public_jwk",
    "thumbprint",
]

ALG = "EdDSA"
_KID = re.compile(r"[A-Za-z0-9_-]{43}")
_LOCK = ".lock"


class KeyRingError(Exception):
    """The key directory cannot be used (unreadable, corrupt or tampered key file)."""


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode("ascii").rstrip("=")


def _raw_public(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def public_jwk(key: Ed25519PublicKey) -> dict[str, str]:
    """The bare OKP JWK of ``key`` (RFC 8037 §2)."""
    return {"kty": "OKP", "crv": "Ed25519", "x": _b64url(_raw_public(key))}


def thumbprint(key: Ed25519PublicKey) -> str:
    """RFC 7638 JWK thumbprint (SHA-256, base64url): required members in lexicographic order."""
    jwk = public_jwk(key)
    canonical = json.dumps(
        {"crv": jwk["crv"], "kty": jwk["kty"], "x": jwk["x"]}, separators=(",", ":")
    )
    return _b64url(hashlib.sha256(canonical.encode("ascii")).digest())


def load_public_key(value: str | Mapping[str, Any]) -> Ed25519PublicKey:
    """An Ed25519 public key from a PEM (SubjectPublicKeyInfo) string or an OKP JWK mapping."""
    if isinstance(value, str):
        try:
            key = serialization.load_pem_public_key(value.encode("ascii"))
        except (ValueError, UnicodeEncodeError) as exc:
            raise ValueError("not a PEM public key") from exc
        if not isinstance(key, Ed25519PublicKey):
            raise ValueError("not an Ed25519 public key")
        return key
    if value.get("kty") != "OKP" or value.get("crv") != "Ed25519" or "d" in value:
        raise ValueError("not an Ed25519 public JWK")
    x = value.get("x")
    if not isinstance(x, str) or not re.fullmatch(r"[A-Za-z0-9_-]{43}", x):
        raise ValueError("bad JWK 'x'")
    raw = base64.urlsafe_b64decode(x + "=")
    if _b64url(raw) != x:
        raise ValueError("bad JWK 'x'")
    return Ed25519PublicKey.from_public_bytes(raw)


@dataclass(frozen=True, slots=True)
class SigningKey:
    kid: str
    private_key: Ed25519PrivateKey
    created_at: float

    @property
    def public_key(self) -> Ed25519PublicKey:
        return self.private_key.public_key()


@dataclass(frozen=True, slots=True)
class _Entry:
    key: SigningKey
    # None while the key is the active one; afterwards the end of its verification window.
    verify_until: float | None


class KeyRing:
    """The signing key ring in ``directory``; see the module docstring for the life of a key."""

    def __init__(self, directory: Path, *, retain_s: float) -> None:
        self.directory = Path(directory)
        self.retain_s = float(retain_s)
        self._names: frozenset[str] = frozenset()
        self._entries: dict[str, _Entry] = {}
        self._active: SigningKey | None = None
        self._dir_mtime: int | None = None

    @classmethod
    def open(cls, directory: Path, *, retain_s: float, now: float) -> Self:
        """Load the ring, creating the directory and a first key if there is none yet."""
        ring = cls(directory, retain_s=retain_s)
        ring.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        with ring._locked():
            if not ring._key_names():
                ring._write_new_key(now)
            ring._prune(now)
        ring._reload()
        return ring

    @classmethod
    def read(cls, directory: Path, *, retain_s: float) -> Self:
        """Load the ring as it is on disk, creating nothing (no directory, no key, no lock file);
        ``KeyRingError`` if the directory does not exist or cannot be read."""
        ring = cls(directory, retain_s=retain_s)
        if not ring.directory.is_dir():
            raise KeyRingError(f"no key directory at {ring.directory}")
        ring._reload()
        return ring

    # -- reading -------------------------------------------------------------------------------

    def describe(self, now: float) -> list[dict[str, Any]]:
        """Every key on disk, the active one first, then newest first: kid, created_at, active,
        verify_until (None for the active key) and whether it verifies at ``now``."""
        self._refresh()
        entries = sorted(
            self._entries.values(), key=lambda e: (e.verify_until is not None, -e.key.created_at)
        )
        return [
            {
                "kid": e.key.kid,
                "created_at": e.key.created_at,
                "active": e.verify_until is None,
                "verify_until": e.verify_until,
                "verifying": e.verify_until is None or now <= e.verify_until,
            }
            for e in entries
        ]

    def signing_key(self) -> SigningKey:
        """The active key; picks up a rotation made by another process first."""
        self._refresh()
        if self._active is None:
            raise KeyRingError("no signing key")
        return self._active

    def verification_key(self, kid: str, now: float) -> Ed25519PublicKey | None:
        """The public key for ``kid`` while tokens it signed may still be valid, else None."""
        entry = self._entries.get(kid)
        if entry is None and _KID.fullmatch(kid):
            # Maybe another process rotated: listing the directory is cheap next to a signature.
            self._refresh()
            entry = self._entries.get(kid)
        if entry is None or (entry.verify_until is not None and now > entry.verify_until):
            return None
        return entry.key.public_key

    def kids(self, now: float) -> list[str]:
        """Ids of the keys that verify at ``now``, the active one first."""
        self._refresh()
        live = [
            e for e in self._entries.values() if e.verify_until is None or now <= e.verify_until
        ]
        live.sort(key=lambda e: (e.verify_until is not None, -e.key.created_at))
        return [e.key.kid for e in live]

    def jwks(self, now: float) -> dict[str, list[dict[str, str]]]:
        """The JWK Set of public keys that verify at ``now`` (never a private member)."""
        keys = []
        for kid in self.kids(now):
            jwk = public_jwk(self._entries[kid].key.public_key)
            keys.append({**jwk, "kid": kid, "alg": ALG, "use": "sig"})
        return {"keys": keys}

    # -- writing -------------------------------------------------------------------------------

    def rotate(self, now: float) -> str:
        """Make a new active key; older keys verify for ``retain_s`` more. Returns the new kid."""
        with self._locked():
            kid = self._write_new_key(now)
            self._prune(now)
        self._reload()
        return kid

    # -- internals -----------------------------------------------------------------------------

    def _locked(self) -> contextlib.AbstractContextManager[None]:
        return exclusive(self.directory / _LOCK)

    def _key_names(self) -> frozenset[str]:
        try:
            names = os.listdir(self.directory)
        except OSError as exc:
            raise KeyRingError(f"cannot list key directory: {exc.strerror}") from exc
        return frozenset(n for n in names if n.endswith(".json") and _KID.fullmatch(n[:-5]))

    def _refresh(self) -> None:
        # A rotation adds a file, which changes the directory's mtime: one stat() instead of a
        # listing on every status call and signature.
        try:
            mtime = os.stat(self.directory).st_mtime_ns
        except OSError as exc:
            raise KeyRingError(f"cannot read key directory: {exc.strerror}") from exc
        if mtime == self._dir_mtime:
            return
        self._dir_mtime = mtime
        if self._key_names() != self._names:
            self._reload()

    def _reload(self) -> None:
        read: list[SigningKey] = []
        for name in self._key_names():
            try:
                read.append(self._read(name))
            except FileNotFoundError:
                continue  # pruned by another process between listing and reading
        keys = sorted(read, key=lambda k: (k.created_at, k.kid))
        names = frozenset(f"{k.kid}.json" for k in keys)
        entries: dict[str, _Entry] = {}
        for older, newer in itertools.pairwise(keys):
            entries[older.kid] = _Entry(older, newer.created_at + self.retain_s)
        if keys:
            entries[keys[-1].kid] = _Entry(keys[-1], None)
        self._names, self._entries = names, entries
        self._active = keys[-1] if keys else None

    def _read(self, name: str) -> SigningKey:
        path = self.directory / name
        try:
            doc = json.loads(path.read_text(encoding="ascii"))
            private = serialization.load_pem_private_key(
                doc["private_key"].encode("ascii"), password=None
            )
            created_at = float(doc["created_at"])
        except FileNotFoundError:
            raise
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise KeyRingError(f"unreadable key file {name}") from exc
        if not isinstance(private, Ed25519PrivateKey):
            raise KeyRingError(f"key file {name} is not Ed25519")
        kid = thumbprint(private.public_key())
        # The file name is the thumbprint: a renamed or edited file is refused, not trusted.
        if name != f"{kid}.json" or doc.get("kid") != kid:
            raise KeyRingError(f"key file {name} does not match its key id")
        return SigningKey(kid, private, created_at)

    def _write_new_key(self, now: float) -> str:
        private = Ed25519PrivateKey.generate()
        kid = thumbprint(private.public_key())
        pem = private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ).decode("ascii")
        body = json.dumps(
            {"kid": kid, "alg": ALG, "crv": "Ed25519", "created_at": now, "private_key": pem},
            indent=2,
        )
        # Readers list *.json only, so they never see the temporary file.
        write_private(self.directory / f"{kid}.json", body)
        return kid

    def _prune(self, now: float) -> None:
        """Delete keys whose verification window has closed (caller holds the lock)."""
        self._reload()
        for entry in list(self._entries.values()):
            if entry.verify_until is not None and now > entry.verify_until:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.directory / f"{entry.key.kid}.json")
