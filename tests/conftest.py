"""Shared fixtures: a configuration per test (its own state dir) and the real app behind a client.

Layout: tests mirror ``service/``. A test of ``service/X/Y.py`` lives in ``tests/X/test_Y.py``
(or ``tests/X/test_Y_<aspect>.py`` when one module has several), a test of a top-level module
``service/Y.py`` in ``tests/test_Y.py`` (``tests/test_Y_<aspect>.py``). Whole-system tests that
belong to no one module (several ``cpctl serve`` processes, the walkthrough script) live in
``tests/system/``. Helpers shared by several test modules are modules without the ``test_``
prefix (``tests/tickets.py``, ``tests/rawhttp.py``, ``tests/authz/revisions.py``...), not test
modules imported by others.

Policy vetting: every app start loads the policy engine, which vets the revision (compile, probe
decision, the revision's own ``*_test.rego``) in a child interpreter so that a native crash
cannot take a serving worker down. App tests vet in this process instead, once per policy
content per session (``in_process_policy_vetting``): the same ``regotest.vet`` the child runs,
without an interpreter start per test. This is a test-only substitution of the module attribute
the engine calls; production has no setting for it. Tests under tests/authz/ (the engine's and
the policy CLI's own tests, including crash isolation; not the app tests of policy features listed
in ``IN_PROCESS_VETTING``) and tests marked ``child_process_vetting`` keep the real child-process
path.

Password cost: the app of ``make_config`` reads the dev identities of ``examples/identities.yaml``
with their password hashes made again at a low scrypt cost (``TEST_SCRYPT``): the same subjects,
passwords, TOTP secrets and keys, and real scrypt verification, without a 32 MiB derivation per
login (most app tests log in several times). A test that names its own identities file (by
override or ``CONTROLPLANE_AUTHN__IDENTITIES``) gets that file as it is.
"""

from __future__ import annotations

import hashlib
import io
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp.test_utils import TestClient

from service.app import create_app
from service.authn import passwords
from service.authz import engine as policy_engine
from service.authz import regotest
from service.authz.source import Snapshot
from service.config import Config, load
from service.logs import JSONFormatter
from service.repeats import REPEATS
from tests import contract_hooks
from tests.auth import PASSWORDS
from tests.servers import EdgeTestServer
from tests.store import pg

REPO = Path(__file__).resolve().parent.parent
AUTHZ_TESTS = REPO / "tests" / "authz"

#: Modules under tests/authz/ that test policy features through the app, as the other app tests do:
#: they vet in-process.
IN_PROCESS_VETTING = frozenset({
    "tests/authz/test_activations_fleet.py",
    "tests/authz/test_input_resource.py",
    "tests/authz/test_shadow.py",
    "tests/authz/test_shadowproc.py",
    "tests/authz/test_shadow_revision.py",
})

MakeConfig = Callable[..., Config]
MakeClient = Callable[..., Awaitable[TestClient]]

_vetted: dict[tuple[str, str | None, str], regotest.TestReport] = {}


def vet_in_process(
    snapshot: Snapshot, *, mode: str = "test", only: str | None = None, timeout: float = 60.0
) -> regotest.TestReport:
    """``regotest.run_tests_isolated`` without the child: what the child would run (``vet`` or
    ``run_tests``), memoised by the revision's full content (modules, tests, data)."""
    digest = hashlib.sha256(snapshot.to_json().encode()).hexdigest()
    key = (mode, only, digest)
    report = _vetted.get(key)
    if report is None:  # a TestReport is immutable: sharing it between tests is safe
        report = regotest.vet(snapshot) if mode == "vet" else regotest.run_tests(snapshot, only)
        _vetted[key] = report
    return report


#: The slowest whole-system tests: several real ``cpctl serve`` processes, replicas, a browser.
#: ``make e2e`` runs them (marker ``e2e``), ``make test`` the rest; ``.ci/run`` runs both. A module
#: path names every test in it, ``path::name`` one test.
E2E_TESTS = frozenset({
    "tests/system/test_processes.py",
    "tests/system/test_operations.py",
    "tests/system/test_log_floods.py",
    "tests/authn/test_throttling_processes.py",
    "tests/authz/test_activations_fleet.py",
    "tests/authz/test_shadowproc.py::test_no_shadow_process_outlives_cpctl_serve_workers",
    "tests/console/test_console_browser.py",
    "tests/console/test_console_sso_review.py::"
    "test_an_sso_approver_approves_in_a_real_browser_and_the_run_executes",
    "tests/console/test_console_browser_policy.py",
    "tests/cli/test_serve.py",
    "tests/cli/test_revisions_cli.py",
    "tests/cli/test_policy_flow_cli.py::test_publish_activate_rollback_request_wait_and_present_their_tickets",
    "tests/authz/test_cli_policy.py::test_the_cpctl_entry_point_runs_every_policy_subcommand",
    "tests/cli/test_audit_cli.py",
    "tests/cli/test_token_renewal_cli.py",
    "tests/cli/test_task_loop_cli.py",
    "tests/cli/test_wait_and_run_cli.py",
    "tests/cli/test_approval_cli.py",
    "tests/authn/test_sessions_revocation_processes.py",
    "tests/authn/test_oidc_signin.py::test_cpctl_whoami_and_hints_for_an_sso_user",
    "tests/authn/test_oidc_signin.py::test_cpctl_login_sso_completes_through_the_loopback_redirect",
    "tests/test_edge.py::test_cpctl_serve_answers_a_broken_header_with_a_problem_and_logs_no_token",
    "tests/system/test_walkthrough.py",
    "tests/docs/test_quickstart.py::test_the_quickstart_runs_as_pasted",
    "tests/test_edge.py::test_cpctl_serve_streams_end_on_sigterm_and_disconnects_log_nothing",
    "tests/authn/test_token_exchange.py::test_cpctl_login_token_file",
    "tests/cli/test_keyring_cli.py::test_rotation_under_a_running_server",
    "tests/test_accesslog.py::test_cpctl_serve_writes_one_json_access_line_with_the_clients_id",
    "tests/authz/test_shadowproc.py::test_a_killed_shadow_process_is_started_again_and_counted",
    "tests/authn/test_reload.py::test_cpctl_add_user_lets_them_log_in_to_a_running_server_within_5s",
    "tests/store/test_faults.py::test_stall_answers_every_request_within_the_deadline",
    "tests/authz/test_rego_input.py::test_the_policy_sees_the_document",
    "tests/compose/test_budget.py::test_500_services_are_answered_within_the_budget_by_the_cli",
    "tests/compose/test_long_values.py::test_cpctl_compose_check_answers_for_long_strings_everywhere",
    "tests/api/test_compose_isolation.py::test_values_up_to_the_body_limit_in_every_position_are_answered_over_http",
})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        module = item.path.relative_to(REPO).as_posix()
        if AUTHZ_TESTS in item.path.parents and module not in IN_PROCESS_VETTING:
            item.add_marker(pytest.mark.child_process_vetting)
        name = getattr(item, "originalname", item.name)
        if module in E2E_TESTS or f"{module}::{name}" in E2E_TESTS:
            item.add_marker(pytest.mark.e2e)


