"""Password hashes: scrypt (RFC 7914) in one self-describing string, verified in constant time.

Format: ``scrypt$ln=<log2 N>,r=<r>,p=<p>$<salt b64>$<hash b64>`` (standard base64, no padding).
The parameters travel with each hash, so the cost can be raised later without breaking old hashes.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hmac
import os
import re
from dataclasses import dataclass

from cryptography.hazmat.primitives.kdf.scrypt import Scrypt

__all__ = [
    "DEFAULT_PARAMS",
    "MAX_PASSWORD_BYTES",
    "InvalidHash",
    "ScryptParams",
    "dummy_hash",
    "hash_password",
    "parse_hash",
    "verify_password",
]

#: Longer passwords are refused before hashing (bounds the work an anonymous caller can ask for).
MAX_PASSWORD_BYTES = 1024
_SALT_BYTES = 16
_HASH_BYTES = 32
_FORMAT = re.compile(
    r"scrypt\$ln=(\d{1,2}),r=(\d{1,2}),p=(\d{1,2})\$([A-Za-z0-9+/]{16,88})\$([A-Za-z0-9+/]{43,88})"
)


class InvalidHash(ValueError):
    """The stored string is not a hash this module accepts."""


@dataclass(frozen=True, slots=True)
class ScryptParams:
    ln: int = 15  # N = 32768: 32 MiB with r=8, about 50-100 ms per hash
    r: int = 8
    p: int = 1

    def __post_init__(self) -> None:
        # Bounds keep a hand-edited identities file from making every login a denial of service.
        if not (1 <= self.ln <= 20 and 1 <= self.r <= 32 and 1 <= self.p <= 16):
            raise InvalidHash("scrypt parameters out of range")
        if 128 * self.r * (1 << self.ln) > 128 * 1024 * 1024:  # 128 MiB
            raise InvalidHash("scrypt memory cost out of range")


DEFAULT_PARAMS = ScryptParams()


@dataclass(frozen=True, slots=True)
class _Parsed:
    params: ScryptParams
    salt: bytes
    digest: bytes


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii").rstrip("=")


def _unb64(text: str) -> bytes:
    try:
        return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except binascii.Error as exc:
        raise InvalidHash("bad base64 in hash") from exc


def parse_hash(encoded: str) -> _Parsed:
    """Parse and bound-check a hash string; raises ``InvalidHash``."""
    match = _FORMAT.fullmatch(encoded)
    if match is None:
        raise InvalidHash("not an scrypt hash string")
    ln, r, p = (int(match.group(i)) for i in (1, 2, 3))
    salt, digest = _unb64(match.group(4)), _unb64(match.group(5))
    if len(salt) < _SALT_BYTES or len(digest) < _HASH_BYTES:
        raise InvalidHash("salt or hash too short")
    return _Parsed(ScryptParams(ln, r, p), salt, digest)


def _derive(password: bytes, salt: bytes, params: ScryptParams, length: int) -> bytes:
    kdf = Scrypt(salt=salt, length=length, n=1 << params.ln, r=params.r, p=params.p)
    return kdf.derive(password)


def hash_password(password: str, params: ScryptParams = DEFAULT_PARAMS) -> str:
    """A new hash string for ``password`` with a fresh random salt."""
    raw = password.encode("utf-8")
    if not raw or len(raw) > MAX_PASSWORD_BYTES:
        raise ValueError(f"a password has 1 to {MAX_PASSWORD_BYTES} bytes")
    salt = os.urandom(_SALT_BYTES)
    digest = _derive(raw, salt, params, _HASH_BYTES)
    return f"scrypt$ln={params.ln},r={params.r},p={params.p}${_b64(salt)}${_b64(digest)}"


def verify_password(password: str, encoded: str) -> bool:
    """True when ``password`` matches ``encoded``; the comparison is constant-time.

    Blocking (tens of milliseconds at the default cost): async callers run it in a thread.
    """
    parsed = parse_hash(encoded)
    raw = password.encode("utf-8")
    if len(raw) > MAX_PASSWORD_BYTES:
        # Still spend the same work, so the answer time says nothing.
        raw = raw[:MAX_PASSWORD_BYTES]
        _derive(raw, parsed.salt, parsed.params, len(parsed.digest))
        return False
    candidate = _derive(raw, parsed.salt, parsed.params, len(parsed.digest))
    return hmac.compare_digest(candidate, parsed.digest)


def dummy_hash(like: str | None = None) -> str:
    """A hash of a random password with the cost of ``like`` (default: ``DEFAULT_PARAMS``).

    Verified instead of a real hash for unknown or disabled subjects, so the time a failed
    login takes does not tell whether the subject exists. One per cost per process
    (``_dummy_for``): it only has to cost what a real one costs, and making it is a whole
    scrypt derivation that every identities load (each app start, each reload) paid again.
    """
    return _dummy_for(parse_hash(like).params if like else DEFAULT_PARAMS)


@functools.cache
def _dummy_for(params: ScryptParams) -> str:
    # The password is random and never kept: nothing verifies against it but by chance.
    return hash_password(_b64(os.urandom(24)), params)
