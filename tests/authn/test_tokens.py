"""Access tokens: the malicious and malformed token table, claim hygiene, cache and rotation."""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from service.authn import assertions
from service.authn.errors import InvalidToken
from service.authn.keyring import KeyRing, public_jwk
from service.authn.sessions import Authenticator
from service.authn.tokens import ACCESS_CLAIMS, MAX_TOKEN_BYTES

from .conftest import AUDIENCE, ISSUER, NOW, PASSWORDS, SERVICE_KEYS, b64url, decode_part, forge


@dataclass
class Ctx:
    """A valid token and what it takes to forge variants of it."""

    token: str
    revoked_token: str
    header: dict[str, Any]
    claims: dict[str, Any]
    key: Ed25519PrivateKey

    def sign(self, header: dict[str, Any] | None = None, **claims: Any) -> str:
        merged = {**self.claims, **claims}
        for name in [k for k, v in merged.items() if v is None]:
            del merged[name]
        return forge(header or self.header, merged, self.key)

    def with_header(self, **fields: Any) -> str:
        return forge({**self.header, **fields}, self.claims, self.key)


@pytest.fixture
async def ctx(auth: Authenticator, keyring: KeyRing) -> Ctx:
    issued = await auth.login_password("alice", PASSWORDS["alice"], "10.0.0.1", NOW)
    revoked = await auth.login_password("bob", PASSWORDS["bob"], "10.0.0.1", NOW)
    principal = await auth.authenticate_bearer(revoked.access_token, NOW)
    assert await auth.revoke(principal, NOW + 1)
    return Ctx(
        token=issued.access_token,
        revoked_token=revoked.access_token,
        header=decode_part(issued.access_token, 0),
        claims=decode_part(issued.access_token, 1),
        key=keyring.signing_key().private_key,
    )


def _hs256_with_public_key(c: Ctx) -> str:
    # The classic confusion: HMAC keyed with the verifier's public key bytes.
    public = c.key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    header = {**c.header, "alg": "HS256"}
    return forge(
        header, c.claims, None, sign=lambda m: hmac.new(public, m, hashlib.sha256).digest()
    )


def _other_key_same_kid(c: Ctx) -> str:
    return forge(c.header, c.claims, Ed25519PrivateKey.generate())


def _embedded_jwk(c: Ctx) -> str:
    attacker = Ed25519PrivateKey.generate()
    header = {**c.header, "jwk": public_jwk(attacker.public_key())}
    return forge(header, c.claims, attacker)


def _truncated_signature(c: Ctx) -> str:
    head, payload, signature = c.token.split(".")
    return f"{head}.{payload}.{b64url(_raw(signature)[:32])}"  # canonical, but 32 of 64 bytes


def _non_base64url(c: Ctx) -> str:
    head, payload, signature = c.token.split(".")
    return f"{head}.{payload[:-1]}+.{signature}"


def _padded(c: Ctx) -> str:
    head, payload, signature = c.token.split(".")
    return f"{head}==.{payload}.{signature}"


def _non_canonical_base64(c: Ctx) -> str:
    # Flip the unused low bits of the last signature character: same bytes, other spelling.
    head, payload, signature = c.token.split(".")
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    last = alphabet[alphabet.index(signature[-1]) | 0b11]
    return f"{head}.{payload}.{signature[:-1]}{last}"


def _duplicate_header_fields(c: Ctx) -> str:
    raw = b'{"alg":"EdDSA","alg":"none","typ":"at+jwt","kid":"' + c.header["kid"].encode() + b'"}'
    return forge(raw, c.claims, c.key)


def _duplicate_claims(c: Ctx) -> str:
    payload = _raw(c.token.split(".")[1])
    return forge(c.header, b'{"sub":"mallory",' + payload[1:], c.key)


def _raw(part: str) -> bytes:
    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))


def _assertion_as_access_token(c: Ctx) -> str:
    return assertions.make_assertion(
        SERVICE_KEYS["ci-bot"], subject_id="ci-bot", audience=ISSUER, now=NOW
    )


Build = Callable[[Ctx], str]

