"""TOTP (RFC 6238): test vector, ±1 step tolerance, matched step, malformed input."""

from __future__ import annotations

import base64

import pytest

from service.authn import totp

# RFC 6238 Appendix B: SHA-1 secret "12345678901234567890"; at T=59 the 8-digit code is 94287082.
RFC_SECRET = base64.b32encode(b"12345678901234567890").decode()


def test_rfc6238_vector_six_digits() -> None:
    assert totp.code_at(RFC_SECRET, 59) == "287082"
    assert totp.verify(RFC_SECRET, "287082", 59) == 1


@pytest.mark.parametrize(
    ("offset_steps", "accepted"),
    [
        pytest.param(-2, False, id="two-steps-old"),
        pytest.param(-1, True, id="one-step-old"),
        pytest.param(0, True, id="current"),
        pytest.param(1, True, id="one-step-ahead"),
        pytest.param(2, False, id="two-steps-ahead"),
    ],
)
def test_tolerance_is_one_step(offset_steps: int, accepted: bool) -> None:
    now = 1_700_000_015.0
    secret = totp.generate_secret()
    code_time = now + offset_steps * totp.STEP_S
    code = totp.code_at(secret, code_time)
    step = totp.verify(secret, code, now)
    if accepted:
        assert step == int(code_time) // totp.STEP_S
    else:
        assert step is None


FULLWIDTH = "\uff11\uff12\uff13\uff14\uff15\uff16"


@pytest.mark.parametrize("code", ["", "12345", "1234567", "12 456", "abcdef", FULLWIDTH])
def test_malformed_codes_are_refused(code: str) -> None:
    assert totp.verify(totp.generate_secret(), code, 1_700_000_000) is None


def test_secrets_must_be_base32_and_long_enough() -> None:
    assert len(totp.decode_secret(totp.generate_secret())) == 20
    with pytest.raises(totp.InvalidSecret):
        totp.decode_secret("NOT*BASE32")
    with pytest.raises(totp.InvalidSecret):
        totp.decode_secret(base64.b32encode(b"short").decode())


def test_provisioning_uri() -> None:
    uri = totp.provisioning_uri(RFC_SECRET, "alice", "controlplane")
    assert uri.startswith("otpauth://totp/controlplane:alice?")
    assert f"secret={RFC_SECRET}" in uri
