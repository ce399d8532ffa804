"""Login, OTP and assertion throttling against the real SQLite store, from two instances at once.

Each test counts how many attempts were *evaluated* (the password hash or the TOTP code was
checked) by wrapping the verifier, never the store: the failure budget is reserved in the store
before verifying, so parallel guesses cannot all slip past a check-then-act counter.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable
from typing import Any

import pytest

from service.authn import passwords, sessions, totp
from service.authn.errors import InvalidCredentials, OtpInvalid, Throttled
from service.authn.sessions import Authenticator
from service.config import AuthnConfig, ConfigError
from service.store import Store

from .conftest import NOW, PASSWORDS, TOTP_SECRETS, Peer
from .test_sessions import assertion_for

LOGGER = "controlplane.authn"


@pytest.fixture
def evaluated(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts password hashes and TOTP codes actually verified."""
    counts = {"password": 0, "otp": 0}
    real_password: Callable[..., bool] = passwords.verify_password
    real_totp: Callable[..., Any] = totp.verify

    def password(*args: Any) -> bool:
        counts["password"] += 1
        return real_password(*args)

    def code(*args: Any) -> Any:
        counts["otp"] += 1
        return real_totp(*args)

    monkeypatch.setattr(passwords, "verify_password", password)
    monkeypatch.setattr(totp, "verify", code)
    return counts


def events(caplog: pytest.LogCaptureFixture, event: str) -> list[dict[str, Any]]:
    return [
        r.fields  # type: ignore[attr-defined]
        for r in caplog.records
        if r.name == LOGGER and getattr(r, "fields", {}).get("event") == event
    ]


def wrong_codes(n: int, now: float = NOW) -> list[str]:
    candidates = (f"{i:06d}" for i in range(0, 1_000_000, 7919))
    return [c for c in candidates if totp.verify(TOTP_SECRETS["alice"], c, now) is None][:n]


async def gather_errors(*calls: Any) -> list[str]:
    results = await asyncio.gather(*calls, return_exceptions=True)
    return [type(r).__name__ for r in results]


# -- item 4: the failure budget is atomic ------------------------------------------------------


async def test_parallel_wrong_passwords_from_two_instances_evaluate_at_most_the_budget(
    auth: Authenticator, peer: Peer, evaluated: dict[str, int], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, LOGGER)
    calls = [
        (auth if i % 2 else peer.auth).login_password("alice", f"guess-{i}", "198.51.100.7", NOW)
        for i in range(40)
    ]
    outcomes = await gather_errors(*calls)
    assert outcomes.count("InvalidCredentials") == 3  # max_failures
    assert outcomes.count("Throttled") == 37
    assert evaluated["password"] == 3
    assert len(events(caplog, "authn.login_failed")) == 3
    assert len(events(caplog, "authn.throttled")) == 37


async def test_parallel_wrong_codes_from_two_instances_evaluate_at_most_the_budget(
    auth: Authenticator, peer: Peer, evaluated: dict[str, int], caplog: pytest.LogCaptureFixture
) -> None:
    issued = await auth.login_password("alice", PASSWORDS["alice"], None, NOW)
    principal = await auth.authenticate_bearer(issued.access_token, NOW)
    caplog.set_level(logging.INFO, LOGGER)
    codes = wrong_codes(60)
    evaluated["otp"] = 0  # finding wrong codes verified some
    outcomes = await gather_errors(*(
        (auth if i % 2 else peer.auth).step_up(principal, code, NOW, "198.51.100.7")
        for i, code in enumerate(codes)
    ))
    assert outcomes.count("OtpInvalid") == 3
    assert outcomes.count("Throttled") == 57
    assert evaluated["otp"] == 3
    assert len(events(caplog, "authn.otp_failed")) == 3
    assert len(events(caplog, "authn.throttled")) == 57
    # The budget holds for the right code too, until the window has passed.
    with pytest.raises(Throttled):
        await auth.step_up(principal, totp.code_at(TOTP_SECRETS["alice"], NOW), NOW)
    later = NOW + 601
    fresh = await auth.login_password("alice", PASSWORDS["alice"], None, later)
    principal = await auth.authenticate_bearer(fresh.access_token, later)
    await auth.step_up(principal, totp.code_at(TOTP_SECRETS["alice"], later), later)


