"""The audit signing keys: Ed25519, on disk in their own directory, never in the database.

Layout (``audit.keys_dir``, default ``<state_dir>/audit-keys``, mode 0700): one file per key,
``<kid>.audit-key.json`` (mode 0600), ``kid`` being the RFC 7638 thumbprint of the public key.
The newest key signs checkpoints. ``rotate`` makes a new key and rewrites every older file
without its private key: a retired key can no longer sign, and its public key stays, because
every checkpoint it signed must verify for as long as the chain is kept. Retired keys are never
deleted.

Not a token key: the token key ring (``authn.keyring``) lists ``<kid>.json`` in
``<state_dir>/keys`` only, the files here say ``"purpose": "controlplane-audit"`` and are refused
without it, and what they sign carries ``"purpose": "controlplane-audit-checkpoint"``
(``audit.checkpoint``), so neither kind of signature can stand in for the other.

Several workers share the directory: creation and rotation run under ``flock``, files are
written to a temporary name and renamed into place, and readers notice a rotation by the
directory's mtime (no restart).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from ..atomicfile import exclusive, write_private
from ..authn.keyring import load_public_key, public_jwk, thumbprint

__all__ = ["KEY_PURPOSE", "AuditKey", "AuditKeyError", "AuditKeys", "load_jwks"]

KEY_PURPOSE = "controlplane-audit"
_SUFFIX = ".audit-key.json"
_LOCK = ".lock"


class AuditKeyError(Exception):
    """The audit key directory or a key file cannot be used."""


@dataclass(frozen=True, slots=True)
class AuditKey:
    kid: str
    public_key: Ed25519PublicKey
    created_at: float
    private_key: Ed25519PrivateKey | None  # None once retired

    def public(self, *, active: bool) -> dict[str, Any]:
        """The public JWK (RFC 8037) with its kid and life; never a private member."""
        return {**public_jwk(self.public_key), "kid": self.kid, "alg": "EdDSA", "use": "sig",
                "purpose": KEY_PURPOSE, "created_at": self.created_at, "active": active}


class AuditKeys:
    """The audit key ring in ``directory`` (see the module docstring)."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self._keys: dict[str, AuditKey] = {}
        self._mtime: int | None = None

    @classmethod
    def open(cls, directory: Path, *, now: float) -> AuditKeys:
        """The service's ring: creates the directory and a first key when there is none."""
        ring = cls(directory)
        ring.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        with ring._locked():
            if not ring._names():
                ring._write(Ed25519PrivateKey.generate(), now)
        ring._reload()
        return ring

    @classmethod
    def load(cls, directory: Path) -> AuditKeys:
        """An existing ring, read only (verification never creates a key); raises when absent."""
        ring = cls(directory)
        if not ring.directory.is_dir():
            raise AuditKeyError(f"no audit key directory at {directory}")
        ring._reload()
        return ring

    # -- reading -------------------------------------------------------------------------------

    def signing_key(self) -> AuditKey:
        """The active key (the newest one that still has its private key)."""
        self._refresh()
        active = self._active()
        if active is None or active.private_key is None:
            raise AuditKeyError("no active audit signing key")
        return active

    def public_keys(self) -> dict[str, Ed25519PublicKey]:
        """Every key that ever signed here, by kid (retired ones included)."""
        self._refresh()
        return {kid: key.public_key for kid, key in self._keys.items()}

    def jwks(self) -> dict[str, list[dict[str, Any]]]:
        """The public keys as a JWK Set, newest first: what ``--keys FILE`` reads back."""
        self._refresh()
        active = self._active()
        keys = sorted(self._keys.values(), key=lambda k: (-k.created_at, k.kid))
        return {"keys": [k.public(active=k is active) for k in keys]}

    # -- writing -------------------------------------------------------------------------------

    def rotate(self, now: float) -> str:
        """Make a new active key and strip the private key of every older one; the new kid."""
        with self._locked():
            new = Ed25519PrivateKey.generate()
            kid = self._write(new, now)
            self._reload()
            for key in self._keys.values():
                if key.kid != kid and key.private_key is not None:
                    self._write_file(key.kid, self._document(key.kid, key.public_key,
                                                             key.created_at, None))
        self._reload()
        return kid

    # -- internals -----------------------------------------------------------------------------

    def _active(self) -> AuditKey | None:
        signing = [k for k in self._keys.values() if k.private_key is not None]
        return max(signing, key=lambda k: (k.created_at, k.kid)) if signing else None

    def _locked(self) -> contextlib.AbstractContextManager[None]:
        return exclusive(self.directory / _LOCK)

    def _names(self) -> list[str]:
        try:
            return sorted(n for n in os.listdir(self.directory) if n.endswith(_SUFFIX))
        except OSError as exc:
            raise AuditKeyError(f"cannot list the audit key directory: {exc.strerror}") from exc

    def _refresh(self) -> None:
        try:
            mtime = os.stat(self.directory).st_mtime_ns
        except OSError as exc:
            raise AuditKeyError(f"cannot read the audit key directory: {exc.strerror}") from exc
        if mtime != self._mtime:
            self._reload()

    def _reload(self) -> None:
        with contextlib.suppress(OSError):
            self._mtime = os.stat(self.directory).st_mtime_ns
        keys: dict[str, AuditKey] = {}
        for name in self._names():
            try:
                key = self._read(name)
            except FileNotFoundError:
                continue
            keys[key.kid] = key
        self._keys = keys

    def _read(self, name: str) -> AuditKey:
        path = self.directory / name
        try:
            doc = json.loads(path.read_text(encoding="ascii"))
            public = load_public_key(doc["public_key"])
            created_at = float(doc["created_at"])
            pem = doc.get("private_key")
            private = (None if pem is None
                       else serialization.load_pem_private_key(pem.encode("ascii"), password=None))
        except FileNotFoundError:
            raise
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise AuditKeyError(f"unreadable audit key file {name}") from exc
        kid = thumbprint(public)
        if doc.get("purpose") != KEY_PURPOSE:
            raise AuditKeyError(f"{name} is not an audit key")
        if name != f"{kid}{_SUFFIX}" or doc.get("kid") != kid:
            raise AuditKeyError(f"audit key file {name} does not match its key id")
        if private is not None and (
            not isinstance(private, Ed25519PrivateKey) or thumbprint(private.public_key()) != kid
        ):
            raise AuditKeyError(f"audit key file {name}: the private key is not its public key's")
        return AuditKey(kid, public, created_at, private)

    @staticmethod
    def _document(kid: str, public: Ed25519PublicKey, created_at: float,
                  private: Ed25519PrivateKey | None) -> dict[str, Any]:
        doc: dict[str, Any] = {"purpose": KEY_PURPOSE, "kid": kid, "alg": "EdDSA",
                               "crv": "Ed25519", "created_at": created_at,
                               "public_key": public_jwk(public)}
        if private is not None:
            doc["private_key"] = private.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            ).decode("ascii")
        return doc

    def _write(self, private: Ed25519PrivateKey, now: float) -> str:
        kid = thumbprint(private.public_key())
        self._write_file(kid, self._document(kid, private.public_key(), now, private))
        return kid

    def _write_file(self, kid: str, doc: Mapping[str, Any]) -> None:
        write_private(self.directory / f"{kid}{_SUFFIX}", json.dumps(doc, indent=2))


def load_jwks(text: str) -> dict[str, Ed25519PublicKey]:
    """Public keys by kid from a JWK Set (``cpctl audit keys list``): each kid must be its key's
    RFC 7638 thumbprint. Raises ``AuditKeyError``."""
    try:
        doc = json.loads(text)
        keys: dict[str, Ed25519PublicKey] = {}
        for jwk in doc["keys"]:
            key = load_public_key({k: v for k, v in jwk.items() if k in ("kty", "crv", "x")})
            if jwk.get("kid") != thumbprint(key):
                raise ValueError("kid is not the key's thumbprint")
            keys[jwk["kid"]] = key
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise AuditKeyError(f"not a JWK Set of audit public keys: {exc}") from None
    return keys
