"""Signed activations: which revision the fleet runs is a statement a trusted key signed.

A revision's own signature says what a policy *is*; it does not say that the fleet should *run*
it now. So every activation (and rollback) is itself signed, by the activation key of the
replica that executed it after its approval (``policies.store.activation_key``): a flattened
JWS, ``alg`` EdDSA, over the JCS JSON of ``{"purpose", "seq", "revision", "previous", "kind",
"activated_by", "activated_at", "ticket"}``. Every replica verifies it with the activation keys
it is configured to trust (``policies.store.trusted_activation_keys``, and the public half of
its own activation key): that trust never comes from the database.

A store-following replica refuses an activation row whose signature is missing or does not
verify (``unsigned``, ``untrusted_key``, ``bad_signature``, ...), whose columns differ from
what was signed (``mismatch``: a signature copied onto another row), or whose ``seq`` is not
above the last one it accepted (``out_of_sequence``: an older signed activation replayed).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from ..store.base import PolicyActivation
from .revisions import (
    SignatureError,
    TrustedKeys,
    key_id,
    load_private_key,
    open_payload,
    sign_payload,
)

__all__ = [
    "ACTIVATION_PURPOSE",
    "POLICY_ACTIVATION_SIGNER",
    "ActivationRefused",
    "ActivationSigner",
    "activation_keys",
    "verify_activation",
]

ACTIVATION_PURPOSE = "controlplane-policy-activation"
_TYP = "controlplane-policy-activation+jws"


class ActivationRefused(Exception):
    """An activation a replica must not follow; ``reason`` is a stable code (a metric label):
    ``unsigned``, ``malformed``, ``algorithm_not_allowed``, ``untrusted_key``,
    ``bad_signature``, ``wrong_purpose``, ``mismatch``, ``out_of_sequence``."""

    REASONS = ("unsigned", "malformed", "algorithm_not_allowed", "untrusted_key",
               "bad_signature", "wrong_purpose", "mismatch", "out_of_sequence")

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


def _claims(a: PolicyActivation, ticket: str | None) -> dict[str, Any]:
    return {"purpose": ACTIVATION_PURPOSE, "seq": a.seq, "revision": a.revision_id,
            "previous": a.previous_id, "kind": a.kind, "activated_by": a.activated_by,
            # A float's JSON is not canonical across languages: the time in microseconds.
            "activated_at_us": round(a.activated_at * 1_000_000), "ticket": ticket}


@dataclass(frozen=True)
class ActivationSigner:
    """This replica's activation key: signs the activations it executes."""

    key: Ed25519PrivateKey

    @classmethod
    def from_file(cls, path: Path) -> ActivationSigner:
        return cls(load_private_key(path))

    @property
    def kid(self) -> str:
        return key_id(self.key.public_key())

    def sign(self, activation: PolicyActivation, ticket: str | None) -> dict[str, str]:
        return sign_payload(_claims(activation, ticket), self.key, _TYP)


#: This replica's activation key (``policies.store.activation_key``), None when not configured
#: or unreadable: activations and rollbacks executed here are signed with it.
POLICY_ACTIVATION_SIGNER: web.AppKey[ActivationSigner | None] = web.AppKey(
    "policy_activation_signer")


def activation_keys(paths: tuple[Path, ...] | list[Path],
                    signer: ActivationSigner | None) -> TrustedKeys:
    """The activation keys a replica trusts: the configured files and its own key's public
    half. SignatureError when a file cannot be read."""
    keys: dict[str, Ed25519PublicKey] = dict(TrustedKeys.from_files(paths))
    if signer is not None:
        keys[signer.kid] = signer.key.public_key()
    return TrustedKeys(keys)


def verify_activation(a: PolicyActivation, trusted: Mapping[str, Ed25519PublicKey],
                      after_seq: int | None = None) -> str | None:
    """The approving ticket id the signature names (None: none was needed), if a trusted
    activation key signed exactly this row and its ``seq`` is above ``after_seq`` (the last
    one this replica accepted); else ``ActivationRefused``."""
    if a.signature is None:
        raise ActivationRefused("unsigned", "the activation is not signed")
    try:
        payload, _kid = open_payload(a.signature, trusted)
    except SignatureError as exc:
        raise ActivationRefused(exc.reason, f"activation signature: {exc}") from None
    if payload.get("purpose") != ACTIVATION_PURPOSE:
        raise ActivationRefused("wrong_purpose", "the signature is not for an activation")
    ticket = payload.get("ticket")
    if payload != _claims(a, ticket if isinstance(ticket, str) else None):
        raise ActivationRefused("mismatch", "the activation is not what its signature says "
                                f"(signed for seq {payload.get('seq')!r})")
    if after_seq is not None and a.seq <= after_seq:
        raise ActivationRefused("out_of_sequence", f"activation seq {a.seq} is not after "
                                f"seq {after_seq}, the last one accepted here")
    return ticket if isinstance(ticket, str) else None
