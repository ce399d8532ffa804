"""Step-up (RFC 9470): the challenge header and the freshness rule."""

from __future__ import annotations

import pytest

from service.authn import stepup
from service.authn.errors import StepUpRequired, StepUpUnavailable
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


@pytest.mark.parametrize(
    "principal",
    [
        pytest.param(
            Principal("ci-bot", "service", "s", 0.0, "private_key_jwt", 0.0), id="service"
        ),
        pytest.param(Principal("agent-7", "agent", "s", 0.0, "private_key_jwt", 0.0), id="agent"),
        pytest.param(ANONYMOUS, id="anonymous"),
    ],
)
def test_services_agents_and_anonymous_cannot_step_up(principal: Principal) -> None:
    assert not stepup.is_fresh(principal, now=1.0, window_s=300)
    with pytest.raises(StepUpUnavailable) as caught:
        stepup.require_fresh(principal, now=1.0, window_s=300)
    assert caught.value.code == "step_up_not_available"
