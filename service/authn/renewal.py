"""Renewal credentials: how a CLI keeps working for a whole session with short access tokens.

Access tokens live ``token_ttl_s`` (15 minutes by default) while a person's session lives
``session_ttl_s`` (8 hours). Each token answer for a person's session also carries a
``refresh_token``: a compact JWS of its own type (``renew+jwt``), signed with the access-token
key ring but never accepted as an access token (the verifier checks ``typ`` and the audience
``<audience>#renew``). It names the store session and expires with it. ``POST
/api/v1/authn/token/renew`` trades it for a new access token of the same session:

- every renewal re-reads the session and the identity (``Authenticator.session_principal``), so
  a logout, a revocation, an expiry or a disabled identity refuses it at once, on every replica;
- it never outlives the session (``exp`` is the session's end, and the new token's too);
- step-up freshness is unchanged: a renewal credential issued with a stepped-up token (``stp``)
  yields stepped-up tokens, whose step-up age still counts from the session's one recorded
  ``step_up_at``; it never records a step-up. One issued before the step-up stays un-stepped.

Why a separate credential rather than "renew with the access token, even just expired": an
access token is sent with every request (logs, proxies, a copied ``Authorization`` header); a
renewal credential only to this one endpoint, and is kept in the CLI's 0600 credentials file.
Services and agents get none: their session lives one token, and they sign a new assertion.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .errors import ClaimsInvalid, IssuerMismatch, UnknownKey
from .keyring import KeyRing
from .tokens import check_audience, check_time, encode, parse, require_string

__all__ = ["RENEW_TYP", "Renewal", "issue", "verify"]

RENEW_TYP = "renew+jwt"
AUDIENCE_SUFFIX = "#renew"
CLAIMS = frozenset({"iss", "aud", "sub", "sid", "kind", "iat", "exp", "stp"})


@dataclass(frozen=True, slots=True)
class Renewal:
    """A verified renewal credential: whose session, and whether it was issued stepped up."""

    subject_id: str
    kind: str
    session_id: str
    stepped: bool


def issue(keys: KeyRing, *, issuer: str, audience: str, subject_id: str, kind: str,
          session_id: str, session_expires_at: float, now: float, stepped: bool) -> str:
    """A renewal credential for the session, ending when it ends."""
    claims: dict[str, Any] = {
        "iss": issuer, "aud": audience + AUDIENCE_SUFFIX, "sub": subject_id, "sid": session_id,
        "kind": kind, "iat": int(now), "exp": max(int(now) + 1, math.floor(session_expires_at)),
        "stp": stepped,
    }
    key = keys.signing_key()
    return encode(claims, key.private_key, typ=RENEW_TYP, kid=key.kid)


def verify(keys: KeyRing, token: str, *, issuer: str, audience: str, max_lifetime_s: float,
           skew_s: float, now: float) -> Renewal:
    """The session a renewal credential names (its signature, type, issuer, audience and time);
    the session itself is the caller's to check. Raises an ``InvalidToken`` subclass."""
    jws = parse(token, typ=RENEW_TYP, require_kid=True)
    key = keys.verification_key(jws.kid or "", now)
    if key is None:
        raise UnknownKey()
    jws.verify_signature(key)
    claims = jws.claims()
    if set(claims) != CLAIMS or not isinstance(claims["stp"], bool):
        raise ClaimsInvalid()
    for name in ("sub", "sid", "kind"):
        require_string(claims, name)
    if claims["iss"] != issuer:
        raise IssuerMismatch()
    check_audience(claims, audience + AUDIENCE_SUFFIX)
    check_time(claims, now, skew_s=skew_s, max_lifetime_s=max_lifetime_s + skew_s)
    return Renewal(claims["sub"], claims["kind"], claims["sid"], claims["stp"])
