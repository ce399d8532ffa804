"""Contract fuzzing: schemathesis against a real ``cpctl serve`` process.

The schema is the served description (``service.api.openapi.description()``, which a test in
test_description.py asserts equal to ``GET /api/v1/openapi.json``). Each operation is one
pytest item, its id the operation (``test_operation_conforms[POST /api/v1/compose/import]``);
each generated case (positive and negative data) is sent twice, anonymously and as the one dev
identity that gets deepest into that operation (``IDENTITY``), and every response must:

- never be a 5xx (``not_a_server_error``);
- have a described status, content type, headers and body (``status_code_conformance``,
  ``content_type_conformance``, ``response_headers_conformance``, ``response_schema_conformance``);
- be ``application/problem+json`` when it is a 4xx (``problem_json_on_4xx``, below);
- be refused when the data is invalid (``negative_data_rejection``).

Two sizes, both derandomized (a fixed seed: the same cases on every run):

- smoke (default, part of ``make test``): every operation, its schema examples and
  ``SMOKE_EXAMPLES`` generated cases; no coverage phase. Seconds.
- full (``CONTROLPLANE_FUZZ=full``, ``make fuzz``, run by ``.ci/run``): schema examples, the
  coverage phase (boundary and invalid values for every constraint, missing parameters, wrong
  content types) capped at ``COVERAGE_CAP`` cases per operation, and ``MAX_EXAMPLES``
  generated cases. Schemathesis attaches coverage cases as explicit Hypothesis examples, which
  ``max_examples`` does not bound: uncapped, ``POST /api/v1/compose/import`` alone has ~1,500.

Logins are fuzzed too: invalid credentials count against the per-subject and per-address
failure budgets, so later logins answer 429 ``login_throttled`` — described behaviour, checked
like any other answer. Tokens are taken before fuzzing starts.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, settings
from schemathesis.checks import not_a_server_error
from schemathesis.generation.feedback import FeedbackSources
from schemathesis.pytest._test_builder import build_operation_test
from schemathesis.pytest.plugin import make_constants_value_source
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

FULL = os.environ.get("CONTROLPLANE_FUZZ", "") == "full"
SMOKE_EXAMPLES = 5
MAX_EXAMPLES = 25
COVERAGE_CAP = 150

# The caller besides "anonymous", per operation: the shipped identity whose grants take a case
# furthest into the handler (past authentication, step-up and the policy, into validation and
# the operation itself). alice (operator, human, stepped up) holds the widest set of the
# operations' actions: every read, approvals.create/revoke, installer.run.execute,
# compose.import. Two actions she lacks have one holder among the shipped identities:
# approvals.review (bob, approver) and tasks.report (ci-bot, service kind). audit.read belongs
# to admin, which no shipped identity holds: that operation is fuzzed as far as its 403.
DEFAULT_IDENTITY = "alice"
IDENTITY = {
    "POST /api/v1/approvals/{id}/reviews": "bob",
    "POST /api/v1/tasks/{id}/events": "ci-bot",
}


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

# Items are plain pytest parameters (one per operation) and each builds its Hypothesis test with
# ``build_operation_test``, the builder behind ``schema.parametrize()`` (same phases, examples,
# coverage cases, positive and negative data). Not ``schema.parametrize()`` itself: under
# pytest 9 its items all share one node id (no operation in it), and it builds every
# operation's coverage cases at collection time, smoke runs included. The builder and the
# feedback sources are schemathesis internals (version bounded <5 in pyproject.toml): if they
# move, the import above fails loudly.
schema = schemathesis.openapi.from_dict(description())
schema.config.generation.update(deterministic=True)
# Invalid data may also be refused for its size: a body past server.max_body_bytes is a 413
# problem before the schema is read (a command argv at the schema's maxItems is such a body).
schema.config.checks.negative_data_rejection.expected_statuses = [
    *schema.config.checks.negative_data_rejection.expected_statuses, "413"]
schema.config.phases.update(phases=["examples", "coverage", "fuzzing"] if FULL else ["examples", "fuzzing"])
OPERATIONS = {f"{op.method.upper()} {op.path}": op for op in (r.ok() for r in schema.get_all_operations())}
FEEDBACK = FeedbackSources(constants_value_source=make_constants_value_source(schema))


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
def tokens(service: str) -> dict[tuple[str, str], str]:
    """(use, subject) -> access token, taken before any fuzzing: one session per identity for
    every operation, and one of the default identity's that only the logout operation may end."""
    tokens = {("shared", subject): _login(service, subject, step_up=True)
              for subject in sorted({DEFAULT_IDENTITY, *IDENTITY.values()})}
    tokens["logout", DEFAULT_IDENTITY] = _login(service, DEFAULT_IDENTITY, step_up=False)
    return tokens


@pytest.fixture(scope="module")
def session() -> Iterator[requests.Session]:
    with requests.Session() as s:
        yield s


@settings(
    max_examples=MAX_EXAMPLES if FULL else SMOKE_EXAMPLES,
    derandomize=True,  # a fixed seed: the same cases on every run
    database=None,
    deadline=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)
def _conforms(case: Any, base: str, callers: list[dict[str, str]], session: requests.Session) -> None:
    for headers in callers:
        case.call_and_validate(base_url=base, session=session, headers=headers, checks=CHECKS, timeout=10)


def _cap_explicit_examples(test: Callable[..., Any], cap: int) -> None:
    """Keep ``cap`` of the test's explicit examples (schema examples + coverage cases), spread
    evenly over the list in its order, first and last included."""
    examples = getattr(test, "hypothesis_explicit_examples", [])
    total = len(examples)
    if total > cap:
        examples[:] = [examples[round(i * (total - 1) / (cap - 1))] for i in range(cap)]


@pytest.mark.parametrize("label", list(OPERATIONS))
def test_operation_conforms(label: str, service: str, tokens: dict[tuple[str, str], str],
                            session: requests.Session) -> None:
    operation = OPERATIONS[label]
    if operation.method.upper() == "DELETE":
        use = "logout"  # logging out ends a session: never the one the other operations share
    else:
        use = "shared"  # public operations too: they should not depend on the caller
    token = tokens[use, IDENTITY.get(label, DEFAULT_IDENTITY)]
    callers = [{}, {"Authorization": f"Bearer {token}"}]
    test = build_operation_test(config=schema.config, operation=operation, test_func=_conforms,
                                given_kwargs={}, feedback=FEEDBACK)
    _cap_explicit_examples(test, COVERAGE_CAP)
    test(base=service, callers=callers, session=session)
