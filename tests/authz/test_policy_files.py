"""The shipped policy: its Rego unit tests and decision cases pass, via the same code as the CLI."""

from __future__ import annotations

import pytest

from service.authz.engine import default_policies_dir
from service.authz.regotest import run_tests_isolated
from service.authz.source import read_snapshot
from service.policytools.cases import load_cases
from tests.authz.conftest import REPO

CASES = load_cases(REPO / "examples" / "decisions")


def test_shipped_rego_unit_tests_pass():
    report = run_tests_isolated(read_snapshot(default_policies_dir()))
    assert report.ok, report.summary()
    assert len(report.results) >= 20


def test_enough_cases_cover_roles_and_envs():
    assert len(CASES) >= 25
    subjects = {c.input["principal"]["subject_id"] for c in CASES}
    assert {"alice", "bob", "carol", "ci-bot", "agent-7", "erin"} <= subjects
    assert {c.input["env"] for c in CASES} >= {"dev", "staging", "prod"}
    assert {c.decision for c in CASES} == {"allow", "deny", "require_approval"}


def test_case_files_carry_the_schema_header():
    for path in (REPO / "examples" / "decisions").rglob("*.yaml"):
        first = path.read_text().splitlines()[0]
        assert (
            first == "# yaml-language-server: $schema=../../../schemas/policy-case.schema.json"
        ), path


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_decision_case(shipped, case):
    assert case.mismatch(shipped.decide(case.input)) is None


def test_no_agent_ever_gets_review_or_prod_mutation_allow(shipped):
    from service.authz import actions
    from tests.authz.conftest import doc

    for action in actions.all_actions():
        for env in ("dev", "staging", "prod"):
            d = shipped.decide(doc(subject="agent-7", kind="agent", action=action.name, env=env))
            if action.name == "approvals.review":
                assert d.decision == "deny"
            if env == "prod" and action.needs_ticket_in_production:
                assert d.decision != "allow"


def test_the_readme_documents_input_resource_per_action_as_the_catalogue_says():
    from service.authz import actions

    assert all(a.resource_value for a in actions.all_actions())
    readme = (REPO / "policies" / "README.md").read_text()
    begin = readme.index("<!-- generated from service/authz/actions.py")
    table = readme[readme.index("\n", begin) + 1: readme.index("<!-- end of generated table -->")]
    assert table == actions.resource_table(), "regenerate: actions.resource_table()"
