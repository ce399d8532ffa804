"""The authenticator against the real SQLite store: logins, throttling, bearer checks, step-up."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from service.authn import assertions, passwords, totp
from service.authn.errors import (
    AuthnError,
    InvalidCredentials,
    InvalidToken,
    OtpInvalid,
    StepUpUnavailable,
    Throttled,
)
from service.authn.sessions import Authenticator, create_authenticator
from service.config import AuthnConfig, load
from service.store import Store

from .conftest import ISSUER, NOW, PASSWORDS, SERVICE_KEYS, TOTP_SECRETS, Peer, decode_part

REPO = Path(__file__).resolve().parents[2]


def assertion_for(subject: str, now: float = NOW, **kwargs: Any) -> str:
    return assertions.make_assertion(
        kwargs.pop("key", SERVICE_KEYS.get(subject) or Ed25519PrivateKey.generate()),
        subject_id=subject,
        audience=kwargs.pop("audience", ISSUER),
        now=now,
        **kwargs,
    )


# -- password login ------------------------------------------------------------------------------


async def test_password_login_opens_a_session(auth: Authenticator, store: Store) -> None:
    access_token, expires_in, session_id, refresh_token = await auth.login_password(
        "alice", PASSWORDS["alice"], "10.0.0.1", NOW
    )
    assert expires_in == 600 and refresh_token
    session = await store.get_session(session_id)
    assert session is not None
    assert (session.subject_id, session.kind, session.authn_method) == (
        "alice",
        "human",
        "password",
    )
    principal = await auth.authenticate_bearer(access_token, NOW + 1)
    assert principal.to_input(NOW + 1, 300) == {
        "subject_id": "alice",
        "kind": "human",
        "session_id": session_id,
        "auth_time": NOW,
        "authn_method": "password",
        "step_up": {"verified": False, "at": None, "age_s": None},
    }


@pytest.mark.parametrize(
    ("subject", "password"),
    [
        pytest.param("nobody", "whatever", id="unknown-subject"),
        pytest.param("alice", "wrong-password", id="wrong-password"),
        pytest.param("dave", PASSWORDS["dave"], id="disabled-with-right-password"),
        pytest.param("ci-bot", "anything", id="service-has-no-password"),
        pytest.param("alice", "", id="empty-password"),
        pytest.param("x" * 10_000, "pw", id="huge-subject"),
    ],
)
async def test_every_login_failure_looks_the_same(
    auth: Authenticator, subject: str, password: str
) -> None:
    with pytest.raises(AuthnError) as caught:
        await auth.login_password(subject, password, "10.0.0.1", NOW)
    assert type(caught.value) is InvalidCredentials
    assert caught.value.code == "invalid_credentials"
    assert str(caught.value) == "invalid credentials"


async def test_unknown_subjects_cost_a_real_hash(
    auth: Authenticator, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[str] = []
    real = passwords.verify_password

    def spy(password: str, encoded: str) -> bool:
        seen.append(encoded)
        return real(password, encoded)

    monkeypatch.setattr(passwords, "verify_password", spy)
    for subject in ("nobody", "dave", "alice"):
        with pytest.raises(InvalidCredentials):
            await auth.login_password(subject, "wrong", None, NOW)
    dummy = auth.identities.dummy_password_hash
    alice = auth.identities.get("alice")
    assert alice is not None
    assert seen == [dummy, dummy, alice.password_hash]
    assert passwords.parse_hash(dummy).params == passwords.parse_hash(seen[2]).params


async def test_throttling_per_subject_and_source(auth: Authenticator) -> None:
    for _ in range(3):
        with pytest.raises(InvalidCredentials):
            await auth.login_password("alice", "wrong", "10.0.0.1", NOW)
    # That source waits now, even with the right password ...
    with pytest.raises(Throttled) as caught:
        await auth.login_password("alice", PASSWORDS["alice"], "10.0.0.1", NOW + 10)
    assert caught.value.code == "throttled"
    assert caught.value.retry_after_s == 590
    # ... alice from another address does not (tests/authn/test_throttling.py has the rest).
    await auth.login_password("alice", PASSWORDS["alice"], "10.9.9.9", NOW + 10)
    # Unknown subjects are throttled the same way (no enumeration through 429s).
    for _ in range(3):
        with pytest.raises(InvalidCredentials):
            await auth.login_password("nobody", "wrong", "10.1.0.1", NOW)
    with pytest.raises(Throttled):
        await auth.login_password("nobody", "wrong", "10.1.0.1", NOW + 10)
    # Other subjects are unaffected; the window passes.
    await auth.login_password("bob", PASSWORDS["bob"], "10.0.0.1", NOW + 10)
    await auth.login_password("alice", PASSWORDS["alice"], "10.0.0.1", NOW + 601)


async def test_throttling_per_address(auth: Authenticator) -> None:
    for i in range(10):
        with pytest.raises(InvalidCredentials):
            await auth.login_password(f"user{i}", "wrong", "192.0.2.7", NOW)
    with pytest.raises(Throttled):
        await auth.login_password("alice", PASSWORDS["alice"], "192.0.2.7", NOW + 1)
    with pytest.raises(Throttled):
        await auth.login_assertion(assertion_for("ci-bot"), "192.0.2.7", NOW + 1)
    await auth.login_password("alice", PASSWORDS["alice"], "192.0.2.8", NOW + 1)


async def test_success_resets_the_subject_counter(auth: Authenticator) -> None:
    for _ in range(2):
        with pytest.raises(InvalidCredentials):
            await auth.login_password("alice", "wrong", None, NOW)
    await auth.login_password("alice", PASSWORDS["alice"], None, NOW)
    for _ in range(2):
        with pytest.raises(InvalidCredentials):
            await auth.login_password("alice", "wrong", None, NOW)
    await auth.login_password("alice", PASSWORDS["alice"], None, NOW)


# -- assertion login ------------------------------------------------------------------------------


@pytest.mark.parametrize(("subject", "kind"), [("ci-bot", "service"), ("agent-7", "agent")])
async def test_assertion_login(auth: Authenticator, subject: str, kind: str) -> None:
    issued = await auth.login_assertion(assertion_for(subject), "10.0.0.1", NOW)
    principal = await auth.authenticate_bearer(issued.access_token, NOW)
    assert (principal.subject_id, principal.kind, principal.authn_method) == (
        subject,
        kind,
        "private_key_jwt",
    )


async def test_assertion_replay_is_refused_across_instances(
    auth: Authenticator, peer: Peer
) -> None:
    assertion = assertion_for("ci-bot")
    await auth.login_assertion(assertion, None, NOW)
    with pytest.raises(InvalidCredentials) as caught:
        await peer.auth.login_assertion(assertion, None, NOW + 1)
    assert caught.value.reason == "token_replayed"


@pytest.mark.parametrize(
    ("build", "reason"),
    [
        pytest.param(lambda: assertion_for("old-bot"), "token_unknown_kid", id="disabled-service"),
        pytest.param(lambda: assertion_for("nobody"), "token_unknown_kid", id="unknown-subject"),
        pytest.param(lambda: assertion_for("alice"), "token_unknown_kid", id="human-subject"),
        pytest.param(
            lambda: assertion_for("ci-bot", key=SERVICE_KEYS["agent-7"]),
            "token_unknown_kid",
            id="kid-of-another-key",
        ),
        pytest.param(
            lambda: assertion_for("ci-bot", audience="https://other.test"),
            "token_audience_mismatch",
            id="wrong-audience",
        ),
        pytest.param(
            lambda: assertion_for("ci-bot", ttl_s=600), "token_claims_invalid", id="ttl-10-min"
        ),
        pytest.param(lambda: assertion_for("ci-bot", now=NOW - 400), "token_expired", id="expired"),
        pytest.param(
            lambda: assertion_for("ci-bot", now=NOW + 120),
            "token_not_yet_valid",
            id="issued-in-future",
        ),
    ],
)
async def test_bad_assertions_are_invalid_credentials(
    auth: Authenticator, build: Any, reason: str
) -> None:
    with pytest.raises(InvalidCredentials) as caught:
        await auth.login_assertion(build(), None, NOW)
    assert caught.value.code == "invalid_credentials"
    assert str(caught.value) == "invalid credentials"
    assert caught.value.reason == reason


async def test_access_token_as_assertion_is_refused(auth: Authenticator) -> None:
    issued = await auth.login_assertion(assertion_for("ci-bot"), None, NOW)
    with pytest.raises(InvalidCredentials) as caught:
        await auth.login_assertion(issued.access_token, None, NOW)
    assert caught.value.reason == "token_type_mismatch"


async def test_service_session_lives_as_long_as_its_token(
    auth: Authenticator, store: Store
) -> None:
    issued = await auth.login_assertion(assertion_for("ci-bot"), None, NOW)
    session = await store.get_session(issued.session_id)
    assert session is not None and session.expires_at == NOW + 600


# -- bearer tokens and sessions -------------------------------------------------------------------


async def test_revocation_is_seen_by_another_instance_at_once(
    auth: Authenticator, peer: Peer
) -> None:
    issued = await auth.login_password("alice", PASSWORDS["alice"], None, NOW)
    # Both instances have verified (and cached) the token.
    principal = await peer.auth.authenticate_bearer(issued.access_token, NOW + 1)
    await auth.authenticate_bearer(issued.access_token, NOW + 1)
    assert await peer.auth.revoke(principal, NOW + 2)
    assert not await peer.auth.revoke(principal, NOW + 3)
    for instance in (auth, peer.auth):
        with pytest.raises(InvalidToken) as caught:
            await instance.authenticate_bearer(issued.access_token, NOW + 3)
        assert caught.value.code == "session_revoked"


async def test_token_never_outlives_its_session(
    store: Store, directory: Any, keyring: Any, settings: AuthnConfig
) -> None:
    short = Authenticator(
        store, directory, keyring, dataclasses.replace(settings, session_ttl_s=120)
    )
    issued = await short.login_password("alice", PASSWORDS["alice"], None, NOW)
    assert issued.expires_in == 120
    assert decode_part(issued.access_token, 1)["exp"] == NOW + 120


async def test_refresh_keeps_the_session(auth: Authenticator) -> None:
    issued = await auth.login_password("alice", PASSWORDS["alice"], None, NOW)
    principal = await auth.authenticate_bearer(issued.access_token, NOW)
    renewed = await auth.refresh(principal, NOW + 500)
    assert renewed.session_id == issued.session_id
    assert (await auth.authenticate_bearer(renewed.access_token, NOW + 900)).subject_id == "alice"
    await auth.revoke(principal, NOW + 901)
    with pytest.raises(InvalidToken):
        await auth.refresh(principal, NOW + 902)


# -- step-up --------------------------------------------------------------------------------------


async def _alice(auth: Authenticator) -> Any:
    issued = await auth.login_password("alice", PASSWORDS["alice"], None, NOW)
    return issued, await auth.authenticate_bearer(issued.access_token, NOW)


async def test_step_up_with_a_valid_code(auth: Authenticator, store: Store) -> None:
    issued, principal = await _alice(auth)
    code = totp.code_at(TOTP_SECRETS["alice"], NOW + 10)
    stepped = await auth.step_up(principal, code, NOW + 10)
    assert stepped.session_id == issued.session_id
    claims = decode_part(stepped.access_token, 1)
    assert claims["acr"] == "urn:controlplane:acr:mfa" and claims["amr"] == ["pwd", "otp", "mfa"]
    fresh = await auth.authenticate_bearer(stepped.access_token, NOW + 20)
    assert fresh.to_input(NOW + 20, 300)["step_up"] == {
        "verified": True,
        "at": NOW + 10,
        "age_s": 10,
    }
    assert fresh.to_input(NOW + 311, 300)["step_up"]["verified"] is False
    # The pre-step-up token of the same session stays un-stepped.
    old = await auth.authenticate_bearer(issued.access_token, NOW + 20)
    assert old.step_up_at is None
    session = await store.get_session(issued.session_id)
    assert session is not None and session.step_up_method == "totp"


def wrong_codes(n: int, now: float = NOW) -> list[str]:
    """Codes that alice's secret does not accept at ``now`` (any step within tolerance)."""
    candidates = (f"{i:06d}" for i in range(0, 1_000_000, 111_111))
    return [c for c in candidates if totp.verify(TOTP_SECRETS["alice"], c, now) is None][:n]


