"""``cpctl policy`` subcommands through ``run(argv)``: exit codes and what they print."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

from service.cli.policy import run
from tests.authz.conftest import REPO, write_policy


def call(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    code = run(list(argv), out)
    return code, out.getvalue()


def test_policy_test_passes_shipped():
    code, out = call("test", "-v")
    assert code == 0
    assert out.count("PASS authz_test.rego:") >= 20
    assert out.strip().endswith("0 failed")


def test_policy_test_reports_failures(tmp_path):
    root = write_policy(
        tmp_path / "p",
        "package controlplane.authz\nimport rego.v1\ndecision := 1\n",
        tests="package t\nimport rego.v1\ntest_good if { 1 == 1 }\ntest_bad if { 1 == 2 }\n",
    )
    code, out = call("test", str(root))
    assert code == 1
    assert "FAIL authz_test.rego:4 test_bad" in out and "1 passed, 1 failed" in out


def test_policy_test_attributes_a_native_crash(tmp_path):
    # Two different `with input` values in one test cannot be rewritten: evaluated as written,
    # they abort regopy 1.5; only that test fails, named, and the others report their results.
    crashing = (
        "package t\nimport rego.v1\na := 1 if input.x == 1\nb := 1 if a == 1\n"
        'test_crash if { v := {"x": 1}; b == 1 with input as v; b == 1 with input as {"x": 2} }'
        '\ntest_fine if { true }\n'
    )
    root = write_policy(
        tmp_path / "p", "package controlplane.authz\ndecision := 1\n", tests=crashing
    )
    code, out = call("test", str(root), "-v")
    assert code == 1
    assert "FAIL authz_test.rego:5 test_crash" in out and "the engine aborted" in out
    assert "authz_test.rego:5:" in out and "with input as" in out
    assert "PASS authz_test.rego:6 test_fine" in out and "1 passed, 1 failed" in out


def test_policy_check_shipped_cases():
    code, out = call("check", str(REPO / "examples" / "decisions"))
    assert code == 0, out
    assert "MISMATCH" not in out
    passed = int(out.strip().splitlines()[-1].split()[0])
    assert passed >= 25


def test_policy_check_reports_mismatch(tmp_path):
    root = write_policy(
        tmp_path / "p",
        "package controlplane.authz\nimport rego.v1\n"
        'decision := {"decision": "deny", "reasons": ["nope"], "approval": {}}\n',
    )
    code, out = call(
        "check", str(REPO / "examples" / "decisions" / "reads"), "--policies", str(root)
    )
    assert code == 1 and "MISMATCH" in out


def test_policy_eval_prints_the_service_decision():
    code, out = call(
        "eval", "--input", str(REPO / "examples/decisions/installer/operator-prod.yaml")
    )
    assert code == 0
    result = json.loads(out)
    assert result["decision"] == "require_approval"
    assert result["approval"]["require_groups"] == ["sre-approvers"]


def test_policy_eval_explain_shows_projection_and_rules():
    _, out = call(
        "eval",
        "--explain",
        "--input",
        str(REPO / "examples/decisions/agents/agent-never-reviews.yaml"),
    )
    result = json.loads(out)
    assert result["explain"]["input"]["principal"]["roles"] == ["agent"]
    assert result["explain"]["explain"]["denials"] == ["reviewer_not_human", "no_grant"]


def test_policy_eval_rejects_invalid_input(tmp_path):
    bad = tmp_path / "in.json"
    bad.write_text(
        json.dumps({"principal": {"subject_id": "a", "kind": "robot", "roles": ["admin"]}})
    )
    code, out = call("eval", "--input", str(bad))
    assert code == 2
    assert "input/principal/kind" in out and "input/principal" in out


def test_policy_eval_applies_the_production_upgrade(tmp_path):
    root = write_policy(
        tmp_path / "p",
        "package controlplane.authz\nimport rego.v1\n"
        'decision := {"decision": "allow", "reasons": ["yes"], "approval": {}}\n',
    )
    code, out = call(
        "eval",
        "--policies",
        str(root),
        "--input",
        str(REPO / "examples/decisions/installer/operator-prod.yaml"),
    )
    assert code == 0 and json.loads(out)["decision"] == "require_approval"


def test_policy_lint_clean():
    code, out = call("lint")
    assert code == 0 and "0 problem(s)" in out


def test_policy_lint_reports_line_and_column(tmp_path):
    root = write_policy(
        tmp_path / "p",
        "package controlplane.authz\nimport rego.v1\n\ndecision := 1 if {\n  input.x == \n}\n",
    )
    code, out = call("lint", str(root))
    assert code == 1
    assert "authz.rego:5:11: compile: Invalid boolean operator" in out


def test_policy_lint_accepts_with_input_the_runner_rewrites_and_flags_the_rest(tmp_path):
    root = write_policy(
        tmp_path / "p",
        "package controlplane.authz\ndecision := 1\n",
        tests="package t\nimport rego.v1\ntest_x if { 1 == 1 with input as {} }\n"
        "test_y if {\n  v := {}\n  1 == 1 with input as v\n  2 == 2 with input as {}\n}\n"
        "test_z if { 1 == 1 with data.environments as {} }\n"
        "test_v if {\n  v := {}\n  1 == 1 with input as v\n}\n",
    )
    code, out = call("lint", str(root))
    assert code == 1
    assert "authz_test.rego:3:" not in out
    assert "authz_test.rego:6:3: with:" in out
    assert "authz_test.rego:9:13: with: `with data.environments as` is evaluated as written" in out
    assert "authz_test.rego:12:" not in out  # a test variable bound first: rewritten


def test_the_cpctl_entry_point_runs_every_policy_subcommand(tmp_path):
    """Through the real ``cpctl`` program (not ``run``): exit codes and output reach the shell."""
    cpctl = [sys.executable, "-m", "service"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    broken = write_policy(tmp_path / "p", "package controlplane.authz\ndecision := {\n")
    cases = {
        ("policy", "test"): (0, "0 failed"),
        ("policy", "check"): (0, "0 failed"),
        ("policy", "lint"): (0, "0 problem(s)"),
        ("policy", "lint", str(broken)): (1, "authz.rego:"),
        ("policy", "eval", "--input", str(REPO / "examples/decisions/reads/viewer-storage-prod.yaml")): (
            0,
            '"decision": "allow"',
        ),
    }
    for argv, (code, text) in cases.items():
        proc = subprocess.run(
            [*cpctl, *argv], capture_output=True, text=True, cwd=REPO, env=env, timeout=120
        )
        assert proc.returncode == code, (argv, proc.stdout, proc.stderr)
        assert text in proc.stdout, (argv, proc.stdout)
        assert "Traceback" not in proc.stderr, (argv, proc.stderr)
