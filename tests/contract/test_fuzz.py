"""Contract fuzzing: schemathesis against a real ``cpctl serve`` process, as each dev identity.

The schema is the served description (``service.api.openapi.description()``, which a test in
test_description.py asserts equal to ``GET /api/v1/openapi.json``). Each operation is one
pytest item; each generated case (positive and negative data) is sent anonymously and as
every dev identity, and every response must:

- never be a 5xx (``not_a_server_error``);
- have a described status, content type, headers and body (``status_code_conformance``,
  ``content_type_conformance``, ``response_headers_conformance``, ``response_schema_conformance``);
- be ``application/problem+json`` when it is a 4xx (``problem_json_on_4xx``, below);
- be refused when the data is invalid (``negative_data_rejection``).

Examples are bounded (``MAX_EXAMPLES`` per operation) and derandomized (a fixed seed), so a run
is reproducible and takes well under the ~90 s budget. Logins are fuzzed too: invalid
credentials count against the per-subject and per-address failure budgets, so later logins
answer 429 ``login_throttled`` — described behaviour, checked like any other answer. Tokens are
taken before fuzzing starts.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from service.api.openapi import description
from service.authn import totp
from tests.auth import PASSWORDS, TOTP_SECRETS, assertion
from tests.servers import serve

MAX_EXAMPLES = 25
IDENTITIES = ("alice", "bob", "carol", "ci-bot", "agent-7")


@schemathesis.check
def problem_json_on_4xx(ctx: Any, response: Any, case: Any) -> bool | None:
    """Every 4xx is an RFC 9457 problem with the status and a code."""
    if not 400 <= response.status_code < 500:
        return None
    content_type = (response.headers.get("content-type") or [""])[0]
    if content_type.split(";")[0].strip() != "application/problem+json":
        raise AssertionError(f"{response.status_code} with content type {content_type!r}")
    body = json.loads(response.content)
    if body.get("status") != response.status_code or not body.get("code"):
        raise AssertionError(f"problem body does not match its status: {body}")
    return True


CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    negative_data_rejection,
    problem_json_on_4xx,
]

schema = schemathesis.openapi.from_dict(description())
schema.config.generation.update(deterministic=True)


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with serve(tmp_path_factory.mktemp("fuzz") / "state") as (base, _proc):
        yield base


def _login(base: str, subject: str, *, step_up: bool) -> str:
    body = ({"subject_id": subject, "password": PASSWORDS[subject]} if subject in PASSWORDS
            else {"assertion": assertion(subject)})
    response = requests.post(base + "/api/v1/authn/sessions", json=body, timeout=10)
    assert response.status_code == 201, response.text
    token = str(response.json()["access_token"])
    if step_up and subject in TOTP_SECRETS:  # so production paths get past step-up
        otp = totp.code_at(TOTP_SECRETS[subject], time.time())
        stepped = requests.post(base + "/api/v1/authn/step-up", json={"otp": otp}, timeout=10,
                                headers={"Authorization": f"Bearer {token}"})
        assert stepped.status_code == 201, stepped.text
        token = str(stepped.json()["access_token"])
    return token


@pytest.fixture(scope="module")
def callers(service: str) -> dict[str, dict[str, dict[str, str]]]:
    """Headers per caller (anonymous, then every dev identity), logged in before any fuzzing:
    one session for every operation, and one that only the logout operation may end."""
    callers: dict[str, dict[str, dict[str, str]]] = {"shared": {"anonymous": {}},
                                                     "logout": {"anonymous": {}}}
    for subject in IDENTITIES:
        for use in ("shared", "logout"):
            token = _login(service, subject, step_up=use == "shared")  # a TOTP code works once
            callers[use][subject] = {"Authorization": f"Bearer {token}"}
    return callers


@pytest.fixture(scope="module")
def session() -> Iterator[requests.Session]:
    with requests.Session() as s:
        yield s


@schema.parametrize()
@settings(
    max_examples=MAX_EXAMPLES,
    derandomize=True,  # a fixed seed: the same cases on every run
    database=None,
    deadline=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)
def test_operation_conforms(case: Any, service: str, callers: dict[str, dict[str, dict[str, str]]],
                            session: requests.Session) -> None:
    operation = case.operation
    if operation.method.upper() == "DELETE":
        # Logging out ends a session: never the one the other operations share.
        who = callers["logout"]
    elif operation.definition.raw.get("security"):
        who = callers["shared"]
    else:
        # Public operations do not depend on the caller: anonymous, and one identity's token.
        who = {name: callers["shared"][name] for name in ("anonymous", "alice")}
    for headers in who.values():
        case.call_and_validate(base_url=service, session=session, headers=headers, checks=CHECKS,
                               timeout=10)
