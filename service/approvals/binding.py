"""What a ticket is bound to: resource hash (RFC 8785), command hash, and the nonce.

- ``resource_hash``: ``sha256:`` + hex SHA-256 of the RFC 8785 (JCS) canonical JSON of the
  ``resource`` value — string or object — so any client can compute it.
- ``command_hash``: ``sha256:`` + hex SHA-256 of the UTF-8 bytes of the exact command line.
- ``nonce``: 256 random bits, returned once to the ticket's creator; the store keeps only its hash.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from typing import Any

import rfc8785

__all__ = [
    "HASH_PATTERN",
    "command_hash",
    "hash_nonce",
    "new_nonce",
    "nonce_matches",
    "resource_hash",
]

HASH_PATTERN = re.compile(r"sha256:[0-9a-f]{64}")


def resource_hash(resource: Any) -> str:
    """``sha256:<hex>`` of the canonical JSON of ``resource`` (RFC 8785)."""
    return "sha256:" + hashlib.sha256(rfc8785.dumps(resource)).hexdigest()


def command_hash(command: str) -> str:
    """``sha256:<hex>`` of the command line exactly as it will be run."""
    return "sha256:" + hashlib.sha256(command.encode("utf-8")).hexdigest()


def new_nonce() -> str:
    """A fresh 256-bit nonce, URL-safe."""
    return secrets.token_urlsafe(32)


def hash_nonce(nonce: str) -> str:
    return "sha256:" + hashlib.sha256(nonce.encode("utf-8")).hexdigest()


def nonce_matches(nonce: str, nonce_hash: str) -> bool:
    """Constant-time comparison of a presented nonce with the stored hash."""
    return hmac.compare_digest(hash_nonce(nonce), nonce_hash)
