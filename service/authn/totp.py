"""TOTP (RFC 6238): SHA-1, 6 digits, 30-second steps, one step of tolerance either side.

``verify`` returns the matched time step; the caller claims ``totp:{subject}:{step}`` once in the
store, so a code is never accepted twice (RFC 6238 §5.2).
"""

from __future__ import annotations

import base64
import binascii
import hmac
import os
import re

from cryptography.hazmat.primitives.hashes import SHA1
from cryptography.hazmat.primitives.twofactor.totp import TOTP

__all__ = [
    "DIGITS",
    "STEP_S",
    "InvalidSecret",
    "code_at",
    "decode_secret",
    "generate_secret",
    "provisioning_uri",
    "verify",
]

DIGITS = 6
STEP_S = 30
#: Accepted drift in steps (RFC 6238 §5.2 recommends at most one step back).
TOLERANCE_STEPS = 1
_MIN_SECRET_BYTES = 16  # RFC 4226 §4 R6: at least 128 bits
_CODE = re.compile(r"[0-9]{6}")
_BASE32 = re.compile(r"[A-Z2-7]+=*")


class InvalidSecret(ValueError):
    """A TOTP secret that is not base32 or is shorter than 128 bits."""


def decode_secret(secret_b32: str) -> bytes:
    """Decode a base32 secret (case-insensitive, padding optional); at least 16 bytes."""
    text = secret_b32.strip().replace(" ", "").upper()
    if not _BASE32.fullmatch(text):
        raise InvalidSecret("TOTP secret is not base32")
    text = text.rstrip("=")
    try:
        key = base64.b32decode(text + "=" * (-len(text) % 8))
    except binascii.Error as exc:
        raise InvalidSecret("TOTP secret is not base32") from exc
    if len(key) < _MIN_SECRET_BYTES:
        raise InvalidSecret("TOTP secret is shorter than 128 bits")
    return key


def generate_secret() -> str:
    """A fresh 160-bit secret, base32 without padding (RFC 4226 §4 recommends 160 bits)."""
    return base64.b32encode(os.urandom(20)).decode("ascii").rstrip("=")


def _totp(secret_b32: str) -> TOTP:
    return TOTP(decode_secret(secret_b32), DIGITS, SHA1(), STEP_S)  # noqa: S303 - RFC 6238 default


def code_at(secret_b32: str, now: float) -> str:
    """The code for the step containing ``now`` (for clients, the CLI and tests)."""
    return _totp(secret_b32).generate(int(now)).decode("ascii")


def verify(secret_b32: str, code: str, now: float) -> int | None:
    """The time step whose code equals ``code`` (now ±1 step), or None."""
    if not isinstance(code, str) or not _CODE.fullmatch(code):
        return None
    totp = _totp(secret_b32)
    current = int(now) // STEP_S
    matched = None
    # Compare against every candidate step so the time does not depend on which one matched.
    for step in range(current - TOLERANCE_STEPS, current + TOLERANCE_STEPS + 1):
        expected = totp.generate(step * STEP_S)
        if hmac.compare_digest(expected, code.encode("ascii")) and matched is None:
            matched = step
    return matched


def provisioning_uri(secret_b32: str, account: str, issuer: str) -> str:
    """The ``otpauth://totp/...`` URI that authenticator apps read (usually as a QR code)."""
    return _totp(secret_b32).get_provisioning_uri(account, issuer)
