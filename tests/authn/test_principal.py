"""The principal's policy-input shape (DESIGN §4) and the anonymous sentinel."""

from __future__ import annotations

import dataclasses

import pytest

from service.authn.principal import ANONYMOUS, Principal

ALICE = Principal("alice", "human", "sid-1", auth_time=1000.0, authn_method="password")


def test_to_input_has_exactly_the_documented_keys() -> None:
    doc = ALICE.to_input(now=1100.0, step_up_window_s=300)
    assert doc == {
        "subject_id": "alice",
        "kind": "human",
        "session_id": "sid-1",
        "auth_time": 1000.0,
        "authn_method": "password",
        "step_up": {"verified": False, "at": None, "age_s": None},
    }


@pytest.mark.parametrize(
    ("age", "verified"),
    [
        pytest.param(0, True, id="just-now"),
        pytest.param(300, True, id="edge-of-window"),
        pytest.param(301, False, id="stale"),
    ],
)
def test_step_up_verified_only_within_window(age: float, verified: bool) -> None:
    stepped = dataclasses.replace(ALICE, step_up_at=2000.0)
    doc = stepped.to_input(now=2000.0 + age, step_up_window_s=300)
    assert doc["step_up"] == {"verified": verified, "at": 2000.0, "age_s": age}


def test_principal_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        ALICE.subject_id = "mallory"  # type: ignore[misc]


def test_anonymous_is_not_authenticated() -> None:
    assert ALICE.is_authenticated
    assert not ANONYMOUS.is_authenticated
    assert ANONYMOUS.to_input(0, 300)["step_up"]["verified"] is False
