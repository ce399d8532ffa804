"""Stage 1 of the chain on its own (``service.authn.require``): a protected action needs an
authenticated principal, and an anonymous one is refused with the presented token's own code
(what a client needs to tell "log in" from "your token expired") as the chain answers it."""

from __future__ import annotations

import pytest

from service.authn.errors import Unauthenticated
from service.authn.principal import ANONYMOUS, Principal
from service.authn.require import require
from service.errors import to_problem

ALICE = Principal(subject_id="alice", kind="human", session_id="s1", auth_time=1.0,
                  authn_method="password")


@pytest.mark.parametrize("principal", [
    ALICE,
    Principal(subject_id="ci-bot", kind="service", session_id="s2", auth_time=1.0,
              authn_method="private_key_jwt"),
], ids=["human", "service"])
def test_an_authenticated_principal_passes_unchanged(principal):
    # A token error noted for another credential of the request changes nothing for it.
    assert require(principal, None) is principal
    assert require(principal, "token_expired") is principal


def test_no_principal_is_401_unauthenticated():
    with pytest.raises(Unauthenticated) as refused:
        require(ANONYMOUS, None)
    problem = to_problem(refused.value)
    assert (problem.status, problem.instance_code) == (401, "unauthenticated")


@pytest.mark.parametrize("code", ["token_expired", "session_revoked", "token_alg_not_allowed",
                                  "authentication_unavailable"])
def test_a_refused_token_is_401_with_its_own_code(code):
    with pytest.raises(Unauthenticated) as refused:
        require(ANONYMOUS, code)
    problem = to_problem(refused.value)
    assert (problem.status, problem.instance_code) == (401, code)
    assert "WWW-Authenticate" in problem.headers
