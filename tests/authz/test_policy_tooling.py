"""``cpctl policy`` as a policy author meets it: no false greens, crash isolation, failures that
explain themselves, machine-readable reports, case scaffolding and coverage."""

from __future__ import annotations

import io
import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from service.cli.policy import run
from tests.authz.conftest import REPO, write_policy

ALLOW = (
    "package controlplane.authz\nimport rego.v1\n"
    'decision := {"decision": "allow", "reasons": ["ok"], "approval": {}} if input.action\n'
)

SHAPES = """\
package controlplane.authz_test

import rego.v1

import data.controlplane.authz

req(env) := {"action": "tasks.read", "env": env}

test_comparison if {
	d := authz.decision with input as req("dev")
	print("decided", d.decision)
	d.decision == "deny"
}

test_undefined if {
	d := authz.decision with input as req("dev")
	d.missing == 1
}

test_negation if {
	d := authz.decision with input as req("dev")
	not d.decision == "allow"
}

test_passes_with_input if {
	print("checking", input.env)
	authz.decision.decision == "allow" with input as req("dev")
}
"""


def call_json(*argv: str) -> tuple[int, dict]:
    """Machine-readable formats: stdout is the document alone (the header goes to stderr)."""
    out = io.StringIO()
    code = run(list(argv), out, io.StringIO())
    return code, json.loads(out.getvalue())


def call(*argv: str, stdin: str | None = None) -> tuple[int, str]:
    out = io.StringIO()
    err = io.StringIO()
    if stdin is not None:
        import sys

        old = sys.stdin
        sys.stdin = io.StringIO(stdin)
        try:
            code = run(list(argv), out, err)
        finally:
            sys.stdin = old
    else:
        code = run(list(argv), out, err)
    return code, out.getvalue() + err.getvalue()


@pytest.fixture(scope="module")
def shapes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_policy(tmp_path_factory.mktemp("shapes") / "p", ALLOW, tests=SHAPES)


# ---- 1. never a false green ----------------------------------------------------------------


def test_default_directory_is_the_working_directorys_policies(tmp_path, monkeypatch):
    """A failing ./policies is what `cpctl policy test` runs, not the repository's policies/."""
    write_policy(tmp_path / "policies", ALLOW,
                 tests="package t\nimport rego.v1\ntest_broken if { 1 == 2 }\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CONTROLPLANE_CONFIG", raising=False)
    monkeypatch.delenv("CONTROLPLANE_POLICIES_DIR", raising=False)
    code, out = call("test")
    assert code == 1, out
    assert f"policies: {tmp_path / 'policies'} (default ./policies)" in out
    assert "0 passed, 1 failed" in out
    code, out = call("lint")
    assert f"policies: {tmp_path / 'policies'}" in out


def test_configured_policies_dir_is_used(tmp_path, monkeypatch):
    root = write_policy(tmp_path / "elsewhere", ALLOW,
                        tests="package t\nimport rego.v1\ntest_ok if { true }\n")
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"policies:\n  dir: {root}\n")
    monkeypatch.chdir(tmp_path)
    code, out = call("test", "--config", str(cfg))
    assert code == 0 and f"policies: {root} (configured policies.dir)" in out


def test_a_directory_without_tests_is_not_green(tmp_path):
    root = write_policy(tmp_path / "p", ALLOW)
    code, out = call("test", str(root))
    assert code == 1 and "no tests found" in out


def test_lint_survives_an_engine_abort_and_still_reports(tmp_path):
    tests = (
        "package t\nimport rego.v1\nimport data.controlplane.authz\n"
        "test_crash if {\n  v := {\"action\": 1}\n  authz.decision with input as v\n"
        "  authz.decision with input as {\"action\": 2}\n}\n"
    )
    rego = (
        "package controlplane.authz\nimport rego.v1\nallowed if input.action\n"
        "x if { input.a == truee }\n"
        'decision := {"decision": "allow", "reasons": ["ok"], "approval": {}} if allowed\n'
    )
    root = write_policy(tmp_path / "p", rego, tests=tests)
    code, out = call("lint", str(root))
    assert code == 1
    assert "aborted" in out
    assert "authz_test.rego:6:3: with:" in out
    assert "authz.rego:4:19: unsafe-var: `truee`" in out


