"""Decision cases (``examples/decisions/<topic>/<case>.yaml``): one loader, CLI and pytest."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from service import schemas
from service.authz.decision import Decision

__all__ = ["CASE_SCHEMA", "Case", "CaseError", "load_cases"]

CASE_SCHEMA = "policy-case.schema.json"
SCHEMA_HEADER = "# yaml-language-server: $schema=../../../schemas/policy-case.schema.json"


class CaseError(Exception):
    """A case file cannot be read or does not match policy-case.schema.json."""


@dataclass(frozen=True)
class Case:
    """One case; ``id`` is its path relative to the cases root (``topic/case.yaml``)."""

    id: str
    note: str
    input: Mapping[str, Any]
    decision: str
    reasons: tuple[str, ...] | None
    #: Approval requirements the decision must carry (only the members named).
    approval: Mapping[str, Any] | None = None

    def mismatch(self, actual: Decision) -> str | None:
        """None when ``actual`` satisfies the case, else what differs."""
        if actual.decision != self.decision:
            return f"decision {actual.decision} != {self.decision}"
        if self.reasons is not None and tuple(actual.reasons) != self.reasons:
            return f"reasons {list(actual.reasons)} != {list(self.reasons)}"
        if self.approval is not None:
            have = actual.to_dict()["approval"] or {}
            for name, want in self.approval.items():
                if have.get(name) != want:
                    return f"approval.{name} {have.get(name)!r} != {want!r}"
        return None


def load_cases(root: Path) -> list[Case]:
    """Every ``*.yaml``/``*.yml`` under ``root`` (sorted), validated; errors name the file."""
    root = Path(root)
    if root.is_file():
        return [_load(root, root.name)]
    files = sorted(p for p in root.rglob("*") if p.suffix in (".yaml", ".yml") and p.is_file())
    return [_load(p, p.relative_to(root).as_posix()) for p in files]


def _load(path: Path, case_id: str) -> Case:
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise CaseError(f"{case_id}: cannot read: {exc.__class__.__name__}") from None
    try:
        schemas.validate(CASE_SCHEMA, doc)
    except schemas.ValidationFailed as exc:
        detail = "; ".join(f"{v.pointer or '/'} {v.message}" for v in exc.violations[:5])
        raise CaseError(f"{case_id}: {detail}") from None
    expect = doc["expect"]
    reasons = expect.get("reasons")
    return Case(
        case_id,
        doc["note"],
        doc["input"],
        expect["decision"],
        None if reasons is None else tuple(reasons),
        expect.get("approval"),
    )


def ids(cases: Iterable[Case]) -> list[str]:
    return [c.id for c in cases]
