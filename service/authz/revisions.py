"""Published policy revisions: the canonical bundle, its id, and its Ed25519 JWS signature.

A bundle is exactly what a revision is built from: the top-level ``*.rego`` modules of a
policies directory (``*_test.rego`` included, so every process vets it as the publisher did)
and the files of its ``data/`` directory, as text. Its **id** is the engine's revision id of
that content (``source.read_snapshot`` over the files), so a decision made with a published
revision records the id ``cpctl policy revisions`` lists. Its **digest** is ``sha256:`` of the
RFC 8785 (JCS) JSON of ``{"format", "modules", "data"}``: what the signature covers.

Signature: a JWS (RFC 7515) in flattened JSON serialization, ``alg`` ``EdDSA`` with Ed25519
(RFC 8037) and nothing else; the protected header names the key by its RFC 7638 JWK thumbprint
(``kid``). The payload is the JCS JSON of ``{"purpose", "revision", "digest", "author",
"message", "created_at"}``; ``purpose`` keeps these signatures apart from every other use of a
key. The service trusts a configured set of public keys (``policies.store.trusted_keys``); a
revision whose signature does not verify with one of them never loads.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from .. import canonical
from .source import DATA_SUFFIXES, Snapshot, SourceError, read_snapshot

__all__ = [
    "ALGORITHM",
    "FORMAT",
    "POLICY_KEYS",
    "PURPOSE",
    "Bundle",
    "BundleError",
    "Claims",
    "SignatureError",
    "TrustedKeys",
    "key_id",
    "load_private_key",
    "load_public_key",
    "materialize",
    "open_payload",
    "sign",
    "sign_payload",
    "verify",
]

FORMAT = "controlplane-policy-bundle/1"
PURPOSE = "controlplane-policy-revision"
#: The only JWS algorithm accepted (an explicit allow-list: never ``none``, never HMAC).
ALGORITHM = "EdDSA"
_TYP = "controlplane-policy-revision+jws"

_MODULE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}\.rego")
_DATA_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}\.(?:yaml|yml|json)")
#: The most bytes one bundle may hold (all files' text together).
MAX_BUNDLE_BYTES = 4 * 1024 * 1024


class BundleError(Exception):
    """A bundle that cannot be a revision: bad file names, not UTF-8, too large, no module."""


class SignatureError(Exception):
    """A signature that does not vouch for the bundle; ``reason`` is a stable code:
    ``malformed``, ``algorithm_not_allowed``, ``untrusted_key``, ``bad_signature``,
    ``wrong_purpose``, ``digest_mismatch``, ``revision_mismatch``."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