def test_lint_reports_unbound_unknown_refs_and_dead_rules_once_each(tmp_path):
    rego = ALLOW + (
        "a if { input.x == truee\n  data.nope.k == 1\n  data.controlplane.authz.missing }\n"
        "b if {\n  input.a == 1\n  input.a == 2\n}\n"
        "c if { false }\n"
        "ok(xs) := y if {\n  some k, v in xs\n  y := [z | some z in v]\n  data.environments[k]\n}\n"
    )
    root = write_policy(tmp_path / "p", rego)
    code, doc = call_json("lint", str(root), "--format", "json")
    assert code == 1
    problems = doc["problems"]
    got = {(p["line"], p["code"]) for p in problems}
    assert got == {(4, "unsafe-var"), (5, "unknown-ref"), (6, "unknown-ref"),
                   (9, "never-defined"), (11, "never-defined")}, problems
    assert len(problems) == 5


def test_shipped_policies_lint_clean():
    code, out = call("lint", str(REPO / "policies"))
    assert code == 0 and "0 problem(s)" in out


def test_check_runs_the_cases_even_when_a_unit_test_fails(tmp_path):
    root = write_policy(tmp_path / "p", ALLOW,
                        tests="package t\nimport rego.v1\ntest_bad if { 1 == 2 }\n")
    case = tmp_path / "case.yaml"
    doc = yaml.safe_load((REPO / "examples/decisions/reads/viewer-storage-prod.yaml").read_text())
    doc["expect"] = {"decision": "allow", "reasons": ["ok"]}
    case.write_text(yaml.safe_dump(doc))
    code, out = call("check", str(case), "--policies", str(root))
    assert code == 1
    assert "FAIL authz_test.rego:3 test_bad" in out and "unit tests: 0 passed, 1 failed" in out
    assert "case.yaml" in out and "1 passed, 0 failed" in out


# ---- 2. failures that explain themselves ------------------------------------------------------


def test_failures_name_the_expression_line_and_values(shapes):
    code, out = call("test", str(shapes))
    assert code == 1
    assert "3 passed" not in out and "1 passed, 3 failed" in out
    # comparison: both sides and the bound variable, plus print() output
    assert "authz_test.rego:12:2: expression is false or undefined: d.decision == \"deny\"" in out
    assert 'lhs: d.decision = "allow"' in out and "decided allow" in out
    # undefined reference
    assert "authz_test.rego:17:2: expression is false or undefined: d.missing == 1" in out
    assert "lhs: d.missing = undefined" in out
    # negation
    assert "authz_test.rego:22:2: expression is false or undefined: not d.decision" in out
    assert 'negated expression: d.decision == "allow" = true' in out


def test_run_selects_and_verbose_shows_print_output(shapes):
    code, out = call("test", str(shapes), "--run", "passes_with", "-v")
    assert code == 0, out
    assert "PASS authz_test.rego:25 test_passes_with_input" in out and "1 passed, 0 failed" in out
    assert "print output:\n    checking dev" in out  # the test ran under the input V
    _, quiet = call("test", str(shapes), "--run", "passes_with")
    assert "checking" not in quiet


def test_json_junit_and_github_formats(shapes):
    code, doc = call_json("test", str(shapes), "--format", "json")
    assert code == 1 and doc["failed"] == 3
    failing = {t["name"]: t for t in doc["tests"] if not t["passed"]}
    assert failing["test_undefined"]["location"] == "authz_test.rego:17:2"
    out = io.StringIO()
    only = ["--run", "undefined|passes"]
    assert run(["test", str(shapes), "--format", "junit", *only], out, io.StringIO()) == 1
    suite = ET.fromstring(out.getvalue())  # noqa: S314 (our own output)
    assert suite.get("failures") == "1" and suite.get("tests") == "2"
    code, out = call("test", str(shapes), "--format", "github", *only)
    assert f"::error file={shapes / 'authz_test.rego'},line=17,col=2" in out


def test_eval_flags_stdin_flat_and_parse_errors():
    case = (REPO / "examples/decisions/installer/ci-prod-denied.yaml").read_text()
    code, out = call("eval", "--input", "-", "--format", "flat", "--fail-on", "deny",
                     stdin=case)
    assert code == 1 and "decision=deny" in out and "reasons=no_grant" in out
    code, out = call("eval", "--input", "-", "--fail-on", "require_approval",
                     stdin=(REPO / "examples/decisions/installer/operator-prod.yaml").read_text())
    assert code == 1
    code, out = call("eval", "--input", "-", stdin='{"principal": {\n  "a": [1,\n}')
    assert code == 2 and "error: stdin:3:1:" in out


