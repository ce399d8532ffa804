"""Compact JWS (RFC 7515) and JWT access tokens (RFC 7519, RFC 9068), verified as RFC 8725 advises.

The framing is ours and deliberately narrow: EdDSA only, a header of ``alg``/``typ``/``kid`` and
nothing else, canonical base64url, JSON objects without duplicate members, a bounded size, and a
``typ`` per token kind so an assertion never passes as an access token or the other way round.
Access tokens carry identity and session only; authorization state lives in policy data
(DESIGN §1 rule 2), and the verifier refuses any claim outside ``ACCESS_CLAIMS``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
import re
import secrets
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from .errors import (
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
    TokenTypeMismatch,
    UnknownKey,
)
from .keyring import ALG, KeyRing
from .principal import KINDS

__all__ = [
    "ACCESS_CLAIMS",
    "ACCESS_TYP",
    "ASSERTION_TYP",
    "MAX_ACCESS_TTL_S",
    "MAX_TOKEN_BYTES",
    "AccessTokens",
    "CompactJWS",
    "check_audience",
    "check_time",
    "encode",
    "parse",
    "require_string",
]

MAX_TOKEN_BYTES = 8192
MAX_ACCESS_TTL_S = 900
ACCESS_TYP = "at+jwt"  # RFC 9068 §2.1
ASSERTION_TYP = "client-assertion+jwt"  # our assertion kind (assertions.py)
#: RFC 8725 §3.1: the one algorithm we sign and accept.
ALLOWED_ALGS = frozenset({ALG})
#: Every other header member (jwk, jku, x5u, x5c, crit, ...) is refused, never interpreted.
ALLOWED_HEADER = frozenset({"alg", "typ", "kid"})
ACCESS_CLAIMS = frozenset(
    {"iss", "aud", "sub", "sid", "kind", "iat", "nbf", "exp", "jti", "auth_time", "acr", "amr"}
)
_B64URL = re.compile(r"[A-Za-z0-9_-]+")
_MAX_ID = 256


# -- framing -----------------------------------------------------------------------------------


def _b64url_encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode("ascii").rstrip("=")


def _b64url_decode(part: str) -> bytes:
    """Strict base64url: the unpadded alphabet only, and the canonical encoding of its bytes."""
    if not _B64URL.fullmatch(part) or len(part) % 4 == 1:
        raise TokenMalformed()
    try:
        data = base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))
    except (binascii.Error, ValueError) as exc:
        raise TokenMalformed() from exc
    # Non-zero trailing bits would give one token several spellings (and cache keys).
    if _b64url_encode(data) != part:
        raise TokenMalformed()
    return data


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise TokenMalformed()  # RFC 7515 §5.2 step 4: reject duplicate member names
        result[key] = value
    return result


def _reject_constant(_: str) -> Any:
    raise TokenMalformed()  # NaN and Infinity are not JSON


def _json_object(data: bytes) -> dict[str, Any]:
    try:
        value = json.loads(
            data.decode("utf-8"),
            object_pairs_hook=_no_duplicates,
            parse_constant=_reject_constant,
        )
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise TokenMalformed() from exc
    if not isinstance(value, dict):
        raise TokenMalformed()
    return value


def _canonical_typ(value: str) -> str:
    # RFC 7515 §4.1.9: media types compare case-insensitively, "application/" may be omitted.
    value = value.lower()
    return value[len("application/") :] if value.startswith("application/") else value


@dataclass(frozen=True, slots=True)
class CompactJWS:
    """A structurally valid JWS whose signature has not been checked yet."""

    header: Mapping[str, Any]
    payload: bytes
    signing_input: bytes
    signature: bytes

    @property
    def kid(self) -> str | None:
        kid = self.header.get("kid")
        return kid if isinstance(kid, str) else None

    def verify_signature(self, key: Ed25519PublicKey) -> None:
        if len(self.signature) != 64:
            raise SignatureInvalid()
        try:
            key.verify(self.signature, self.signing_input)
        except InvalidSignature as exc:
            raise SignatureInvalid() from exc

    def claims(self) -> dict[str, Any]:
        """The payload as a JSON object; call after ``verify_signature``."""
        return _json_object(self.payload)


def parse(token: str, *, typ: str, require_kid: bool) -> CompactJWS:
    """Check size, framing, encoding and header of ``token``; the signature is checked later."""
    if not isinstance(token, str):
        raise TokenMalformed()
    if len(token) > MAX_TOKEN_BYTES:
        raise TokenTooLarge()
    parts = token.split(".")
    if len(parts) != 3 or not parts[0] or not parts[1]:
        raise TokenMalformed()
    header_b64, payload_b64, signature_b64 = parts
    header = _json_object(_b64url_decode(header_b64))
    payload = _b64url_decode(payload_b64)
    if set(header) - ALLOWED_HEADER:
        raise TokenHeaderInvalid()
    alg = header.get("alg")
    if not isinstance(alg, str) or alg not in ALLOWED_ALGS:
        raise AlgorithmNotAllowed()
    token_typ = header.get("typ")
    if not isinstance(token_typ, str) or _canonical_typ(token_typ) != typ:
        raise TokenTypeMismatch()
    kid = header.get("kid")
    if kid is None and require_kid:
        raise TokenHeaderInvalid()
    if kid is not None and (not isinstance(kid, str) or not 0 < len(kid) <= 128):
        raise TokenHeaderInvalid()
    # An empty signature ("alg": "none" style) fails here at the latest.
    signature = _b64url_decode(signature_b64) if signature_b64 else b""
    return CompactJWS(header, payload, f"{header_b64}.{payload_b64}".encode("ascii"), signature)


def encode(
    claims: Mapping[str, Any], key: Ed25519PrivateKey, *, typ: str, kid: str | None = None
) -> str:
    """Sign ``claims`` as a compact JWS with EdDSA."""
    header: dict[str, str] = {"alg": ALG, "typ": typ}
    if kid is not None:
        header["kid"] = kid
    dumps = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode
    signing_input = (
        f"{_b64url_encode(dumps(header).encode())}.{_b64url_encode(dumps(dict(claims)).encode())}"
    )
    signature = key.sign(signing_input.encode("ascii"))
    return f"{signing_input}.{_b64url_encode(signature)}"


# -- claims ------------------------------------------------------------------------------------


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def require_string(claims: Mapping[str, Any], name: str) -> str:
    value = claims.get(name)
    if not isinstance(value, str) or not 0 < len(value) <= _MAX_ID:
        raise ClaimsInvalid()
    return value


def check_audience(claims: Mapping[str, Any], audience: str) -> None:
    """RFC 7519 §4.1.3: ``aud`` is our audience, or a list of strings that contains it."""
    aud = claims.get("aud")
    if isinstance(aud, str):
        ok = aud == audience
    elif isinstance(aud, list) and aud and all(isinstance(a, str) for a in aud):
        ok = audience in aud
    else:
        raise ClaimsInvalid()
    if not ok:
        raise AudienceMismatch()


def check_time(
    claims: Mapping[str, Any],
    now: float,
    *,
    skew_s: float,
    max_lifetime_s: float,
    require: tuple[str, ...] = ("exp", "iat"),
) -> None:
    """``exp``, ``nbf``, ``iat`` against ``now`` with ``skew_s`` leeway, and a bounded lifetime."""
    for name in ("exp", "nbf", "iat"):
        if name in claims or name in require:
            if not _is_number(claims.get(name)):
                raise ClaimsInvalid()
    exp = claims["exp"]
    if now >= exp + skew_s:
        raise TokenExpired()
    if now + skew_s < claims.get("nbf", -math.inf) or now + skew_s < claims.get("iat", -math.inf):
        raise TokenNotYetValid()
    start = max(claims.get("iat", now), claims.get("nbf", -math.inf))
    # A token must not outlive what its issuer may grant, even if it was signed that way.
    if exp - start > max_lifetime_s or exp < start:
        raise ClaimsInvalid()


# -- access tokens -----------------------------------------------------------------------------


class Verified:
    """A verified token in ``AccessTokens``' cache: its claims, the window of ``now`` in which
    their times hold without a check, and what the token's verifier last derived from them
    (``derived``: ``Authenticator`` keeps the principal of its session there, checked again on
    every use). Dropped with the entry (its ``exp``, the cache's bound)."""

    __slots__ = ("claims", "derived", "valid_from", "valid_until")

    def __init__(self, claims: Mapping[str, Any], valid_from: float, valid_until: float) -> None:
        self.claims = claims
        self.valid_from = valid_from
        self.valid_until = valid_until
        self.derived: Any = None


class AccessTokens:
    """Issue and verify access tokens (``typ`` ``at+jwt``), with a bounded verified-token cache.

    The cache holds verified claims until ``exp`` (an LRU of ``cache_size`` entries); it saves
    the signature check. What the verifier derived from them (``Verified.derived``) serves only
    while the session row the store holds now is the one it checked: revocation is seen at once.
    """

    def __init__(
        self,
        keys: KeyRing,
        *,
        issuer: str,
        audience: str,
        ttl_s: int,
        clock_skew_s: float = 30,
        cache_size: int = 4096,
    ) -> None:
        if not 0 < ttl_s <= MAX_ACCESS_TTL_S:
            raise ValueError(f"access token lifetime must be 1..{MAX_ACCESS_TTL_S} s")
        self.keys = keys
        self.issuer = issuer
        self.audience = audience
        self.ttl_s = ttl_s
        self.clock_skew_s = clock_skew_s
        self.cache_size = cache_size
        # Verified claims, with the window in which ``check_time`` passes for them (what it
        # checks besides ``now`` never changes), so that a hit costs two comparisons.
        self._cache: OrderedDict[bytes, Verified] = OrderedDict()

    def issue(
        self,
        *,
        subject_id: str,
        kind: str,
        session_id: str,
        auth_time: float,
        now: float,
        not_after: float | None = None,
        acr: str | None = None,
        amr: list[str] | None = None,
    ) -> tuple[str, int]:
        """A signed access token and its ``expires_in``; never later than ``not_after``."""
        iat = int(now)
        exp = iat + self.ttl_s
        if not_after is not None:
            exp = min(exp, int(not_after))
        claims: dict[str, Any] = {
            "iss": self.issuer,
            "aud": self.audience,
            "sub": subject_id,
            "sid": session_id,
            "kind": kind,
            "iat": iat,
            "nbf": iat,
            "exp": exp,
            "jti": secrets.token_urlsafe(16),
            "auth_time": int(auth_time),
        }
        if acr is not None:
            claims["acr"] = acr
            claims["amr"] = list(amr or [])
        key = self.keys.signing_key()
        token = encode(claims, key.private_key, typ=ACCESS_TYP, kid=key.kid)
        return token, max(0, exp - iat)

    def verify(self, token: str, now: float) -> Mapping[str, Any]:
        """Verified, read-only claims of ``token``; raises an ``InvalidToken`` subclass."""
        return self.verified(token, now).claims

    def verified(self, token: str, now: float) -> Verified:
        """``verify``, as the cache's entry for ``token`` (its claims, checked at ``now``)."""
        if not isinstance(token, str):
            raise TokenMalformed()
        if len(token) > MAX_TOKEN_BYTES:
            raise TokenTooLarge()  # before hashing: a huge string costs nothing more
        cache_key = hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()
        cached = self._cache.get(cache_key)
        if cached is not None:
            if not cached.valid_from <= now < cached.valid_until:
                try:
                    self._check_time(cached.claims, now)
                except Exception:
                    self._cache.pop(cache_key, None)
                    raise
            self._cache.move_to_end(cache_key)
            return cached
        claims = MappingProxyType(self._verify(token, now))  # its times checked at ``now``
        skew = self.clock_skew_s
        entry = self._cache[cache_key] = Verified(
            claims, max(claims.get("nbf", -math.inf), claims.get("iat", -math.inf)) - skew,
            claims["exp"] + skew)
        if len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return entry

    def _verify(self, token: str, now: float) -> dict[str, Any]:
        jws = parse(token, typ=ACCESS_TYP, require_kid=True)
        key = self.keys.verification_key(jws.kid or "", now)
        if key is None:
            raise UnknownKey()
        jws.verify_signature(key)
        claims = jws.claims()
        # An allow-list: roles, groups, grants or anything else we never issue is refused.
        if not set(claims) <= ACCESS_CLAIMS:
            raise ClaimsInvalid()
        for name in ("sub", "sid", "jti"):
            require_string(claims, name)
        if claims.get("kind") not in KINDS or not _is_number(claims.get("auth_time")):
            raise ClaimsInvalid()
        if "acr" in claims or "amr" in claims:
            amr = claims.get("amr")
            if not isinstance(claims.get("acr"), str) or not (
                isinstance(amr, list) and all(isinstance(m, str) for m in amr)
            ):
                raise ClaimsInvalid()
        if claims.get("iss") != self.issuer:
            raise IssuerMismatch() if isinstance(claims.get("iss"), str) else ClaimsInvalid()
        check_audience(claims, self.audience)
        self._check_time(claims, now)
        return claims

    def _check_time(self, claims: Mapping[str, Any], now: float) -> None:
        check_time(
            claims,
            now,
            skew_s=self.clock_skew_s,
            max_lifetime_s=MAX_ACCESS_TTL_S,
            require=("exp", "iat", "nbf"),
        )

    def cache_len(self) -> int:
        return len(self._cache)