def _b64u(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode("ascii").rstrip("=")


def _unb64u(text: str) -> bytes:
    if not isinstance(text, str) or not re.fullmatch(r"[A-Za-z0-9_-]*", text):
        raise ValueError("not base64url")
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass(frozen=True)
class Bundle:
    """The files of one revision: module name -> Rego source, data file name -> text."""

    modules: Mapping[str, str]
    data: Mapping[str, str]

    def __post_init__(self) -> None:
        if not any(not name.endswith("_test.rego") for name in self.modules):
            raise BundleError("a bundle needs at least one policy module (*.rego)")
        for name in self.modules:
            if not _MODULE_NAME.fullmatch(name):
                raise BundleError(f"module name not allowed: {name[:64]!r}")
        for name in self.data:
            if not _DATA_NAME.fullmatch(name) or not name.endswith(DATA_SUFFIXES):
                raise BundleError(f"data file name not allowed: {name[:64]!r}")
        size = sum(len(t.encode("utf-8", "surrogatepass")) for t in (*self.modules.values(),
                                                                       *self.data.values()))
        if size > MAX_BUNDLE_BYTES:
            raise BundleError(f"bundle too large ({size} bytes; at most {MAX_BUNDLE_BYTES})")

    @classmethod
    def from_dir(cls, policies_dir: Path) -> Bundle:
        """The bundle of a policies directory: what the engine would read from it."""
        if not policies_dir.is_dir():
            raise BundleError(f"policies directory not found: {policies_dir}")
        data_dir = policies_dir / "data"
        data_files = (sorted(p for p in data_dir.iterdir()
                             if p.is_file() and p.suffix in DATA_SUFFIXES)
                      if data_dir.is_dir() else [])
        try:
            # Bytes decoded as they are (no newline translation): the content hashed here is
            # the content the engine hashes when it reads the same files.
            modules = {p.name: p.read_bytes().decode("utf-8")
                       for p in sorted(policies_dir.glob("*.rego")) if p.is_file()}
            data = {p.name: p.read_bytes().decode("utf-8") for p in data_files}
        except (OSError, UnicodeDecodeError) as exc:
            raise BundleError(f"cannot read the policies: {exc.__class__.__name__}") from None
        return cls(modules, data)

    @classmethod
    def from_doc(cls, doc: Any) -> Bundle:
        """From the wire or stored form ``{"format", "modules": {...}, "data": {...}}``."""
        if not isinstance(doc, Mapping) or doc.get("format") != FORMAT:
            raise BundleError(f"not a {FORMAT} document")
        modules, data = doc.get("modules"), doc.get("data")
        if not isinstance(modules, Mapping) or not isinstance(data, Mapping):
            raise BundleError("modules and data must be objects")
        for value in (*modules.values(), *data.values()):
            if not isinstance(value, str):
                raise BundleError("every file's content must be a string")
        return cls(dict(modules), dict(data))

    def to_doc(self) -> dict[str, Any]:
        return {"format": FORMAT, "modules": dict(self.modules), "data": dict(self.data)}

    def canonical(self) -> bytes:
        """The RFC 8785 bytes the digest (and so the signature) covers."""
        return canonical.dumps(self.to_doc())

    @property
    def digest(self) -> str:
        return "sha256:" + hashlib.sha256(self.canonical()).hexdigest()

    def write(self, directory: Path) -> None:
        """Write the files into ``directory`` (a policies directory layout: ``data/`` beside)."""
        (directory / "data").mkdir(parents=True, exist_ok=True)
        for name, text in self.modules.items():
            (directory / name).write_bytes(text.encode("utf-8"))
        for name, text in self.data.items():
            (directory / "data" / name).write_bytes(text.encode("utf-8"))

    def snapshot(self) -> Snapshot:
        """The engine's snapshot of this content (read back exactly as from a directory, so
        its ``revision`` is the id the same files in ``policies.dir`` would have). Blocking."""
        with tempfile.TemporaryDirectory(prefix="cp-revision-") as tmp:
            self.write(Path(tmp))
            try:
                return read_snapshot(Path(tmp))
            except SourceError as exc:
                raise BundleError(str(exc).replace(tmp, "<revision>")) from None

    def revision_id(self) -> str:
        return self.snapshot().revision


def materialize(bundle: Bundle, directory: Path) -> Path:
    """Write a published revision's files into ``directory`` (created if missing) and return it:
    a policies directory any engine (``policies.candidate_dir``, ``cpctl policy test``) reads."""
    directory.mkdir(parents=True, exist_ok=True)
    bundle.write(directory)
    return directory


# ---------------------------------------------------------------------------------------- keys


def key_id(public: Ed25519PublicKey) -> str:
    """RFC 7638 JWK thumbprint (SHA-256, base64url) of an Ed25519 public key."""
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    jwk = {"crv": "Ed25519", "kty": "OKP", "x": _b64u(raw)}
    return _b64u(hashlib.sha256(canonical.dumps(jwk)).digest())


def load_private_key(path: Path) -> Ed25519PrivateKey:
    """An Ed25519 private key from a PEM file (the publisher's policy-signing key)."""
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise SignatureError("malformed", f"{path}: not a readable unencrypted PEM private key "
                             f"({exc.__class__.__name__})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise SignatureError("malformed", f"{path}: not an Ed25519 key")
    return key


def load_public_key(text: bytes, name: str) -> Ed25519PublicKey:
    """An Ed25519 public key from PEM (a private key's file works too: its public half)."""
    try:
        key: Any = serialization.load_pem_public_key(text)
    except ValueError:
        try:
            key = serialization.load_pem_private_key(text, password=None).public_key()
        except (ValueError, TypeError):
            raise SignatureError("malformed", f"{name}: not a PEM public key") from None
    if not isinstance(key, Ed25519PublicKey):
        raise SignatureError("malformed", f"{name}: not an Ed25519 key")
    return key


class TrustedKeys(Mapping[str, Ed25519PublicKey]):
    """kid -> public key: the keys whose signatures a process accepts."""

    def __init__(self, keys: Mapping[str, Ed25519PublicKey]) -> None:
        self._keys = dict(keys)

    @classmethod
    def from_files(cls, paths: tuple[Path, ...] | list[Path]) -> TrustedKeys:
        keys: dict[str, Ed25519PublicKey] = {}
        for path in paths:
            try:
                text = path.read_bytes()
            except OSError as exc:
                raise SignatureError("malformed", f"{path}: cannot read ({exc.strerror})") from None
            key = load_public_key(text, str(path))
            keys[key_id(key)] = key
        return cls(keys)

    def __getitem__(self, kid: str) -> Ed25519PublicKey:
        return self._keys[kid]

    def __iter__(self) -> Any:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)


#: The public keys trusted to sign policy revisions (``policies.store.trusted_keys``).
POLICY_KEYS: web.AppKey[TrustedKeys] = web.AppKey("policy_keys")


# ----------------------------------------------------------------------------------- signature


@dataclass(frozen=True)
class Claims:
    """What a signature says about a revision (its JWS payload) and who signed it."""

    revision: str
    digest: str
    author: str
    message: str
    created_at: str
    kid: str


def sign(bundle: Bundle, key: Ed25519PrivateKey, *, author: str, message: str,
         created_at: str, revision: str | None = None) -> dict[str, str]:
    """The flattened JWS that vouches for ``bundle`` (``revision``: its id, computed if None)."""
    payload = {"purpose": PURPOSE, "revision": revision or bundle.revision_id(),
               "digest": bundle.digest, "author": author, "message": message,
               "created_at": created_at}
    return sign_payload(payload, key, _TYP)


def sign_payload(payload: Mapping[str, Any], key: Ed25519PrivateKey, typ: str
                 ) -> dict[str, str]:
    """A flattened JWS (EdDSA) over the JCS JSON of ``payload``; the header names the key."""
    header = {"alg": ALGORITHM, "kid": key_id(key.public_key()), "typ": typ}
    protected, body = _b64u(canonical.dumps(header)), _b64u(canonical.dumps(dict(payload)))
    signature = key.sign(f"{protected}.{body}".encode("ascii"))
    return {"protected": protected, "payload": body, "signature": _b64u(signature)}


def open_payload(jws: Any, trusted: Mapping[str, Ed25519PublicKey]) -> tuple[dict[str, Any], str]:
    """The payload of ``jws`` and the kid that signed it, if a trusted key signed it with
    ``alg`` EdDSA (checked before any key is used); else SignatureError. The caller checks
    the payload's ``purpose`` and fields."""
    if not isinstance(jws, Mapping) or not all(
        isinstance(jws.get(k), str) for k in ("protected", "payload", "signature")
    ):
        raise SignatureError("malformed", "the signature is not a flattened JWS")
    try:
        header = json.loads(_unb64u(jws["protected"]))
        payload = json.loads(_unb64u(jws["payload"]))
        signature = _unb64u(jws["signature"])
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise SignatureError("malformed", "the signature is not valid base64url JSON") from None
    if not isinstance(header, dict) or not isinstance(payload, dict):
        raise SignatureError("malformed", "the JWS header and payload must be objects")
    if header.get("alg") != ALGORITHM or "crit" in header:
        raise SignatureError("algorithm_not_allowed", "only alg EdDSA (Ed25519) is accepted")
    kid = header.get("kid")
    key = trusted.get(kid) if isinstance(kid, str) else None
    if key is None or not isinstance(kid, str):
        raise SignatureError("untrusted_key", "not signed by a trusted key")
    try:
        key.verify(signature, f"{jws['protected']}.{jws['payload']}".encode("ascii"))
    except (InvalidSignature, ValueError):
        raise SignatureError("bad_signature", "the signature does not verify") from None
    return payload, kid


def verify(bundle: Bundle, jws: Any, trusted: Mapping[str, Ed25519PublicKey], *,
           revision: str | None = None) -> Claims:
    """The claims of ``jws`` if a trusted key signed exactly this bundle; else SignatureError.

    ``revision``: the id the caller holds the bundle under (the store's), which must be the
    signed one. The header is checked before any key is used: ``alg`` must be ``EdDSA``."""
    payload, kid = open_payload(jws, trusted)
    if payload.get("purpose") != PURPOSE:
        raise SignatureError("wrong_purpose", "the signature is not for a policy revision")
    fields = ("revision", "digest", "author", "message", "created_at")
    if not all(isinstance(payload.get(f), str) for f in fields):
        raise SignatureError("malformed", "the signed claims are incomplete")
    if payload["digest"] != bundle.digest:
        raise SignatureError("digest_mismatch", "the signature is for other content")
    if revision is not None and payload["revision"] != revision:
        raise SignatureError("revision_mismatch", "the signature names another revision")
    return Claims(payload["revision"], payload["digest"], payload["author"], payload["message"],
                  payload["created_at"], kid)
