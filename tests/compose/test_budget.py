"""Evaluation cost: every rule is linear in the size of the document (issue 17).

regopy builds sets in quadratic time, so the rules build arrays; the timing bounds here are
generous safety nets (a quadratic rule took 15 s for the 500-service file, minutes for 8,000
findings), never tight measurements.
"""

from __future__ import annotations

import io
import json
import re
import time
from pathlib import Path

import pytest

from service.cli import compose as compose_cli
from service.compose.normalize import NormalizeError, normalize_text
from service.compose.preflight import (
    CHUNK_SERVICES,
    MAX_ITEMS,
    MAX_SERVICES,
    POLICY_DIR,
    ComposeTooLarge,
    EvaluationBudgetExceeded,
    RuleSet,
    evaluate,
)
from tests.compose.support import Check

SAFETY_NET_S = 60.0  # wall-clock on a shared 2-core box; the CPU budget is 10 s


def busy_service(index: int) -> dict[str, object]:
    """A service with a finding from most rules (2 ports, 2 caps, 2 env secrets)."""
    return {"image": "nginx", "restart": "always", "cap_add": ["NET_ADMIN", "CHOWN"],
            "ports": [{"target": 80, "published": str(8000 + index), "protocol": "tcp",
                       "mode": "ingress"},
                      {"target": 443, "protocol": "tcp", "mode": "ingress"}],
            "environment": {"DB_PASSWORD": "hunter2hunter2", "OTHER": "AKIA" + "A" * 16}}


def test_no_rule_builds_findings_as_a_set() -> None:
    """``findings contains`` / ``not_applicable contains`` are quadratic in regopy."""
    for path in sorted(POLICY_DIR.glob("*.rego")):
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"^(findings|not_applicable) contains", text, re.M), path.name
        assert not re.search(r"^(findings|not_applicable) := \{", text, re.M), path.name


def test_500_services_are_answered_within_the_budget_by_the_cli(tmp_path: Path) -> None:
    """``cpctl compose check`` on a 500-service file (each with findings from most rules and a
    65,535-port range) answers within the default budget."""
    import yaml

    services = {f"svc{i}": {"image": "nginx", "cap_add": ["NET_ADMIN"],
                            "ports": ["1-65535:1-65535"],
                            "environment": {"DB_PASSWORD": "hunter2hunter2"}}
                for i in range(500)}
    path = tmp_path / "big.yaml"
    path.write_text(yaml.safe_dump({"services": services}))
    out, err = io.StringIO(), io.StringIO()
    started = time.perf_counter()
    code = compose_cli.run(["check", str(path), "--env", "prod", "--format", "json"],
                           stdout=out, stderr=err, environ={})
    elapsed = time.perf_counter() - started
    assert code == 1, err.getvalue()
    report = json.loads(out.getvalue())
    assert report["summary"]["services"] == 500
    per_service = [f for f in report["findings"] if f["service"] == "svc7"]
    assert {f["rule"] for f in per_service} >= {"published-ports", "capabilities", "secret-env",
                                               "image-pinning", "healthcheck"}
    assert elapsed < SAFETY_NET_S, elapsed  # the CPU budget is what refuses; this is a net


def test_repeated_findings_are_reported_once(check: Check) -> None:
    # Two mounts of the same named volume at the same target: one finding, as a set would give.
    mount = {"type": "volume", "source": "etc", "target": "/host"}
    report = check({"web": {"image": "a:1", "volumes": [mount, mount]}},
                   volumes={"etc": {"driver_opts": {"type": "none", "o": "bind",
                                                    "device": "/etc"}}})
    mounts = [f for f in report["findings"] if f["rule"] == "sensitive-mounts"]
    assert len(mounts) == 1, mounts


def test_a_65535_port_range_is_one_entry_and_one_finding(rules: RuleSet) -> None:
    text = "services:\n  web:\n    image: nginx\n    ports: ['1-65535:1-65535', '7000-7002']\n"
    started = time.perf_counter()
    fields = normalize_text(text)
    report = evaluate(fields, rules=rules)
    elapsed = time.perf_counter() - started
    assert len(fields["services"]["web"]["ports"]) == 2
    ports = [f for f in report["findings"] if f["rule"] == "published-ports"]
    assert [f["message"] for f in ports] == [
        "port 1-65535/tcp published on all interfaces as 1-65535",
        "port 7000-7002/tcp published on all interfaces as an ephemeral port"]
    assert [f["pointer"] for f in ports] == ["/services/web/ports/0", "/services/web/ports/1"]
    assert elapsed < SAFETY_NET_S, elapsed