@contextmanager
def json_log_lines(level: int = logging.DEBUG) -> Iterator[io.StringIO]:
    """Every log record of the service at ``level`` and above, as the JSON lines it would write."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JSONFormatter())
    root = logging.getLogger()
    root.addHandler(handler)
    previous = root.level
    root.setLevel(level)
    try:
        yield stream
    finally:
        root.removeHandler(handler)
        root.setLevel(previous)


@pytest.fixture(autouse=True)
def fresh_log_repeats() -> None:
    """Each test starts with no repeated cause remembered (``service.repeats``): a failure a
    test provokes is logged as a first occurrence, whatever an earlier test logged."""
    REPEATS.clear()


@pytest.fixture(autouse=True)
def in_process_policy_vetting(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """App tests vet policy revisions in-process (see the module docstring)."""
    if request.node.get_closest_marker("child_process_vetting") is None:
        monkeypatch.setattr(policy_engine, "run_tests_isolated", vet_in_process)


#: The scrypt cost of the test identities' password hashes (the service's default is ln=15).
TEST_SCRYPT = passwords.ScryptParams(ln=4, r=8, p=1)


@pytest.fixture(scope="session")
def dev_identities(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``examples/identities.yaml`` with the known dev passwords hashed at ``TEST_SCRYPT``."""
    doc = yaml.safe_load((REPO / "examples" / "identities.yaml").read_text(encoding="utf-8"))
    for identity in doc["identities"]:
        if identity.get("password_hash") and identity["subject_id"] in PASSWORDS:
            identity["password_hash"] = passwords.hash_password(
                PASSWORDS[identity["subject_id"]], TEST_SCRYPT)
    path = tmp_path_factory.mktemp("identities") / "identities.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


@pytest.fixture
def make_config(tmp_path: Path, dev_identities: Path) -> MakeConfig:
    """Build a Config from defaults + ``overrides`` (nested dicts), state under ``tmp_path``,
    the dev identities at a low password cost unless the test names its own."""

    def make(overrides: dict[str, Any] | None = None, environ: dict[str, str] | None = None) -> Config:
        merged: dict[str, Any] = {"state_dir": str(tmp_path / "state")}
        merged.update(overrides or {})
        if "CONTROLPLANE_AUTHN__IDENTITIES" not in (environ or {}):
            merged["authn"] = {"identities": str(dev_identities), **(merged.get("authn") or {})}
        return load(None, environ or {}, base_dir=REPO, overrides=merged)

    return make


@pytest.fixture
def aiohttp_client(aiohttp_client: Any) -> Any:
    """pytest-aiohttp's client factory; every response of the real app is checked against
    schemas/openapi.yaml (status, content type, headers, body schema): tests/contract_hooks.py."""

    async def make(*args: Any, **kwargs: Any) -> Any:
        return contract_hooks.watch(await aiohttp_client(*args, **kwargs))

    return make


@pytest.fixture
def make_client(aiohttp_client: Any, make_config: MakeConfig) -> MakeClient:
    """Start the real application for ``overrides`` and return a client bound to it."""

    async def make(overrides: dict[str, Any] | None = None) -> TestClient:
        # The server `cpctl serve` runs (edge limits and problem+json parser errors included).
        return await aiohttp_client(EdgeTestServer(create_app(make_config(overrides))))

    return make


@pytest.fixture
async def client(make_client: MakeClient) -> TestClient:
    return await make_client()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def client_on_each_store(request: pytest.FixtureRequest,
                               make_client: MakeClient) -> AsyncIterator[TestClient]:
    """The real app on a SQLite file, then on a PostgreSQL schema of its own."""
    if request.param == "sqlite":
        yield await make_client()
        return
    async with pg.temp_schema("cp_app") as (dsn, schema):
        yield await make_client({"store": {"backend": "postgres",
                                           "postgres": {"dsn": dsn, "schema": schema}}})