async def test_wrong_code_is_refused(auth: Authenticator) -> None:
    _, principal = await _alice(auth)
    with pytest.raises(OtpInvalid) as caught:
        await auth.step_up(principal, wrong_codes(1)[0], NOW)
    assert caught.value.code == "otp_invalid"


async def test_replayed_code_is_refused_even_by_another_instance(
    auth: Authenticator, peer: Peer
) -> None:
    _, principal = await _alice(auth)
    code = totp.code_at(TOTP_SECRETS["alice"], NOW)
    await auth.step_up(principal, code, NOW)
    for instance, at in ((auth, NOW + 1), (peer.auth, NOW + 29)):
        with pytest.raises(OtpInvalid) as caught:
            await instance.step_up(principal, code, at)
        assert caught.value.code == "otp_invalid"


async def test_otp_guessing_is_throttled(auth: Authenticator) -> None:
    _, principal = await _alice(auth)
    right = totp.code_at(TOTP_SECRETS["alice"], NOW)
    for code in wrong_codes(3):
        with pytest.raises(OtpInvalid):
            await auth.step_up(principal, code, NOW)
    with pytest.raises(Throttled):
        await auth.step_up(principal, right, NOW)


async def test_services_and_agents_cannot_step_up(auth: Authenticator) -> None:
    for subject in ("ci-bot", "agent-7"):
        issued = await auth.login_assertion(assertion_for(subject), None, NOW)
        principal = await auth.authenticate_bearer(issued.access_token, NOW)
        with pytest.raises(StepUpUnavailable) as caught:
            await auth.step_up(principal, "123456", NOW)
        assert caught.value.code == "step_up_not_available"