def test_a_port_over_65535_is_refused() -> None:
    with pytest.raises(NormalizeError, match="over 65535"):
        normalize_text("services:\n  web:\n    ports: ['65530-65540:65530-65540']\n")


def test_over_the_size_budget_is_refused_before_evaluation(rules: RuleSet) -> None:
    with pytest.raises(ComposeTooLarge, match="1001 services"):
        evaluate({"services": {f"s{i}": {"image": "a:1"} for i in range(MAX_SERVICES + 1)}},
                 rules=rules)
    env = {f"K{i}": "v" for i in range(MAX_ITEMS + 1)}
    with pytest.raises(ComposeTooLarge, match="list and map entries"):
        evaluate({"services": {"web": {"image": "a:1", "environment": env}}}, rules=rules)


def test_cli_prints_the_refusal_and_exits_2(tmp_path: Path) -> None:
    lines = ["services:"] + [f"  s{i}:\n    image: a:1" for i in range(MAX_SERVICES + 1)]
    path = tmp_path / "big.yaml"
    path.write_text("\n".join(lines) + "\n")
    out, err = io.StringIO(), io.StringIO()
    code = compose_cli.run(["check", str(path)], stdout=out, stderr=err, environ={})
    assert code == 2
    assert "compose_too_large" in err.getvalue() and out.getvalue() == ""


def test_over_the_time_budget_stops_between_chunks(rules: RuleSet) -> None:
    fields = {"services": {f"svc{i}": busy_service(i) for i in range(2 * CHUNK_SERVICES + 1)}}
    started = time.perf_counter()
    with pytest.raises(EvaluationBudgetExceeded, match=r"of 41 services evaluated"):
        evaluate(fields, env="prod", rules=rules, budget_s=0.01, cache=False)
    assert time.perf_counter() - started < SAFETY_NET_S
    # The same document within its budget: every chunk's findings are in the one report.
    report = evaluate(fields, env="prod", rules=rules, budget_s=None, cache=False)
    assert {f["service"] for f in report["findings"]} == set(fields["services"])
    assert report["summary"]["cells"] == 41 * len(rules.rules)


def test_reports_are_cached_by_fields_env_and_strict(rules: RuleSet) -> None:
    fields = {"services": {"web": busy_service(1)}}
    first = evaluate(fields, env="prod", rules=rules)
    hits = rules.reports.hits
    again = evaluate(fields, env="prod", rules=rules)
    assert again == first and rules.reports.hits == hits + 1
    assert evaluate(fields, env="prod", rules=rules, cache=False) == first  # what a hit saves
    other = evaluate(fields, env="dev", rules=rules)
    strict = evaluate(fields, env="prod", strict=True, rules=rules)
    assert other["env"] == "dev" and strict["strict"] is True
    assert rules.reports.hits == hits + 1


def test_cli_port_range_and_time_budget(tmp_path: Path) -> None:
    path = tmp_path / "range.yaml"
    path.write_text("services:\n  web:\n    image: nginx:1\n    ports: ['1-65535:1-65535']\n")
    out, err = io.StringIO(), io.StringIO()
    # (warnings only, since no memory limit is a warning: --strict makes them fail)
    assert compose_cli.run(["check", str(path), "--format", "json", "--strict"], stdout=out,
                           stderr=err, environ={}) == 1
    report = json.loads(out.getvalue())
    assert [f["message"] for f in report["findings"] if f["rule"] == "published-ports"] == [
        "port 1-65535/tcp published on all interfaces as 1-65535"]

    lines = ["services:"] + [f"  s{i}:\n    image: a:1\n    ports: ['1-65535:1-65535']"
                             for i in range(300)]
    big = tmp_path / "big.yaml"
    big.write_text("\n".join(lines) + "\n")
    out, err = io.StringIO(), io.StringIO()
    code = compose_cli.run(["check", str(big), "--budget", "0.01"], stdout=out, stderr=err,
                           environ={})
    assert code == 2 and out.getvalue() == ""
    assert "evaluation_budget_exceeded" in err.getvalue()
