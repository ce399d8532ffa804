"""Shared helpers of the compose tests."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from service.compose.preflight import POLICY_DIR

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "compose"
CORPUS = Path(__file__).resolve().parents[3] / "shared" / "compose-corpus"

Check = Callable[..., dict[str, Any]]


def cell(report: dict[str, Any], service: str, rule: str) -> dict[str, Any]:
    """The matrix cell of ``service`` x ``rule``."""
    matches = [c for c in report["matrix"] if c["service"] == service and c["rule"] == rule]
    assert len(matches) == 1, (service, rule)
    return matches[0]


def policy_copy(tmp_path: Path, extra: dict[str, str]) -> Path:
    target = tmp_path / "compose"
    shutil.copytree(POLICY_DIR, target)
    for name, text in extra.items():
        (target / name).write_text(text)
    return target


#: A rule whose two complete definitions conflict: an evaluation error whenever there is a service.
RUNTIME_CONFLICT = """package controlplane.compose.rules.conflict

import rego.v1

meta := {"id": "conflict", "title": "t", "severity": "fail", "rationale": "r", "remediation": "m"}

# Two different values for one complete rule: an evaluation error whenever there is a service.
pick := 1 if count(input.fields.services) > 0
pick := 2 if count(input.fields.services) > 0

findings contains {"service": name, "message": "x", "pointer": ""} if {
	some name, _ in input.fields.services
	pick == 1
}
"""
