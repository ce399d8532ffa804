"""Assertions of services and agents: RFC 7523-style JWTs signed with the identity's Ed25519 key.

``iss`` = ``sub`` = the subject, ``aud`` = our issuer, at most ``MAX_ASSERTION_TTL_S`` seconds of
life, and a ``jti`` the caller claims once in the store (replay is refused). The header ``typ`` is
``client-assertion+jwt``, so an assertion can never pass as an access token, nor the reverse.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from .errors import ClaimsInvalid, UnknownKey
from .keyring import thumbprint
from .tokens import ASSERTION_TYP, check_audience, check_time, encode, parse, require_string

__all__ = ["ASSERTION_CLAIMS", "MAX_ASSERTION_TTL_S", "Assertion", "make_assertion", "verify"]

MAX_ASSERTION_TTL_S = 300
ASSERTION_CLAIMS = frozenset({"iss", "sub", "aud", "exp", "iat", "nbf", "jti"})


@dataclass(frozen=True, slots=True)
class Assertion:
    """A verified assertion; ``jti`` still has to be claimed once before it is trusted."""

    subject_id: str
    jti: str
    expires_at: float


def make_assertion(
    key: Ed25519PrivateKey,
    *,
    subject_id: str,
    audience: str,
    now: float,
    ttl_s: int = 60,
    jti: str | None = None,
) -> str:
    """Sign an assertion for ``subject_id`` (what a service, an agent or ``cpctl`` sends)."""
    iat = int(now)
    claims = {
        "iss": subject_id,
        "sub": subject_id,
        "aud": audience,
        "iat": iat,
        "exp": iat + ttl_s,
        "jti": jti or secrets.token_urlsafe(16),
    }
    return encode(claims, key, typ=ASSERTION_TYP, kid=thumbprint(key.public_key()))


def verify(
    token: str,
    *,
    audience: str,
    public_key_for: Callable[[str], Ed25519PublicKey | None],
    now: float,
    clock_skew_s: float = 30,
) -> Assertion:
    """Check ``token`` fully except replay; raises an ``InvalidToken`` subclass.

    ``public_key_for(subject)`` returns the key of an enabled service or agent, else None.
    """
    jws = parse(token, typ=ASSERTION_TYP, require_kid=False)
    # The key is chosen by the (unverified) issuer, as in RFC 7523 §3; nothing else is trusted
    # before the signature has been checked against it.
    unverified = jws.claims()
    subject = unverified.get("iss")
    if not isinstance(subject, str):
        raise ClaimsInvalid()
    key = public_key_for(subject)
    if key is None or (jws.kid is not None and jws.kid != thumbprint(key)):
        raise UnknownKey()
    jws.verify_signature(key)
    claims = unverified
    if not set(claims) <= ASSERTION_CLAIMS:
        raise ClaimsInvalid()
    jti = require_string(claims, "jti")
    if claims.get("sub") != subject:
        raise ClaimsInvalid()
    check_audience(claims, audience)
    check_time(claims, now, skew_s=clock_skew_s, max_lifetime_s=MAX_ASSERTION_TTL_S)
    if claims["exp"] > now + MAX_ASSERTION_TTL_S + clock_skew_s:
        raise ClaimsInvalid()
    return Assertion(subject_id=subject, jti=jti, expires_at=float(claims["exp"]))
