"""scrypt password hashes: format, verification, bounds, and the dummy hash."""

from __future__ import annotations

import pytest

from service.authn import passwords

from .conftest import CHEAP


def test_hash_round_trip_and_format() -> None:
    encoded = passwords.hash_password("s3cret", CHEAP)
    assert encoded.startswith("scrypt$ln=4,r=8,p=1$")
    assert passwords.verify_password("s3cret", encoded)
    assert not passwords.verify_password("s3cret ", encoded)
    assert not passwords.verify_password("", encoded)


def test_each_hash_has_its_own_salt() -> None:
    assert passwords.hash_password("same", CHEAP) != passwords.hash_password("same", CHEAP)


def test_default_cost_is_documented() -> None:
    assert (passwords.DEFAULT_PARAMS.ln, passwords.DEFAULT_PARAMS.r) == (15, 8)


@pytest.mark.parametrize(
    "encoded",
    [
        pytest.param("plain", id="not-a-hash"),
        pytest.param("scrypt$ln=4,r=8,p=1$c2FsdA$aGFzaA", id="short-salt-and-hash"),
        pytest.param("scrypt$ln=30,r=8,p=1$" + "A" * 22 + "$" + "A" * 43, id="ln-too-high"),
        pytest.param("scrypt$ln=16,r=32,p=1$" + "A" * 22 + "$" + "A" * 43, id="memory-too-high"),
        pytest.param("bcrypt$ln=4,r=8,p=1$" + "A" * 22 + "$" + "A" * 43, id="other-scheme"),
    ],
)
def test_malformed_or_abusive_hashes_are_refused(encoded: str) -> None:
    with pytest.raises(passwords.InvalidHash):
        passwords.verify_password("x", encoded)


def test_over_long_password_is_false_not_an_error() -> None:
    encoded = passwords.hash_password("short", CHEAP)
    assert not passwords.verify_password("x" * (passwords.MAX_PASSWORD_BYTES + 1), encoded)
    with pytest.raises(ValueError):
        passwords.hash_password("x" * (passwords.MAX_PASSWORD_BYTES + 1), CHEAP)


def test_dummy_hash_has_the_cost_of_the_real_ones() -> None:
    real = passwords.hash_password("pw", CHEAP)
    dummy = passwords.dummy_hash(real)
    assert passwords.parse_hash(dummy).params == passwords.parse_hash(real).params
    assert not passwords.verify_password("pw", dummy)
