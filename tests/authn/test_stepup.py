"""Step-up (RFC 9470): the challenge header and the freshness rule."""

from __future__ import annotations

import pytest

from service.authn import stepup
from service.authn.errors import StepUpRequired
from service.authn.principal import ANONYMOUS, Principal


def human(step_up_at: float | None) -> Principal:
    return Principal("alice", "human", "s", 0.0, "password", step_up_at)


def test_challenge_follows_rfc9470() -> None:
    value = stepup.challenge('needs "fresh" auth', max_age=300)
    assert value == (
        'Bearer error="insufficient_user_authentication", '
        'error_description="needs \\"fresh\\" auth", '
        f'acr_values="{stepup.ACR_STEP_UP}", max_age=300'
    )


def test_challenge_strips_non_printable() -> None:
    assert "\r\n" not in stepup.challenge("a\r\nSet-Cookie: x")


def test_require_fresh() -> None:
    stepup.require_fresh(human(1000.0), now=1100.0, window_s=300)
    with pytest.raises(StepUpRequired) as caught:
        stepup.require_fresh(human(1000.0), now=1400.0, window_s=300)
    assert caught.value.code == "insufficient_user_authentication"
    assert "max_age=300" in caught.value.challenge
    with pytest.raises(StepUpRequired):
        stepup.require_fresh(human(None), now=1400.0, window_s=300)


def key_login(kind: str, method: str, auth_time: float) -> Principal:
    return Principal(f"{kind}-1", kind, "s", auth_time, method, None)


@pytest.mark.parametrize(
    ("principal", "now", "fresh"),
    [
        pytest.param(key_login("service", "private_key_jwt", 1000.0), 1100.0, True,
                     id="service-fresh-key-login"),
        pytest.param(key_login("agent", "private_key_jwt", 1000.0), 1300.0, True,
                     id="agent-key-login-at-window-edge"),
        pytest.param(key_login("agent", "private_key_jwt", 1000.0), 1301.0, False,
                     id="agent-key-login-too-old"),
        pytest.param(key_login("service", "password", 1000.0), 1001.0, False,
                     id="service-without-key-login"),
        pytest.param(ANONYMOUS, 1.0, False, id="anonymous"),
    ],
)
def test_services_and_agents_are_fresh_only_after_a_recent_key_login(
    principal: Principal, now: float, fresh: bool
) -> None:
    """Services and agents cannot step up: a recent signed-assertion login is their fresh
    strong authentication. The one rule, used by the chain and by reviews."""
    if fresh:
        stepup.require_fresh(principal, now=now, window_s=300)
        return
    with pytest.raises(StepUpRequired) as caught:
        stepup.require_fresh(principal, now=now, window_s=300)
    assert 'error="insufficient_user_authentication"' in caught.value.challenge


def test_require_fresh_carries_the_description_into_the_challenge() -> None:
    with pytest.raises(StepUpRequired) as caught:
        stepup.require_fresh(human(None), now=1.0, window_s=60, description="review needs it")
    assert caught.value.message == "review needs it"
    assert 'error_description="review needs it"' in caught.value.challenge
    assert "max_age=60" in caught.value.challenge