async def test_step_up_on_a_revoked_session_fails(auth: Authenticator) -> None:
    _, principal = await _alice(auth)
    await auth.revoke(principal, NOW + 1)
    with pytest.raises(InvalidToken) as caught:
        await auth.step_up(principal, totp.code_at(TOTP_SECRETS["alice"], NOW + 2), NOW + 2)
    assert caught.value.code == "session_revoked"


# -- status ---------------------------------------------------------------------------------------


async def test_status_reveals_no_tokens_or_sessions(auth: Authenticator) -> None:
    issued = await auth.login_password("alice", PASSWORDS["alice"], None, NOW)
    status = auth.status(NOW)
    assert status["issuer"] == ISSUER
    assert status["signing_keys"] == [
        {"kid": auth.keys.signing_key().kid, "alg": "EdDSA", "active": True}
    ]
    assert status["identities"] == {"human": 2, "service": 1, "agent": 1, "disabled": 2}
    assert (status["token_ttl_s"], status["step_up_window_s"]) == (600, 300)
    text = json.dumps(status)
    for secret in (
        issued.access_token,
        issued.session_id,
        PASSWORDS["alice"],
        TOTP_SECRETS["alice"],
    ):
        assert secret not in text
    assert "PRIVATE" not in text and "scrypt" not in text