def test_explain_is_derived_by_the_engine_without_an_explain_rule(tmp_path):
    rego = (
        "package controlplane.authz\nimport rego.v1\n"
        "decision := {\"decision\": \"deny\", \"reasons\": reasons, \"approval\": {}} if {\n"
        "  reasons := [r | some r in denials]\n  count(reasons) > 0\n}\n"
        "denials contains \"no_grant\" if count(input.principal.grants) == 0\n"
        "denials contains \"prod_blocked\" if input.env == \"prod\"\n"
        "other if input.env == \"dev\"\n"
    )
    root = write_policy(tmp_path / "p", rego)
    case = str(REPO / "examples/decisions/installer/ci-prod-denied.yaml")
    _, result = call_json("eval", "--input", case, "--explain", "--policies", str(root))
    assert result["decision"] == "deny"
    explain = result["explain"]
    assert explain["reasons"]["prod_blocked"] == ["authz.rego:8 denials"]
    assert "authz.rego:3 decision" in explain["satisfied"]
    assert not any("other" in s for s in explain["satisfied"])
    assert "explain" not in explain  # the policy defines no explain rule


def test_case_new_scaffolds_a_case_that_check_accepts(tmp_path):
    target = tmp_path / "decisions" / "installer" / "alice-prod.yaml"
    code, out = call("case", "new", "--subject", "alice", "--action", "installer.run.execute",
                     "--env", "prod", "--out", str(target), "--policies", str(REPO / "policies"))
    assert code == 0, out
    doc = yaml.safe_load(target.read_text())
    assert doc["input"]["principal"]["kind"] == "human"
    assert doc["expect"] == {"decision": "require_approval", "reasons": ["production_mutation"]}
    code, out = call("check", str(target), "--skip-tests", "--policies", str(REPO / "policies"))
    assert code == 0 and "1 passed, 0 failed" in out
    code, out = call("case", "new", "--subject", "alice", "--action", "nope.x", "--env", "prod")
    assert code == 2 and "unknown action" in out


# ---- 3. coverage -------------------------------------------------------------------------


def test_shipped_coverage_is_reported_exported_and_above_90(tmp_path):
    lcov = tmp_path / "cov.info"
    code, out = call("test", str(REPO / "policies"), "--coverage", "--coverage-out", str(lcov),
                     "--cases", str(REPO / "examples" / "decisions"), "--fail-under", "90")
    assert code == 0, out
    assert "authz.rego: clauses" in out and "measured over:" in out
    text = lcov.read_text()
    assert "SF:authz.rego" in text and "end_of_record" in text and "FNDA:1," in text
    xml_out = tmp_path / "cov.xml"
    code, _ = call("check", "--skip-tests", str(REPO / "examples" / "decisions"),
                   "--policies", str(REPO / "policies"), "--coverage",
                   "--coverage-out", str(xml_out))
    assert code == 0
    assert ET.parse(xml_out).getroot().tag == "coverage"  # noqa: S314 (our own output)


def test_coverage_names_what_is_not_exercised_and_fails_under_threshold(tmp_path):
    root = tmp_path / "p"
    shutil.copytree(REPO / "policies", root, ignore=shutil.ignore_patterns("compose"))
    (root / "authz_test.rego").write_text(
        "package controlplane.authz_test\nimport rego.v1\nimport data.controlplane.authz\n"
        "test_one if { authz.decide({\"principal\": {\"subject_id\": \"a\", \"kind\": \"human\"},"
        " \"action\": \"tasks.read\", \"env\": \"dev\", \"resource\": {}, \"context\": {}})"
        ".decision == \"deny\" }\n"
    )
    out_json = tmp_path / "cov.json"
    code, out = call("test", str(root), "--coverage", "--fail-under", "90",
                     "--cases", str(tmp_path / "none"), "--coverage-out", str(out_json))
    assert code == 2 and "decision cases not found" in out
    (tmp_path / "no-cases").mkdir()
    code, out = call("test", str(root), "--coverage", "--fail-under", "90",
                     "--coverage-out", str(out_json), "--cases", str(tmp_path / "no-cases"))
    assert code == 1
    assert "not covered: authz.rego:" in out and "under 90" in out
    doc = json.loads(out_json.read_text())
    assert doc["clauses"]["percent"] < 90
    assert any(u["rule"] == "review_denials" or u["rule"] == "needs_approval"
               for u in doc["files"]["authz.rego"]["uncovered_clauses"])


