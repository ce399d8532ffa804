"""Long strings in every position of a compose file: ``cpctl compose check`` answers.

regopy's regular expressions recurse once per byte a repetition consumes and overflow the
stack at ~26,000 bytes (8 MiB stack), killing the process (SIGSEGV) where no exception handler
sees it; the rules test a string's length before any regex (policies/compose/README.md,
"Untrusted strings and regular expressions"). The CLI runs the rules in its own process, so the
bound is its whole protection: every shape that made a rule's pattern repeat, in every string
position, from 1 KB to 1 MB.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.compose.long_values import documents, every_pair, rotation
from tests.compose.support import REPO, cell


def _escaped(value: Any) -> Any:
    """``value`` as compose file text must hold it: ``$`` starts an interpolation."""
    if isinstance(value, str):
        return value.replace("$", "$$")
    if isinstance(value, dict):
        return {key: _escaped(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_escaped(item) for item in value]
    return value


def _check(path: Path) -> tuple[int, str, str]:
    proc = subprocess.run(
        [sys.executable, "-m", "service", "compose", "check", str(path), "--format", "json"],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    return proc.returncode, proc.stdout, proc.stderr


@pytest.mark.parametrize(("length", "pairs", "max_bytes"), [
    pytest.param(1_000, every_pair(), 4_000_000, id="1KB-every-shape"),
    pytest.param(30_000, every_pair(), 4_000_000, id="30KB-every-shape"),
    pytest.param(1_000_000, rotation(), 12_000_000, id="1MB"),
])
def test_cpctl_compose_check_answers_for_long_strings_everywhere(tmp_path, length, pairs,
                                                                   max_bytes):
    for n, (ids, fields) in enumerate(documents(length, max_bytes, pairs)):
        path = tmp_path / f"doc{n}.compose.yaml"
        path.write_text(yaml.safe_dump(_escaped(fields), width=float("inf")), encoding="utf-8")
        code, out, err = _check(path)
        assert code in (0, 1), (ids, code, err[-500:])  # never killed by a signal (-11)
        report = json.loads(out)
        assert report["summary"]["rules"] > 0 and report["summary"]["error"] == 0, ids


def test_a_long_secret_value_fails_as_a_secret(tmp_path):
    """The issue's case: a 30,000-character DB_PASSWORD is a literal secret, found by the
    rule's cheap check (no regex) since the value is over its bound."""
    path = tmp_path / "compose.yaml"
    path.write_text(yaml.safe_dump({"services": {"db": {
        "image": "postgres:16", "environment": {"DB_PASSWORD": "x" * 30_000}}}}))
    code, out, err = _check(path)
    assert code == 1, err[-500:]
    assert cell(json.loads(out), "db", "secret-env")["result"] == "fail"


MAX_MATCH = 2048  # policies/compose/lib.rego: max_match


def _finding(report: dict[str, Any], rule: str) -> dict[str, Any]:
    found = [f for f in report["findings"] if f["rule"] == rule]
    assert len(found) == 1, found
    return found[0]


@pytest.mark.parametrize(("environment", "severity", "message"), [
    pytest.param({"DB_PASSWORD": "x" * 30_000}, "fail", "holds a literal secret value",
                 id="secret-name"),
    pytest.param({"FOO": "eyJ" + "a" * 30_000 + ".eyJaaaaaaaaaaaa."}, "fail",
                 "holds a value too long to inspect (over 2048 characters) with a credential",
                 id="jwt-shaped"),
    pytest.param({"FOO": "https://user:" + "p" * 30_000 + "@host"}, "fail",
                 "holds a value too long to inspect", id="url-credentials"),
    pytest.param({"FOO": "x" * 30_000}, None, None, id="no-marker"),
    pytest.param({"FOO": "-----BEGIN CERTIFICATE-----" + "A" * 30_000}, None, None,
                 id="certificate-bundle"),
    pytest.param({"K" * 30_000: "1"}, "fail", "has a name too long to inspect", id="long-name"),
    pytest.param({"FOO": "sk-" + "a" * (MAX_MATCH - 3)}, "fail",
                 "holds a value that looks like a credential", id="at-the-bound-inspected"),
])
def test_secret_env_over_the_bound_gets_a_cheap_check_or_an_explicit_finding(
        check, environment, severity, message):
    report = check({"web": {"image": "a:1", "environment": environment}})
    if severity is None:
        assert cell(report, "web", "secret-env")["result"] == "pass"
        return
    found = _finding(report, "secret-env")
    assert found["severity"] == severity and message in found["message"], found["message"][:200]


def test_long_paths_and_images_are_judged_without_a_regex(check):
    report = check({"web": {
        "image": "a" * 30_000 + "socket-proxy",  # not a known proxy: the socket stays fail
        "volumes": [{"type": "bind", "source": "/etc/" + "a" * 30_000, "target": "/x"},
                    {"type": "bind", "source": "/var/run/docker.sock", "target": "/s",
                     "read_only": True}],
        "devices": [{"source": "/dev/sd" + "a" * 30_000, "target": "/dev/x"}]}})
    mounts = [f for f in report["findings"] if f["rule"] == "sensitive-mounts"]
    assert sorted(f["severity"] for f in mounts) == ["fail", "fail"]
    assert any(f["message"].startswith("sensitive host path /etc/aaa") for f in mounts)
    assert _finding(report, "devices")["severity"] == "fail"


POLICIES = REPO / "policies"
_CALL = re.compile(r"\b(regex|glob)\.[a-z_]+\(")


def test_every_regex_of_the_policies_is_behind_the_length_bound():
    """A top-level rule of policies/compose that calls a regex builtin tests lib.matchable in
    it (or says where its caller did: ``# bounded: ...``); the authz policy, which sees the
    request (input.resource.value), calls none."""
    unguarded, calls = [], 0
    for path in sorted((POLICIES / "compose").glob("*.rego")):
        if path.name.endswith("_test.rego"):
            continue
        for statement in re.split(r"\n(?=\S)", path.read_text(encoding="utf-8")):
            if statement.startswith("#") or not _CALL.search(statement):
                continue
            calls += 1
            if "lib.matchable(" not in statement and "# bounded: " not in statement:
                unguarded.append(f"{path.name}: {statement.splitlines()[0]}")
    assert calls >= 6 and not unguarded, unguarded
    for path in sorted(POLICIES.glob("*.rego")):
        if not path.name.endswith("_test.rego"):
            assert not _CALL.search(path.read_text(encoding="utf-8")), path.name