async def test_parallel_bad_assertions_evaluate_at_most_the_address_budget(
    auth: Authenticator, peer: Peer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, LOGGER)
    bad = assertion_for("ci-bot").rsplit(".", 1)[0] + ".AAAA"  # a broken signature
    outcomes = await gather_errors(*(
        (auth if i % 2 else peer.auth).login_assertion(bad, "198.51.100.9", NOW)
        for i in range(30)
    ))
    assert outcomes.count("InvalidCredentials") == 10  # max_failures_per_addr
    assert outcomes.count("Throttled") == 20
    assert len(events(caplog, "authn.login_failed")) == 10
    # A good assertion from that address waits too; from another address it passes.
    with pytest.raises(Throttled):
        await auth.login_assertion(assertion_for("ci-bot"), "198.51.100.9", NOW + 1)
    await auth.login_assertion(assertion_for("ci-bot"), "198.51.100.10", NOW + 1)


async def test_success_releases_its_reservation_on_the_address(auth: Authenticator) -> None:
    # Ten good logins from one address never add up to the address budget (10).
    for i in range(12):
        await auth.login_password("alice", PASSWORDS["alice"], "192.0.2.1", NOW + i)
        await auth.login_assertion(assertion_for("ci-bot", now=NOW + i), "192.0.2.1", NOW + i)
    # ... while failures do, and a valid login does not launder them (other subjects' budget).
    for i in range(9):
        with pytest.raises(InvalidCredentials):
            await auth.login_password(f"user{i}", "wrong", "192.0.2.1", NOW + 20)
    await auth.login_password("alice", PASSWORDS["alice"], "192.0.2.1", NOW + 21)
    with pytest.raises(InvalidCredentials):
        await auth.login_password("user9", "wrong", "192.0.2.1", NOW + 22)
    with pytest.raises(Throttled):
        await auth.login_password("alice", PASSWORDS["alice"], "192.0.2.1", NOW + 23)


# -- item 5: nobody can lock another person out ----------------------------------------------


async def test_a_stranger_cannot_lock_the_user_out(
    auth: Authenticator, peer: Peer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, LOGGER)
    outcomes = await gather_errors(*(
        peer.auth.login_password("alice", "guess", "203.0.113.66", NOW) for _ in range(20)
    ))
    assert outcomes.count("InvalidCredentials") == 3
    # The attacker's address is locked out for alice, for the whole window ...
    with pytest.raises(Throttled) as caught:
        await auth.login_password("alice", PASSWORDS["alice"], "203.0.113.66", NOW + 1)
    assert 590 <= caught.value.retry_after_s <= 600
    # ... and alice, from her own address, gets in at once (and again the attacker cannot).
    await auth.login_password("alice", PASSWORDS["alice"], "192.0.2.44", NOW + 1)
    with pytest.raises(Throttled):
        await auth.login_password("alice", "guess", "203.0.113.66", NOW + 2)
    throttled = events(caplog, "authn.throttled")
    assert throttled[-1]["reason"] == "source_locked"
    assert throttled[-1]["subject"] == "alice" and throttled[-1]["client_addr"] == "203.0.113.66"


@pytest.fixture
def slow(settings: AuthnConfig) -> AuthnConfig:
    return dataclasses.replace(
        settings, subject_delay_after=4, subject_delay_base_s=2, subject_delay_max_s=8
    )