CASES = [
    pytest.param(
        lambda c: c.with_header(alg="none").rsplit(".", 1)[0] + ".",
        "token_alg_not_allowed",
        id="alg-none",
    ),
    pytest.param(_hs256_with_public_key, "token_alg_not_allowed", id="hs256-with-public-key"),
    pytest.param(lambda c: c.with_header(alg="ES256"), "token_alg_not_allowed", id="alg-es256"),
    pytest.param(lambda c: c.with_header(kid="A" * 43), "token_unknown_kid", id="unknown-kid"),
    pytest.param(
        lambda c: c.with_header(kid="../../etc/passwd"), "token_unknown_kid", id="kid-path"
    ),
    pytest.param(_embedded_jwk, "token_header_invalid", id="embedded-jwk"),
    pytest.param(
        lambda c: c.with_header(jku="https://evil.test/jwks"), "token_header_invalid", id="jku"
    ),
    pytest.param(
        lambda c: c.with_header(x5u="https://evil.test/cert"), "token_header_invalid", id="x5u"
    ),
    pytest.param(lambda c: c.with_header(x5c=["MIIB"]), "token_header_invalid", id="x5c"),
    pytest.param(lambda c: c.with_header(crit=["exp"], exp=0), "token_header_invalid", id="crit"),
    pytest.param(
        lambda c: c.with_header(cty="JWT"), "token_header_invalid", id="unknown-header-field"
    ),
    pytest.param(
        lambda c: forge({"alg": "EdDSA", "typ": "at+jwt"}, c.claims, c.key),
        "token_header_invalid",
        id="no-kid",
    ),
    pytest.param(
        lambda c: c.sign(exp=NOW - 100, iat=NOW - 700, nbf=NOW - 700), "token_expired", id="expired"
    ),
    pytest.param(
        lambda c: c.sign(nbf=NOW + 120, iat=NOW + 120, exp=NOW + 600),
        "token_not_yet_valid",
        id="nbf-in-future",
    ),
    pytest.param(
        lambda c: c.sign(aud="https://other.test"), "token_audience_mismatch", id="wrong-aud"
    ),
    pytest.param(lambda c: c.sign(aud=[]), "token_claims_invalid", id="empty-aud-list"),
    pytest.param(
        lambda c: c.sign(iss="https://evil.test"), "token_issuer_mismatch", id="wrong-iss"
    ),
    pytest.param(
        lambda c: c.sign(exp=NOW + 3600), "token_claims_invalid", id="lifetime-over-15-min"
    ),
    pytest.param(lambda c: c.sign(exp="never"), "token_claims_invalid", id="exp-not-a-number"),
    pytest.param(lambda c: c.sign(sid=None), "token_claims_invalid", id="no-session-id"),
    pytest.param(lambda c: c.sign(kind="admin"), "token_claims_invalid", id="unknown-kind"),
    pytest.param(lambda c: c.sign(roles=["admin"]), "token_claims_invalid", id="roles-claim"),
    pytest.param(lambda c: c.sign(groups=["ops"]), "token_claims_invalid", id="groups-claim"),
    pytest.param(_truncated_signature, "token_signature_invalid", id="truncated-signature"),
    pytest.param(_other_key_same_kid, "token_signature_invalid", id="signed-by-another-key"),
    pytest.param(
        lambda c: c.token[:-2] + ("AA" if c.token[-2:] != "AA" else "BA"),
        "token_signature_invalid",
        id="tampered-signature",
    ),
    pytest.param(_non_base64url, "token_malformed", id="non-base64url-chars"),
    pytest.param(_padded, "token_malformed", id="base64-padding"),
    pytest.param(_non_canonical_base64, "token_malformed", id="non-canonical-base64"),
    pytest.param(lambda c: c.token + ".x", "token_malformed", id="four-segments"),
    pytest.param(lambda c: ".".join(c.token.split(".")[:2]), "token_malformed", id="two-segments"),
    pytest.param(lambda c: "", "token_malformed", id="empty"),
    pytest.param(lambda c: "a" * 100_000, "token_too_large", id="100kb-token"),
    pytest.param(
        lambda c: c.token + "A" * MAX_TOKEN_BYTES, "token_too_large", id="oversized-signature"
    ),
    pytest.param(_duplicate_header_fields, "token_malformed", id="duplicate-header-fields"),
    pytest.param(_duplicate_claims, "token_malformed", id="duplicate-claims"),
    pytest.param(
        lambda c: forge(c.header, [c.claims], c.key), "token_malformed", id="payload-not-object"
    ),
    pytest.param(
        lambda c: forge(c.header, b"\xff\xfe", c.key), "token_malformed", id="payload-not-utf8"
    ),
    pytest.param(
        lambda c: forge(c.header, b'{"exp":NaN}', c.key), "token_malformed", id="payload-nan"
    ),
    pytest.param(
        lambda c: forge(["EdDSA"], c.claims, c.key), "token_malformed", id="header-not-object"
    ),
    pytest.param(_assertion_as_access_token, "token_type_mismatch", id="assertion-as-access-token"),
    pytest.param(lambda c: c.with_header(typ="JWT"), "token_type_mismatch", id="typ-jwt"),
    pytest.param(
        lambda c: forge({"alg": "EdDSA", "kid": c.header["kid"]}, c.claims, c.key),
        "token_type_mismatch",
        id="no-typ",
    ),
    pytest.param(lambda c: c.revoked_token, "session_revoked", id="revoked-session"),
    pytest.param(lambda c: c.sign(sid="no-such-session"), "session_inactive", id="unknown-session"),
    pytest.param(lambda c: c.sign(sub="dave"), "subject_disabled", id="disabled-subject"),
]


