"""Step-up (RFC 9470): the freshness check and the ``WWW-Authenticate`` challenge.

Only humans step up (TOTP on top of the password session); services and agents authenticate with
a key and cannot, so an action that needs a fresh step-up is never theirs to run.
"""

from __future__ import annotations

import re

from .errors import StepUpRequired, StepUpUnavailable
from .principal import Principal

__all__ = ["ACR_STEP_UP", "AMR_STEP_UP", "challenge", "is_fresh", "require_fresh"]

#: ``acr`` of a session that stepped up; the value the challenge asks for in ``acr_values``.
ACR_STEP_UP = "urn:controlplane:acr:mfa"
#: ``amr`` after a step-up (RFC 8176 §2: password, one-time password, multiple factors).
AMR_STEP_UP = ("pwd", "otp", "mfa")
_UNSAFE = re.compile(r"[^\x20-\x7e]")


def _quoted(value: str) -> str:
    # RFC 9110 §5.6.4 quoted-string: printable ASCII, with '\' and '"' escaped.
    value = _UNSAFE.sub("?", value)
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def challenge(
    description: str = "a recent step-up authentication is required",
    *,
    acr_values: str = ACR_STEP_UP,
    max_age: int | None = None,
) -> str:
    """The ``WWW-Authenticate`` value of RFC 9470 §3 for a 401 that asks for a step-up."""
    params = [
        'error="insufficient_user_authentication"',
        f"error_description={_quoted(description)}",
        f"acr_values={_quoted(acr_values)}",
    ]
    if max_age is not None:
        params.append(f"max_age={int(max_age)}")
    return "Bearer " + ", ".join(params)


def is_fresh(principal: Principal, now: float, window_s: float) -> bool:
    """True when a human principal stepped up within ``window_s`` seconds."""
    return principal.kind == "human" and principal.step_up_verified(now, window_s)


def require_fresh(principal: Principal, now: float, window_s: float) -> None:
    """Raise unless ``principal`` holds a fresh step-up.

    ``StepUpUnavailable`` for services, agents and anonymous callers (no challenge would help);
    ``StepUpRequired`` with the RFC 9470 challenge for humans.
    """
    if principal.kind != "human":
        raise StepUpUnavailable()
    if not principal.step_up_verified(now, window_s):
        raise StepUpRequired(challenge(max_age=int(window_s)))
