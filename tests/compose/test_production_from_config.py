"""The compose rules' production variants follow the configuration's ``environments``."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.compose.preflight import RuleSet, evaluate
from service.config import Environments

RULES = Path(__file__).resolve().parents[2] / "policies" / "compose"
FIELDS = {"services": {"web": {"image": "nginx:latest"}}}


@pytest.fixture(scope="module")
def rules() -> RuleSet:
    return RuleSet.load(RULES)


def pinning(report: dict) -> str:
    return next(c["result"] for c in report["matrix"] if c["rule"] == "image-pinning")


@pytest.mark.parametrize(("staging_is_production", "result"), [(False, "warn"), (True, "fail")])
def test_a_config_only_change_makes_an_environment_production(
    rules: RuleSet, staging_is_production: bool, result: str
) -> None:
    envs = Environments({"dev": False, "staging": staging_is_production, "prod": True})
    report = evaluate(FIELDS, env="staging", rules=rules, environments=envs)
    assert pinning(report) == result


def test_defaults_offline_and_unknown_environments_count_as_production(rules: RuleSet) -> None:
    assert pinning(evaluate(FIELDS, env="prod", rules=rules)) == "fail"
    assert pinning(evaluate(FIELDS, env="dev", rules=rules)) == "warn"
    assert pinning(evaluate(FIELDS, env="moon", rules=rules)) == "fail"  # fail closed
    assert pinning(evaluate(FIELDS, rules=rules)) == "warn"  # no env: not production