UNDEFINED_CALL = ALLOW + (
    "pre_release(v) if regex.match(`-rc`, v)\n"
    "gate if {\n  is_pre_release(input.resource.value.version)\n}\n"
    "other if { strings.nope(input.env) }\n"
    "fine if { pre_release(input.env); count(input.env) > 0; print(input.env) }\n"
)
UNDEFINED_CALL_TESTS = (
    "package t\nimport rego.v1\nimport data.controlplane.authz\n"
    'test_ok if { authz.decision.decision == "allow" with input as {"action": "x"} }\n'
)


def test_lint_flags_a_call_to_an_undefined_function(tmp_path):
    root = write_policy(tmp_path / "p", UNDEFINED_CALL, tests=UNDEFINED_CALL_TESTS)
    code, doc = call_json("lint", str(root), "--format", "json")
    assert code == 1
    got = {(p["file"], p["line"], p["col"], p["code"]) for p in doc["problems"]}
    assert got == {("authz.rego", 6, 3, "undefined-function"),
                   ("authz.rego", 8, 12, "undefined-function")}, doc["problems"]
    messages = " ".join(p["message"] for p in doc["problems"])
    assert "`is_pre_release`" in messages and "`strings.nope`" in messages


def test_policy_test_refuses_to_run_what_lint_finds_unsafe(tmp_path):
    """An unbound variable (a typo) would make its rule silently undefined, and the tests then
    report "N passed, 1 failed" about something else: the runner refuses, with file:line."""
    rego = ALLOW + "x if { input.a == truee }\n"
    root = write_policy(tmp_path / "p", rego, tests=UNDEFINED_CALL_TESTS)
    code, out = call("test", str(root))
    assert code == 2, out
    assert "authz.rego:4:19: unsafe-var: `truee`" in out
    assert "passed" not in out
    root = write_policy(tmp_path / "q", UNDEFINED_CALL, tests=UNDEFINED_CALL_TESTS)
    code, out = call("test", str(root))
    assert code == 2 and "authz.rego:6:3: undefined-function: `is_pre_release`" in out, out


VAR_INPUT_POLICY = (
    "package controlplane.authz\nimport rego.v1\n"
    "pre if regex.match(`-rc`, input.resource.value.version)\n"
    'decision := {"decision": "deny", "reasons": ["pre"], "approval": {}} if pre\n'
    'else := {"decision": "allow", "reasons": ["ok"], "approval": {}}\n'
)
VAR_INPUT_TESTS = """\
package t

import rego.v1

import data.controlplane.authz

test_input_from_a_variable if {
	v := {"action": "x", "resource": {"value": {"version": "1.0.0-rc"}}}
	authz.decision.reasons == ["pre"] with input as v
}

test_input_built_in_steps if {
	base := {"action": "x", "resource": {"value": {"version": "1.0.0"}}}
	v := object.union(base, {"env": "dev"})
	d := authz.decision with input as v
	d.decision == "allow"
}

test_input_from_a_variable_fails_where_it_should if {
	v := {"action": "x", "resource": {"value": {"version": "2.0.0-rc"}}}
	d := authz.decision with input as v
	d.decision == "allow"
}
"""


def test_with_input_as_a_test_variable_works(tmp_path):
    """The most common OPA testing idiom: the input bound to a variable of the test first."""
    root = write_policy(tmp_path / "p", VAR_INPUT_POLICY, tests=VAR_INPUT_TESTS)
    code, doc = call_json("test", str(root), "--format", "json")
    results = {t["name"]: t["passed"] for t in doc["tests"]}
    assert results == {"test_input_from_a_variable": True, "test_input_built_in_steps": True,
                       "test_input_from_a_variable_fails_where_it_should": False}, doc
    assert code == 1
    failed = next(t for t in doc["tests"] if not t["passed"])
    assert "aborted" not in json.dumps(failed)
    code, out = call("lint", str(root))
    assert code == 0 and "with" not in out.split("\n", 1)[1], out
