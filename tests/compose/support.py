"""Shared helpers of the compose tests ."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "compose"
CORPUS = Path(__file__).resolve().parents[3] / "shared" / "compose-corpus"

Check = Callable[..., dict[str, Any]]


def cell(report: dict[str, Any], service: str, rule: str) -> dict[str, Any]:
    """The matrix cell of ``service`` x ``rule``."""
    matches = [c for c in report["matrix"] if c["service"] == service and c["rule"] == rule]
    assert len(matches) == 1, (service, rule)
    return matches[0]