@pytest.mark.parametrize(("build", "code"), CASES)
async def test_malicious_and_malformed_tokens_are_rejected(
    auth: Authenticator, ctx: Ctx, build: Build, code: str
) -> None:
    token = build(ctx)
    with pytest.raises(InvalidToken) as caught:
        await auth.authenticate_bearer(token, NOW + 5)
    assert caught.value.code == code
    # The message is fixed per class: nothing from the token is echoed.
    assert str(caught.value) == type(caught.value).message


async def test_the_valid_token_passes(auth: Authenticator, ctx: Ctx) -> None:
    principal = await auth.authenticate_bearer(ctx.token, NOW + 5)
    assert (principal.subject_id, principal.kind) == ("alice", "human")


async def test_application_prefixed_typ_is_the_same_type(auth: Authenticator, ctx: Ctx) -> None:
    token = ctx.with_header(typ="application/AT+JWT")
    assert (await auth.authenticate_bearer(token, NOW + 5)).subject_id == "alice"


async def test_access_token_as_assertion_is_refused(auth: Authenticator, ctx: Ctx) -> None:
    with pytest.raises(InvalidToken) as caught:
        assertions.verify(
            ctx.token, audience=ISSUER, public_key_for=lambda s: ctx.key.public_key(), now=NOW
        )
    assert caught.value.code == "token_type_mismatch"


async def test_issued_tokens_carry_no_authorization_state(auth: Authenticator) -> None:
    human = await auth.login_password("alice", PASSWORDS["alice"], None, NOW)
    principal = await auth.authenticate_bearer(human.access_token, NOW)
    from service.authn import totp

    from .conftest import TOTP_SECRETS

    stepped = await auth.step_up(principal, totp.code_at(TOTP_SECRETS["alice"], NOW), NOW)
    service = await auth.login_assertion(
        assertions.make_assertion(
            SERVICE_KEYS["ci-bot"], subject_id="ci-bot", audience=ISSUER, now=NOW
        ),
        None,
        NOW,
    )
    for issued in (human, stepped, service):
        claims = decode_part(issued.access_token, 1)
        assert set(claims) <= ACCESS_CLAIMS
        assert not {"roles", "role", "groups", "group", "grants", "scope", "permissions"} & set(
            claims
        )
        assert decode_part(issued.access_token, 0)["typ"] == "at+jwt"
        assert claims["exp"] - claims["iat"] <= 900
        assert claims["aud"] == AUDIENCE and claims["iss"] == ISSUER
    assert decode_part(stepped.access_token, 1)["amr"] == ["pwd", "otp", "mfa"]


async def test_verified_tokens_are_cached_but_sessions_are_not(
    auth: Authenticator, ctx: Ctx
) -> None:
    before = auth.tokens.cache_len()
    first = await auth.authenticate_bearer(ctx.token, NOW + 5)
    assert auth.tokens.cache_len() == before + 1
    assert await auth.revoke(first, NOW + 6)
    with pytest.raises(InvalidToken) as caught:
        await auth.authenticate_bearer(ctx.token, NOW + 7)
    assert caught.value.code == "session_revoked"


async def test_cached_token_still_expires(auth: Authenticator, ctx: Ctx) -> None:
    await auth.authenticate_bearer(ctx.token, NOW + 5)
    exp = ctx.claims["exp"]
    with pytest.raises(InvalidToken) as caught:
        await auth.authenticate_bearer(ctx.token, exp + 31)
    assert caught.value.code == "token_expired"


async def test_cache_is_bounded(auth: Authenticator) -> None:
    auth.tokens.cache_size = 3
    for _ in range(5):
        issued = await auth.login_password("alice", PASSWORDS["alice"], None, NOW)
        await auth.authenticate_bearer(issued.access_token, NOW)
    assert auth.tokens.cache_len() == 3


async def test_rotation_keeps_old_tokens_verifiable(auth: Authenticator, keyring: KeyRing) -> None:
    old = await auth.login_password("alice", PASSWORDS["alice"], None, NOW)
    new_kid = keyring.rotate(NOW + 60)
    auth.tokens._cache.clear()  # verify the signature again, not a cached answer
    assert (await auth.authenticate_bearer(old.access_token, NOW + 60)).subject_id == "alice"
    new = await auth.login_password("alice", PASSWORDS["alice"], None, NOW + 60)
    assert decode_part(new.access_token, 0)["kid"] == new_kid
    assert decode_part(old.access_token, 0)["kid"] != new_kid
    assert {k["kid"] for k in auth.jwks(NOW + 60)["keys"]} == {
        new_kid,
        decode_part(old.access_token, 0)["kid"],
    }


def test_b64url_helper_is_unpadded() -> None:
    assert "=" not in b64url(b"\x00")
