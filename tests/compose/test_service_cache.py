"""The per-service cache of rule outputs: a file that changed in one service evaluates that
service only, and its report is exactly the report of a full evaluation."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from service.compose.normalize import normalize_files
from service.compose.preflight import POLICY_DIR, RuleSet, evaluate
from tests.compose.support import CORPUS, EXAMPLES, RUNTIME_CONFLICT, policy_copy


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> RuleSet:
    """The shipped rules as a rule set of their own (empty caches, used by this module only)."""
    sources = {p.name: p.read_text() for p in sorted(POLICY_DIR.glob("*.rego"))
               if not p.name.endswith("_test.rego")}
    return RuleSet.from_sources(sources, cache_key=tmp_path_factory.mktemp("service-cache"))




def _fields(path: Path) -> dict[str, Any]:
    dotenv = CORPUS / "dotenv" / f"{path.stem}.env"
    if path.parent == EXAMPLES:
        dotenv = EXAMPLES / "interpolation.env"
    return normalize_files([path], environ={},
                           env_file=dotenv if dotenv.is_file() else Path("/dev/null"))


def _files() -> list[Path]:
    """The example and corpus files with more than one service (something to reuse)."""
    corpus = sorted(CORPUS.glob("*.yaml")) if CORPUS.is_dir() else []
    return [path for path in [*sorted(EXAMPLES.glob("*.compose.yaml")), *corpus]
            if len(_fields(path)["services"]) > 1]


def _text(report: dict[str, Any]) -> str:
    return json.dumps(report)  # key order included: what the endpoint sends


def _counts(rules: RuleSet) -> tuple[int, int]:
    return rules.services.hits, rules.services.misses


@pytest.mark.parametrize("path", _files(), ids=lambda p: p.stem)
def test_one_changed_service_is_the_only_one_evaluated(path: Path, fresh: RuleSet) -> None:
    fields = _fields(path)
    names = list(fields["services"])
    for env, strict in ((None, False), ("prod", True)):
        first = evaluate(fields, env=env, strict=strict, rules=fresh)
        assert _text(first) == _text(evaluate(fields, env=env, strict=strict, rules=fresh,
                                              cache=False))
        changed = copy.deepcopy(fields)
        service = changed["services"][names[-1]]
        service["privileged"] = True
        # unique to this file: the changed service was seen nowhere before
        service["environment"] = {**(service.get("environment") or {}),
                                  "API_TOKEN": f"t0k3n-{path.stem}"}
        hits, misses = _counts(fresh)
        report = evaluate(changed, env=env, strict=strict, rules=fresh)
        assert _counts(fresh) == (hits + len(names) - 1, misses + 1)
        assert _text(report) == _text(evaluate(changed, env=env, strict=strict, rules=fresh,
                                               cache=False))
        assert any(f["rule"] == "privileged" and f["service"] == names[-1]
                   for f in report["findings"])


def test_a_top_level_change_reevaluates_every_service(fresh: RuleSet) -> None:
    """The top-level definitions are context of every service (a named volume's device, the
    project name): a change there is a miss for all of them."""
    fields = _fields(EXAMPLES / "risky.compose.yaml")
    evaluate(fields, env="prod", rules=fresh)
    for change in ({"name": "renamed"}, {"volumes": {**(fields.get("volumes") or {}),
                                                     "extra": {"driver": "local"}}}):
        hits, misses = _counts(fresh)
        evaluate({**fields, **change}, env="prod", rules=fresh)
        assert _counts(fresh) == (hits, misses + len(fields["services"]))


def test_a_rule_that_fails_caches_nothing(tmp_path: Path) -> None:
    """A rule's evaluation error might belong to one service of its chunk: that chunk's outputs
    are not kept, and a second report errs the same way."""
    rules = RuleSet.load(policy_copy(tmp_path, {"conflict.rego": RUNTIME_CONFLICT}))
    fields = {"services": {"a": {"image": "nginx:1.27"}, "b": {"image": "redis:7"}}}
    for _ in range(2):
        report = evaluate(fields, rules=rules, cache=True)
        cells = {(c["service"], c["rule"]): c["result"] for c in report["matrix"]}
        assert cells[("a", "conflict")] == cells[("b", "conflict")] == "error"
        assert len(rules.services) == 0
        fields = {"services": {**fields["services"], "c": {"image": "alpine:3.20"}}}
