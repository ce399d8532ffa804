"""The report: shape, strict vs non-strict, policy revision, and rule errors that never crash it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from service.compose.preflight import POLICY_DIR, RuleSet, evaluate
from tests.compose.support import RUNTIME_CONFLICT, Check, cell, policy_copy

WARN_ONLY = {"image": "a:1", "user": "1000", "cap_drop": ["ALL"],
             "security_opt": ["no-new-privileges:true"], "networks": {"back": None},
             "healthcheck": {"test": ["CMD", "true"]},
             "deploy": {"resources": {"limits": {"memory": 1024, "cpus": 1, "pids": 100}}}}
# (read_only unset: one warning)


def resolve(fields: dict[str, Any], pointer: str) -> Any:
    node: Any = fields
    for token in pointer.split("/")[1:]:
        token = token.replace("~1", "/").replace("~0", "~")
        node = node[int(token)] if isinstance(node, list) else node[token]
    return node


def test_report_shape(check: Check, rules: RuleSet) -> None:
    report = check({"a": WARN_ONLY, "b": {"image": "b", "privileged": True}})
    assert set(report) == {"passed", "strict", "env", "summary", "rules", "matrix", "findings",
                           "policy_revision"}
    summary = report["summary"]
    assert summary["services"] == 2 and summary["rules"] == len(rules.rules)
    assert summary["cells"] == len(report["matrix"]) == 2 * len(rules.rules)
    assert sum(summary[k] for k in ("fail", "warn", "info", "pass", "n/a", "error")) == \
        summary["cells"]
    assert [c["service"] for c in report["matrix"]][:1] == ["a"]  # services in file order
    for c in report["matrix"]:
        assert set(c) == {"service", "rule", "result", "message"}
        assert c["result"] in ("pass", "fail", "warn", "info", "n/a", "error")
    for f in report["findings"]:
        assert set(f) >= {"service", "rule", "severity", "message", "rationale", "remediation",
                          "pointer"}
        assert f["severity"] != "pass"
    assert report["policy_revision"] == rules.revision
    assert report["policy_revision"].startswith("sha256:")


def test_finding_pointers_point_into_fields(check: Check) -> None:
    fields = {"services": {"w/eb": {"image": "x:latest", "privileged": True,
                                    "environment": {"API_TOKEN": "abc"},
                                    "ports": [{"target": 80}],
                                    "volumes": [{"type": "bind", "source": "/etc",
                                                 "target": "/e"}]}}}
    report = check(fields["services"])
    existing = [f for f in report["findings"]
                if f["rule"] in ("privileged", "secret-env", "published-ports", "sensitive-mounts",
                                 "image-pinning")]
    assert len(existing) == 5
    for finding in existing:
        resolve(fields, finding["pointer"])  # must not raise
        assert finding["pointer"].startswith("/services/w~1eb/")


PATHS = """package controlplane.compose.rules.paths

import rego.v1

meta := {"id": "paths", "title": "t", "severity": "warn", "rationale": "r", "remediation": "m"}

findings := [{"service": name, "message": key, "path": ["environment", key, 0]} |
	some name
	env := input.fields.services[name].environment
	some key
	env[key]
]
"""


def test_a_finding_path_is_the_pointer_below_its_service(tmp_path: Path) -> None:
    rules = RuleSet.load(policy_copy(tmp_path, {"paths.rego": PATHS}))
    report = evaluate({"services": {"w/e~b": {"image": "a", "environment": {"A/B~C": "x"}}}},
                      rules=rules, cache=False)
    [finding] = [f for f in report["findings"] if f["rule"] == "paths"]
    assert finding["pointer"] == "/services/w~1e~0b/environment/A~1B~0C/0"
    assert "path" not in finding


# The same four findings as objects and compact: path or pointer, meta's severity or their own.
SHAPES = """package controlplane.compose.rules.{package}

import rego.v1

meta := {{"id": "{id}", "title": "t", "severity": "warn", "rationale": "r", "remediation": "m"}}

