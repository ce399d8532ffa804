"""Fixtures of the compose preflight tests: the repository's rule set and a one-call checker."""

from __future__ import annotations

from typing import Any

import pytest

from service.compose.preflight import RuleSet, evaluate
from tests.compose.support import Check


@pytest.fixture(scope="session")
def rules() -> RuleSet:
    return RuleSet.load()


@pytest.fixture
def check(rules: RuleSet) -> Check:
    """``check({"web": {...}}, env=..., strict=...)`` -> the report."""

    def run(services: dict[str, Any], *, env: str | None = None, strict: bool = False,
            **top: Any) -> dict[str, Any]:
        return evaluate({"services": services, **top}, strict=strict, env=env, rules=rules)

    return run
