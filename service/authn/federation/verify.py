"""Foreign JWTs (ID tokens, workload tokens) verified strictly with joserfc.

joserfc does the JOSE part (compact parsing, the key, the signature) with the algorithm pinned
to the issuer's allow-list; the claims are checked here, explicitly, against our clock. What is
refused before any key is touched: a token over ``MAX_FOREIGN_TOKEN_BYTES``, a header that is
not a JSON object, ``alg`` outside the issuer's list (``none`` and every HMAC can never be in
it: the configuration refuses them), ``crit``, embedded keys or key URLs (``jwk``, ``jku``,
``x5u``, ``x5c``: RFC 8725 §3.10). A ``kid`` unknown to the issuer's set triggers one refetch
(``RemoteKeys.key_for``), then ``UnknownKey``.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Collection, Mapping
from typing import Any

from joserfc import jwt
from joserfc.errors import BadSignatureError, JoseError
from joserfc.jwk import KeySet

from ..errors import (
    AlgorithmNotAllowed,
    AudienceMismatch,
    ClaimsInvalid,
    IssuerMismatch,
    SignatureInvalid,
    TokenExpired,
    TokenHeaderInvalid,
    TokenMalformed,
    TokenNotYetValid,
    TokenTooLarge,
    UnknownKey,
)
from .remote import RemoteKeys

__all__ = ["ASYMMETRIC_ALGS", "MAX_FOREIGN_TOKEN_BYTES", "peek", "verify_foreign"]

MAX_FOREIGN_TOKEN_BYTES = 16384
#: The only algorithms an issuer may be configured with (public-key signatures).
ASYMMETRIC_ALGS = frozenset(
    {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}
)
_FORBIDDEN_HEADERS = frozenset({"crit", "jwk", "jku", "x5u", "x5c"})


def _b64json(part: str) -> Any:
    try:
        raw = base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))
        return json.loads(raw)
    except (binascii.Error, ValueError):
        raise TokenMalformed() from None


def peek(token: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Header and claims of a compact JWS, unverified (to pick the issuer's configuration)."""
    if not isinstance(token, str):
        raise TokenMalformed()
    if len(token) > MAX_FOREIGN_TOKEN_BYTES:
        raise TokenTooLarge()
    parts = token.split(".")
    if len(parts) != 3 or not all(parts[:2]):
        raise TokenMalformed()
    header, claims = _b64json(parts[0]), _b64json(parts[1])
    if not isinstance(header, dict) or not isinstance(claims, dict):
        raise TokenMalformed()
    return header, claims


async def verify_foreign(
    token: str,
    keys: RemoteKeys,
    *,
    algorithms: Collection[str],
    issuer: str,
    audience: str,
    now: float,
    leeway_s: float,
    max_age_s: float | None = None,
    required: Collection[str] = ("iss", "sub", "aud", "exp", "iat"),
) -> dict[str, Any]:
    """The verified claims of ``token``; raises an ``InvalidToken`` subclass.

    ``max_age_s`` bounds ``now - iat`` (a token older than that is stale even before it expires).
    """
    header, _ = peek(token)
    alg = header.get("alg")
    if not isinstance(alg, str) or alg not in algorithms or alg not in ASYMMETRIC_ALGS:
        raise AlgorithmNotAllowed()
    if _FORBIDDEN_HEADERS & header.keys():
        raise TokenHeaderInvalid()
    kid = header.get("kid")
    if kid is not None and not isinstance(kid, str):
        raise TokenHeaderInvalid()
    key_set = await keys.key_for(kid)
    candidates = [k for k in key_set.keys if kid is None or k.kid == kid]
    if not candidates or (kid is None and len(candidates) != 1):
        raise UnknownKey()
    try:
        decoded = jwt.decode(token, KeySet(candidates), algorithms=[alg])
    except BadSignatureError:
        raise SignatureInvalid() from None
    except JoseError:
        # A key that does not fit the algorithm, a malformed segment, an unusable key.
        raise SignatureInvalid() from None
    claims = dict(decoded.claims)
    check_claims(
        claims, issuer=issuer, audience=audience, now=now, leeway_s=leeway_s,
        max_age_s=max_age_s, required=required,
    )  # fmt: skip
    return claims


def check_claims(
    claims: Mapping[str, Any],
    *,
    issuer: str,
    audience: str,
    now: float,
    leeway_s: float,
    max_age_s: float | None,
    required: Collection[str],
) -> None:
    for name in required:
        if name not in claims:
            raise ClaimsInvalid()
    for name in ("exp", "iat", "nbf", "auth_time"):
        value = claims.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ClaimsInvalid()
    for name in ("iss", "sub", "jti", "nonce", "azp"):
        value = claims.get(name)
        if value is not None and (not isinstance(value, str) or not value or len(value) > 1024):
            raise ClaimsInvalid()
    if claims.get("iss") != issuer:
        raise IssuerMismatch()
    aud = claims.get("aud")
    audiences = [aud] if isinstance(aud, str) else aud
    if not isinstance(audiences, list) or audience not in audiences:
        raise AudienceMismatch()
    if "exp" in claims and now > float(claims["exp"]) + leeway_s:
        raise TokenExpired()
    if "nbf" in claims and now + leeway_s < float(claims["nbf"]):
        raise TokenNotYetValid()
    if "iat" in claims:
        iat = float(claims["iat"])
        if now + leeway_s < iat:
            raise TokenNotYetValid()
        if max_age_s is not None and now - iat > max_age_s + leeway_s:
            raise TokenExpired()
