"""One definition of production: the configuration's ``environments`` is projected into the
policy data (``data.environments[*].production``); the data file cannot disagree with it."""

from __future__ import annotations

import pytest

from service.authz.engine import PolicyEngine, default_policies_dir
from service.authz.projection import build_projection
from tests.authz.conftest import doc, write_policy

ECHO_PRODUCTION = """
    package controlplane.authz
    import rego.v1
    decision := {"decision": "allow", "approval": {},
                 "reasons": [sprintf("%v_%v", [data.environments[input.env].production,
                                               data.environments[input.env].agent_requires_approval])]}
"""


def test_config_flags_replace_the_data_files(tmp_path):
    data = "environments:\n  dev: {production: true}\n  qa: {production: false}\n"
    root = write_policy(tmp_path / "p", ECHO_PRODUCTION, data=data)
    engine = PolicyEngine(root, {"dev": False, "prod": True}, vet_in_subprocess=False)
    assert engine.load().ok
    assert engine.decide(doc(action="tasks.read", env="dev")).reasons == ("false_false",)
    # Only configured: present, with the fail-closed approval default.
    assert engine.decide(doc(action="tasks.read", env="prod")).reasons == ("true_true",)
    # Only in the data file: production, as the configuration treats unknown environments.
    assert engine.decide(doc(action="tasks.read", env="qa")).reasons == ("true_true",)


@pytest.mark.parametrize("staging_is_production", [False, True])
def test_a_config_only_change_changes_the_shipped_policys_decision(staging_is_production):
    environments = {"dev": False, "staging": staging_is_production, "prod": True}
    engine = PolicyEngine(default_policies_dir(), environments, vet_in_subprocess=False)
    assert engine.load().ok
    decision = engine.decide(doc(subject="alice", action="installer.run.execute", env="staging"))
    if staging_is_production:
        assert decision.decision == "require_approval"
        assert "production_mutation" in decision.reasons  # the policy's own rule, from data
    else:
        assert decision.decision == "allow"


def test_without_config_the_data_file_stands():
    data = {"environments": {"dev": {"production": True}}}
    assert build_projection(data).rego_data["environments"] == data["environments"]