async def test_many_sources_slow_a_subject_down_but_never_lock_it(
    store: Store, auth: Authenticator, slow: AuthnConfig, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, LOGGER)
    a = Authenticator(store, auth.identities, auth.keys, slow)
    # Four failures from four addresses: no address is locked, the subject now spaces attempts.
    for i in range(4):
        with pytest.raises(InvalidCredentials):
            await a.login_password("alice", "guess", f"203.0.113.{i}", NOW + i)
    # The 4th failure (at NOW+3) asks for 2 s before the next attempt, from any address.
    with pytest.raises(Throttled) as caught:
        await a.login_password("alice", PASSWORDS["alice"], "192.0.2.44", NOW + 4)
    assert caught.value.retry_after_s == 1
    assert events(caplog, "authn.throttled")[-1]["reason"] == "subject_delayed"
    # Each further failure doubles the spacing, up to the bound (8 s).
    t = NOW + 5.0
    gaps = []
    for i in range(4):
        with pytest.raises(InvalidCredentials):
            await a.login_password("alice", "guess", f"203.0.113.{10 + i}", t)
        with pytest.raises(Throttled) as caught:
            await a.login_password("alice", "guess", f"203.0.113.{20 + i}", t + 0.5)
        gaps.append(caught.value.retry_after_s)
        t += {0: 4, 1: 8, 2: 8, 3: 8}[i]
    assert gaps == [4, 8, 8, 8]
    # The real user from a fresh address is delayed at most the bound, then gets in and the
    # subject's counter starts again.
    await a.login_password("alice", PASSWORDS["alice"], "192.0.2.44", t)
    for i in range(3):
        with pytest.raises(InvalidCredentials):
            await a.login_password("alice", "guess", f"203.0.113.{40 + i}", t)


async def test_unknown_subjects_are_throttled_alike(auth: Authenticator) -> None:
    for subject in ("alice", "nobody"):
        for _ in range(3):
            with pytest.raises(InvalidCredentials):
                await auth.login_password(subject, "wrong", "10.1.0.1", NOW)
        with pytest.raises(Throttled) as caught:
            await auth.login_password(subject, "wrong", "10.1.0.1", NOW)
        assert caught.value.retry_after_s == 600


def test_delay_settings_are_checked(settings: AuthnConfig) -> None:
    with pytest.raises(ConfigError):
        dataclasses.replace(settings, subject_delay_max_s=settings.failure_window_s + 1)
    with pytest.raises(ConfigError):
        dataclasses.replace(settings, subject_delay_base_s=10, subject_delay_max_s=5)


# -- item 9: one structured event per failure, never the secret ---------------------------------


async def test_failures_leave_one_structured_event_each_without_secrets(
    auth: Authenticator, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, LOGGER)
    with pytest.raises(InvalidCredentials):
        await auth.login_password("alice", "hunter2-secret", "192.0.2.5", NOW)
    with pytest.raises(InvalidCredentials):
        await auth.login_password("nobody", "hunter2-secret", "192.0.2.5", NOW)
    issued = await auth.login_password("alice", PASSWORDS["alice"], "192.0.2.5", NOW)
    principal = await auth.authenticate_bearer(issued.access_token, NOW)
    with pytest.raises(OtpInvalid):
        await auth.step_up(principal, wrong_codes(1)[0], NOW, "192.0.2.5")
    code = totp.code_at(TOTP_SECRETS["alice"], NOW)
    await auth.step_up(principal, code, NOW, "192.0.2.5")
    with pytest.raises(OtpInvalid):
        await auth.step_up(principal, code, NOW + 1, "192.0.2.5")
    once = assertion_for("ci-bot")
    await auth.login_assertion(once, "192.0.2.6", NOW)
    with pytest.raises(InvalidCredentials):
        await auth.login_assertion(once, "192.0.2.6", NOW + 1)

    failed = events(caplog, "authn.login_failed")
    assert [(e["subject"], e["client_addr"], e["reason"], e["method"]) for e in failed] == [
        ("alice", "192.0.2.5", "bad_password", "password"),
        ("nobody", "192.0.2.5", "unknown_subject", "password"),
        ("ci-bot", "192.0.2.6", "token_replayed", "private_key_jwt"),
    ]
    otp = events(caplog, "authn.otp_failed")
    assert [(e["subject"], e["client_addr"], e["reason"]) for e in otp] == [
        ("alice", "192.0.2.5", "otp_wrong"),
        ("alice", "192.0.2.5", "otp_replayed"),
    ]
    text = caplog.text + " ".join(str(r.__dict__) for r in caplog.records)
    for secret in ("hunter2-secret", PASSWORDS["alice"], code, once):
        assert secret not in text
    assert sessions.__doc__ is not None and "progressive" in sessions.__doc__