findings := [f |
	some name
	input.fields.services[name]
	some f in [
		{findings}
	]
]
"""
OBJECTS = """{"service": name, "path": ["image"], "message": "a path"},
		{"service": name, "path": ["ports", 0], "message": "a path, own severity", "severity": "fail"},
		{"service": name, "pointer": "/volumes/da~1ta", "message": "a pointer"},
		{"service": name, "pointer": "/volumes/da~1ta", "message": "a pointer, own severity",
		"severity": "info"},"""
COMPACT = """[name, ["image"], "a path"],
		[name, ["ports", 0], "a path, own severity", "fail"],
		[name, "/volumes/da~1ta", "a pointer"],
		[name, "/volumes/da~1ta", "a pointer, own severity", "info"],"""


def test_compact_findings_are_the_objects_they_stand_for(tmp_path: Path) -> None:
    """The shipped rules emit ``[service, path | pointer, message(, severity)]``; a rule that
    emits objects gets the very same findings (README, "Compact findings")."""
    for package, findings in (("objects", OBJECTS), ("compact", COMPACT)):
        (tmp_path / f"{package}.rego").write_text(SHAPES.format(
            package=package, id=package, findings=findings))
    rules = RuleSet.load(tmp_path)
    report = evaluate({"services": {"w/e": {"image": "a"}}}, rules=rules, cache=False)
    by_rule: dict[str, list[tuple[str, str, str]]] = {"objects": [], "compact": []}
    for finding in report["findings"]:
        by_rule[finding["rule"]].append(
            (finding["pointer"], finding["message"], finding["severity"]))
    assert sorted(by_rule["compact"]) == sorted(by_rule["objects"]) == sorted([
        ("/services/w~1e/image", "a path", "warn"),
        ("/services/w~1e/ports/0", "a path, own severity", "fail"),
        ("/volumes/da~1ta", "a pointer", "warn"),
        ("/volumes/da~1ta", "a pointer, own severity", "info")])
    assert {c["rule"]: c["result"] for c in report["matrix"]} == {"objects": "fail",
                                                                  "compact": "fail"}


def test_a_finding_whose_message_fails_does_not_pass(check: Check) -> None:
    """regopy drops a compact finding whose message failed (README, "Compact findings"): a rule
    whose message takes a field the schema allows as an integer keeps an object, so the
    failure still reaches the report (cgroup_parent: "string" or "integer")."""
    report = check({"a": {"image": "a:1", "cgroup_parent": 5}})
    assert cell(report, "a", "cgroup")["result"] != "pass"
    assert report["passed"] is False


def test_strict_turns_warnings_into_failure(check: Check) -> None:
    relaxed = check({"a": WARN_ONLY})
    strict = check({"a": WARN_ONLY}, strict=True)
    assert relaxed["summary"]["warn"] >= 1 and relaxed["summary"]["fail"] == 0
    assert relaxed["passed"] is True and relaxed["strict"] is False
    assert strict["passed"] is False and strict["strict"] is True
    assert strict["matrix"] == relaxed["matrix"]


def test_fail_means_not_passed_and_info_does_not(check: Check) -> None:
    assert check({"a": {**WARN_ONLY, "privileged": True}})["passed"] is False
    info_only = {**WARN_ONLY, "read_only": True, "cap_add": ["CHOWN"]}
    report = check({"a": info_only}, strict=True)
    assert report["summary"]["info"] == 1 and report["passed"] is True


def test_env_changes_results(check: Check) -> None:
    assert cell(check({"a": WARN_ONLY}), "a", "image-pinning")["result"] == "pass"
    # in prod a tag without a digest is a warning (--strict fails), an untagged image fails
    assert cell(check({"a": WARN_ONLY}, env="prod"), "a", "image-pinning")["result"] == "warn"
    untagged = {**WARN_ONLY, "image": "nginx"}
    assert cell(check({"a": untagged}), "a", "image-pinning")["result"] == "warn"
    assert cell(check({"a": untagged}, env="prod"), "a", "image-pinning")["result"] == "fail"


def test_no_services(check: Check) -> None:
    report = check({})
    assert report["passed"] is True and report["matrix"] == [] and report["summary"]["cells"] == 0


# --- rule errors --------------------------------------------------------------------------

BROKEN_SYNTAX = "package controlplane.compose.rules.broken\n\nmeta := {\n"
BAD_META = """package controlplane.compose.rules.bad_meta

import rego.v1

meta := {"id": "bad-meta", "severity": "critical"}

findings := set()
"""
MALFORMED = """package controlplane.compose.rules.malformed

import rego.v1

