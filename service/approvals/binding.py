"""What a ticket is bound to: resource hash (RFC 8785), command hash, and the nonce.

- ``resource_hash``: ``sha256:`` + hex SHA-256 of the RFC 8785 (JCS) canonical JSON of the
  ``resource`` value — string or object — so any client can compute it.
- ``command_hash``: ``sha256:`` + hex SHA-256 of the command's canonical bytes (the UTF-8 of a
  command line, the RFC 8785 JSON of an argv array: ``command.canonical_command``).
- ``nonce``: 256 random bits, returned once to the ticket's creator; the store keeps only its hash.

``mismatched(ticket, binding)`` is the one comparison of a ticket with what a request presents:
the chain's pre-check uses it to answer before opening a transaction, and the store uses it to
say why its conditional UPDATE (the authority) did not match.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from typing import Any, Protocol

from .. import canonical, limits

__all__ = [
    "BINDING_FIELDS",
    "HASH_PATTERN",
    "Binding",
    "BoundTicket",
    "hash_nonce",
    "mismatched",
    "new_nonce",
    "nonce_matches",
    "resource_hash",
]

HASH_PATTERN = re.compile(r"sha256:[0-9a-f]{64}")


def resource_hash(resource: Any) -> str:
    """``sha256:<hex>`` of the canonical JSON of ``resource`` (RFC 8785).

    Within ``service.limits`` or refused (``limits.JSONValueRefused``, a 422): the canonicaliser
    recurses, and what the store cannot keep must not be bound to a ticket either.
    """
    limits.check_json(resource, "/resource")
    text = canonical.dumps(resource)
    limits.check_size(len(text), "/resource")
    return "sha256:" + hashlib.sha256(text).hexdigest()


def new_nonce() -> str:
    """A fresh 256-bit nonce, URL-safe, never starting with ``-`` (a command-line option to
    argument parsers: ``--nonce -jnYZ...`` would not parse). Drawn again rather than changed:
    every such nonce stays uniformly random over the rest."""
    while True:
        nonce = secrets.token_urlsafe(32)
        if not nonce.startswith("-"):
            return nonce


def hash_nonce(nonce: str) -> str:
    return "sha256:" + hashlib.sha256(nonce.encode("utf-8")).hexdigest()


def nonce_matches(nonce: str, nonce_hash: str) -> bool:
    """Constant-time comparison of a presented nonce with the stored hash."""
    return hmac.compare_digest(hash_nonce(nonce), nonce_hash)


#: The fields a ticket is bound to, in the order ``mismatched`` compares them.
BINDING_FIELDS = ("nonce_hash", "subject_id", "env", "action", "resource_hash", "command_hash")


@dataclass(frozen=True, slots=True)
class Binding:
    """What a request presents for a ticket: the hash of its nonce and the request's bindings.

    ``command_hash`` is the request's ``Command-Hash`` (None when absent); a ticket that binds
    no command accepts any.
    """

    nonce_hash: str
    subject_id: str
    env: str
    action: str
    resource_hash: str
    command_hash: str | None


class BoundTicket(Protocol):
    """The bound fields of a stored ticket (``store.base.TicketRecord`` has them)."""

    @property
    def nonce_hash(self) -> str: ...
    @property
    def subject_id(self) -> str: ...
    @property
    def env(self) -> str: ...
    @property
    def action(self) -> str: ...
    @property
    def resource_hash(self) -> str: ...
    @property
    def command_hash(self) -> str | None: ...


def mismatched(ticket: BoundTicket, binding: Binding) -> tuple[str, ...]:
    """The names of the bindings ``binding`` does not satisfy (empty: it fits the ticket).

    Every field is compared in constant time (the nonce hash must be; the others cost nothing
    extra). The nonce comes first, so callers can answer an unknown ticket and a wrong nonce
    alike.
    """
    fields = [
        name
        for name in BINDING_FIELDS[:-1]
        if not _same(getattr(ticket, name), getattr(binding, name))
    ]
    if ticket.command_hash is not None and not _same(ticket.command_hash, binding.command_hash):
        fields.append("command_hash")
    return tuple(fields)


def _same(stored: str | None, presented: str | None) -> bool:
    if stored is None or presented is None:
        return stored is presented
    return hmac.compare_digest(stored.encode(), presented.encode())
