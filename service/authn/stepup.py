"""Step-up (RFC 9470): the one freshness rule and the one ``WWW-Authenticate`` challenge.

People step up (TOTP on top of the password session). Services and agents cannot: for them a
fresh key-based login counts instead, because their signed assertion is a proof of possession
of their key; they log in again with a new assertion rather than step up.
"""

from __future__ import annotations

import re

from .errors import StepUpRequired
from .principal import Principal

__all__ = [
    "ACR_STEP_UP",
    "AMR_STEP_UP",
    "FEDERATED_METHODS",
    "KEY_BASED_METHODS",
    "METHOD_ASSERTION",
    "METHOD_OIDC",
    "METHOD_TOKEN_EXCHANGE",
    "challenge",
    "require_fresh",
]

#: ``acr`` of a session that stepped up; the value the challenge asks for in ``acr_values``.
ACR_STEP_UP = "urn:controlplane:acr:mfa"
#: ``amr`` after a step-up (RFC 8176 §2: password, one-time password, multiple factors).
AMR_STEP_UP = ("pwd", "otp", "mfa")
#: ``authn_method`` of a session opened with a signed assertion (services and agents).
METHOD_ASSERTION = "private_key_jwt"
#: ``authn_method`` of a workload session opened by an RFC 8693 token exchange.
METHOD_TOKEN_EXCHANGE = "token_exchange"  # noqa: S105 - a method name
#: ``authn_method`` of a person's session opened by an OpenID Connect sign-in.
METHOD_OIDC = "oidc"
#: Methods whose subjects need no entry in the identities file (the federation vouches).
FEDERATED_METHODS = frozenset({METHOD_OIDC, METHOD_TOKEN_EXCHANGE})
#: Methods that prove possession of a key at login: a fresh one stands in for step-up.
KEY_BASED_METHODS = frozenset({METHOD_ASSERTION, METHOD_TOKEN_EXCHANGE})
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


def require_fresh(
    principal: Principal,
    now: float,
    window_s: float,
    description: str = "this action needs a recent step-up authentication",
) -> None:
    """Raise ``StepUpRequired`` (with the RFC 9470 challenge) unless ``principal`` holds a fresh
    strong authentication: a step-up within ``window_s`` for people; for services and agents, a
    key-based login within ``window_s``. Anonymous callers never pass."""
    if principal.kind == "human":
        fresh = principal.step_up_verified(now, window_s)
    else:
        fresh = (
            principal.is_authenticated
            and principal.authn_method in KEY_BASED_METHODS
            and now - principal.auth_time <= window_s
        )
    if not fresh:
        raise StepUpRequired(challenge(description, max_age=int(window_s)), description)