meta := {"id": "malformed", "title": "t", "severity": "warn", "rationale": "r", "remediation": "m"}

findings contains {"service": "no-such-service", "message": 1}
"""

BAD_PATH = """package controlplane.compose.rules.bad_path

import rego.v1

meta := {"id": "bad-path", "title": "t", "severity": "warn", "rationale": "r", "remediation": "m"}

findings := [{"service": name, "message": "x", "path": ["ports", true]} |
	some name
	input.fields.services[name]
]
"""

# A compact finding of another length, or whose place is neither a path nor a pointer.
SHORT_COMPACT = """package controlplane.compose.rules.short_compact

import rego.v1

meta := {"id": "short-compact", "title": "t", "severity": "warn", "rationale": "r", "remediation": "m"}

findings := [[name, ["image"]] |
	some name
	input.fields.services[name]
]
"""
BAD_PLACE = """package controlplane.compose.rules.bad_place

import rego.v1

meta := {"id": "bad-place", "title": "t", "severity": "warn", "rationale": "r", "remediation": "m"}

findings := [[name, 5, "x"] |
	some name
	input.fields.services[name]
]
"""


@pytest.mark.parametrize(("files", "rule_id", "when"), [
    pytest.param({"broken.rego": BROKEN_SYNTAX}, "broken", "load", id="compile-error"),
    pytest.param({"conflict.rego": RUNTIME_CONFLICT}, "conflict", "eval", id="eval-error"),
    pytest.param({"bad_meta.rego": BAD_META}, "bad-meta", "load", id="bad-meta"),
    pytest.param({"malformed.rego": MALFORMED}, "malformed", "eval", id="malformed-output"),
    pytest.param({"bad_path.rego": BAD_PATH}, "bad-path", "eval", id="malformed-path"),
    pytest.param({"short_compact.rego": SHORT_COMPACT}, "short-compact", "eval",
                 id="malformed-compact"),
    pytest.param({"bad_place.rego": BAD_PLACE}, "bad-place", "eval", id="malformed-compact-place"),
    pytest.param({"misnamed.rego": BROKEN_SYNTAX.replace("broken", "other")}, "misnamed", "load",
                 id="package-not-file-name"),
])
def test_one_broken_rule_does_not_take_the_others_down(
    tmp_path: Path, files: dict[str, str], rule_id: str, when: str
) -> None:
    rules = RuleSet.load(policy_copy(tmp_path, files))
    broken = {r.id: r for r in rules.rules}[rule_id]
    assert (broken.error is not None) == (when == "load")
    report = evaluate({"services": {"a": {"image": "a", "privileged": True}}}, rules=rules)
    assert cell(report, "a", rule_id)["result"] == "error"
    assert report["passed"] is False and report["summary"]["error"] == 1
    # Every other rule still produced its normal cell.
    assert cell(report, "a", "privileged")["result"] == "fail"
    assert sum(1 for c in report["matrix"] if c["result"] == "error") == 1
    [finding] = [f for f in report["findings"] if f["rule"] == rule_id]
    assert finding["severity"] == "error"


def test_broken_helper_module_marks_every_rule_error(tmp_path: Path) -> None:
    rules = RuleSet.load(policy_copy(tmp_path, {"lib.rego": "package controlplane.compose.lib\n"
                                                            "x := {\n"}))
    report = evaluate({"services": {"a": {"image": "a"}}}, rules=rules)
    assert {c["result"] for c in report["matrix"]} == {"error"}
    assert report["passed"] is False


def test_revision_is_the_content_hash_and_bundles_are_cached(tmp_path: Path) -> None:
    first = RuleSet.load(policy_copy(tmp_path, {}))
    assert RuleSet.load(tmp_path / "compose") is first  # same content: compiled once
    assert first.revision == RuleSet.load(POLICY_DIR).revision  # content, not location, names it
    (tmp_path / "compose" / "privileged.rego").write_text(
        (POLICY_DIR / "privileged.rego").read_text() + "\n# edited\n")
    second = RuleSet.load(tmp_path / "compose")
    assert second.revision != first.revision and second is not first


def test_test_modules_are_not_rules(tmp_path: Path) -> None:
    rules = RuleSet.load(policy_copy(tmp_path, {"privileged_test.rego": "not rego at all"}))
    assert all(r.error is None for r in rules.rules)