# -- wiring and the dev example -------------------------------------------------------------------


async def test_dev_example_end_to_end(store: Store, tmp_path: Path) -> None:
    settings = load(None, {}, base_dir=REPO, overrides={"authn": {
        "issuer": ISSUER, "audience": "aud", "token_ttl_s": 300, "step_up_window_s": 120,
        "clock_skew_s": 10, "session_ttl_s": 3600, "max_failures": 5, "failure_window_s": 900,
    }}).authn
    assert (settings.token_ttl_s, settings.clock_skew_s) == (300, 10)
    auth = create_authenticator(
        store,
        identities_path=REPO / "examples" / "identities.yaml",
        keys_dir=tmp_path / "state" / "keys",
        settings=settings,
        now=NOW,
    )
    human = await auth.login_password("alice", "alice-dev-password", "127.0.0.1", NOW)
    assert (await auth.authenticate_bearer(human.access_token, NOW)).kind == "human"
    key = serialization.load_pem_private_key(
        (REPO / "examples" / "keys" / "ci-bot.pem").read_bytes(), None
    )
    assert isinstance(key, Ed25519PrivateKey)
    bot = await auth.login_assertion(
        assertions.make_assertion(key, subject_id="ci-bot", audience=ISSUER, now=NOW), None, NOW
    )
    assert (await auth.authenticate_bearer(bot.access_token, NOW)).kind == "service"


@pytest.mark.parametrize(
    ("subject", "password", "reason"),
    [
        ("nobody", "x", "unknown_subject"),
        ("dave", PASSWORDS["dave"], "subject_disabled"),
        ("ci-bot", "x", "not_a_human"),
        ("alice", "x", "bad_password"),
    ],
)
async def test_failure_reason_is_kept_for_audit_only(
    auth: Authenticator, subject: str, password: str, reason: str
) -> None:
    with pytest.raises(InvalidCredentials) as caught:
        await auth.login_password(subject, password, None, NOW)
    assert caught.value.reason == reason
    assert reason not in str(caught.value)
