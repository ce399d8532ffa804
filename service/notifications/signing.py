"""Standard Webhooks signatures (https://www.standardwebhooks.com/, "Signature scheme").

A message is signed over ``{webhook-id}.{webhook-timestamp}.{body}`` with HMAC-SHA256; the
``webhook-signature`` header holds ``v1,<base64 signature>`` once per active secret, separated
by spaces, so a secret can be rotated without a gap: configure the new secret next to the old
one, move receivers to the new one, then drop the old. Secrets are ``whsec_`` + base64 of the
key bytes (at least 24 bytes, at most 64: the scheme's recommended range).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Mapping, Sequence

__all__ = ["SECRET_PREFIX", "SignatureError", "parse_secret", "sign", "verify"]

SECRET_PREFIX = "whsec_"  # noqa: S105  (the scheme's prefix, not a secret)
_MIN_KEY, _MAX_KEY = 24, 64


class SignatureError(ValueError):
    """A secret or a signature is malformed, or no signature matches."""


def parse_secret(text: str) -> bytes:
    """The key bytes of a ``whsec_<base64>`` secret; ``SignatureError`` (never echoing it)."""
    if not text.startswith(SECRET_PREFIX):
        raise SignatureError(f"a webhook secret must start with {SECRET_PREFIX}")
    try:
        key = base64.b64decode(text[len(SECRET_PREFIX):], validate=True)
    except (binascii.Error, ValueError):
        raise SignatureError("a webhook secret must be whsec_ followed by base64") from None
    if not _MIN_KEY <= len(key) <= _MAX_KEY:
        raise SignatureError(f"a webhook secret must hold {_MIN_KEY}..{_MAX_KEY} bytes")
    return key


def _mac(key: bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    signed = f"{msg_id}.{timestamp}.".encode() + body
    return base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode("ascii")


def sign(keys: Sequence[bytes], msg_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` header value: ``v1,<sig>`` per key, space-separated."""
    if not keys:
        raise SignatureError("at least one signing key is needed")
    return " ".join(f"v1,{_mac(key, msg_id, timestamp, body)}" for key in keys)


def verify(key: bytes, headers: Mapping[str, str], body: bytes, now: float,
           tolerance_s: float = 300) -> None:
    """Check a received message as a receiver should (``SignatureError`` when it fails):
    the timestamp within ``tolerance_s`` of ``now``, one ``v1`` signature matching (constant
    time)."""
    try:
        msg_id = headers["webhook-id"]
        timestamp = int(headers["webhook-timestamp"])
        signatures = headers["webhook-signature"].split(" ")
    except (KeyError, ValueError):
        raise SignatureError("missing or malformed webhook headers") from None
    if abs(now - timestamp) > tolerance_s:
        raise SignatureError("timestamp outside the tolerance")
    expected = _mac(key, msg_id, timestamp, body).encode()
    for item in signatures:
        version, _, value = item.partition(",")
        if version == "v1" and hmac.compare_digest(value.encode(), expected):
            return
    raise SignatureError("no signature matches")
