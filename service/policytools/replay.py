"""Replay: re-decide recorded decisions against a candidate revision; report what would change.

Sources of recorded decisions:
- the decision log (``decisionlog.py``): exact, the input is the one the chain built;
- decision cases (``examples/decisions``): exact, the expected decision is the recorded one;
- audit records (JSON lines of ``{"seq", "entry", ...}`` or bare entries): approximate, an
  audit entry keeps the principal's subject and kind, the action, env and resource kind, not the
  whole input (no resource id or owner, no step-up), so policies that read those may differ.

A change is a different ``decision`` (``allow->deny`` ...); a same decision with other reasons
is counted apart and is not a change. An ``--expect`` file lists the changes a rollout intends;
a change it does not list fails the replay.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from service.authz.decision import Decision
from service.authz.decisionlog import read_records
from service.policytools.cases import load_cases

__all__ = [
    "Change",
    "Expectation",
    "Recorded",
    "ReplayError",
    "ReplayReport",
    "from_audit",
    "from_cases",
    "from_log",
    "load_expectations",
    "replay",
]


class ReplayError(Exception):
    """A source or an expect file cannot be read."""


@dataclass(frozen=True)
class Recorded:
    source: str  # file:line or case id
    ts: str | None
    ref: str  # decision id, correlation id or case id
    input: Mapping[str, Any]
    decision: str
    reasons: tuple[str, ...]
    exact: bool = True

    @property
    def subject(self) -> str:
        p = self.input.get("principal")
        return str(p.get("subject_id")) if isinstance(p, Mapping) else ""


@dataclass(frozen=True)
class Change:
    recorded: Recorded
    decision: str
    reasons: tuple[str, ...]

    @property
    def transition(self) -> str:
        return f"{self.recorded.decision}->{self.decision}"

    def to_json(self) -> dict[str, Any]:
        r = self.recorded
        return {
            "transition": self.transition, "source": r.source, "ref": r.ref, "ts": r.ts,
            "subject": r.subject, "action": r.input.get("action"), "env": r.input.get("env"),
            "recorded": {"decision": r.decision, "reasons": list(r.reasons)},
            "candidate": {"decision": self.decision, "reasons": list(self.reasons)},
            "exact": r.exact,
        }


@dataclass(frozen=True)
class Expectation:
    """One intended change: ``transition`` (``allow->deny``; ``*`` wildcards) and optional
    ``subject``/``action``/``env`` globs, and an optional exact ``count``."""

    transition: str
    subject: str = "*"
    action: str = "*"
    env: str = "*"
    count: int | None = None

    def matches(self, change: Change) -> bool:
        r = change.recorded
        return (
            fnmatch.fnmatchcase(change.transition, self.transition)
            and fnmatch.fnmatchcase(r.subject, self.subject)
            and fnmatch.fnmatchcase(str(r.input.get("action")), self.action)
            and fnmatch.fnmatchcase(str(r.input.get("env")), self.env)
        )

    def describe(self) -> str:
        parts = [self.transition]
        parts += [f"{k}={v}" for k, v in (("subject", self.subject), ("action", self.action),
                                           ("env", self.env)) if v != "*"]
        return " ".join(parts)


@dataclass
class ReplayReport:
    total: int = 0
    same: int = 0
    reasons_only: int = 0
    changes: list[Change] = field(default_factory=list)
    unexpected: list[Change] = field(default_factory=list)
    count_mismatches: list[str] = field(default_factory=list)
    skipped: int = 0

    @property
    def ok(self) -> bool:
        return not self.unexpected and not self.count_mismatches

    def groups(self) -> dict[str, list[Change]]:
        out: dict[str, list[Change]] = {}
        for c in self.changes:
            out.setdefault(c.transition, []).append(c)
        return dict(sorted(out.items(), key=lambda kv: (-len(kv[1]), kv[0])))

    def to_json(self, examples: int = 5) -> dict[str, Any]:
        return {
            "total": self.total, "unchanged": self.same, "reasons_only": self.reasons_only,
            "changed": len(self.changes), "skipped": self.skipped,
            "groups": {t: {"count": len(cs), "examples": [c.to_json() for c in cs[:examples]]}
                       for t, cs in self.groups().items()},
            "changes": [c.to_json() for c in self.changes],
            "unexpected": [c.to_json() for c in self.unexpected],
            "count_mismatches": self.count_mismatches,
            "ok": self.ok,
        }


def _since_ok(ts: str | None, since: datetime | None) -> bool:
    if since is None:
        return True
    if ts is None:
        return False
    try:
        when = datetime.fromisoformat(ts.replace("Z", "+00:00"))
    except ValueError:
        return False
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when >= since


def from_log(path: Path, since: datetime | None = None) -> list[Recorded]:
    """Records of a decision log file (and its rotated backups)."""
    out: list[Recorded] = []
    try:
        for lineno, doc in read_records(path):
            result = doc.get("result")
            inp = doc.get("input")
            if not isinstance(result, Mapping) or not isinstance(inp, Mapping):
                raise ReplayError(f"{path}:{lineno}: not a decision log record")
            if not _since_ok(doc.get("ts"), since):
                continue
            out.append(Recorded(
                f"{path.name}:{lineno}", doc.get("ts"),
                str(doc.get("decision_id") or doc.get("correlation_id") or lineno),
                inp, str(result.get("decision")), tuple(result.get("reasons") or ()),
            ))
    except (OSError, ValueError) as exc:
        raise ReplayError(str(exc)) from None
    return out


def from_cases(path: Path) -> list[Recorded]:
    from service.policytools.cases import CaseError

    try:
        cases = load_cases(path)
    except CaseError as exc:
        raise ReplayError(str(exc)) from None
    return [Recorded(c.id, None, c.id, c.input, c.decision, c.reasons or ()) for c in cases]


def from_audit(path: Path, since: datetime | None = None) -> list[Recorded]:
    """Approximate inputs from audit records (JSON lines) that carry a decision."""
    out: list[Recorded] = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ReplayError(f"{path}: {exc.strerror}") from None
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
        except ValueError:
            raise ReplayError(f"{path}:{lineno}: not a JSON line") from None
        entry = doc.get("entry", doc) if isinstance(doc, dict) else None
        if not isinstance(entry, dict):
            continue
        decision = entry.get("decision")
        principal = entry.get("principal")
        if not isinstance(decision, dict) or not isinstance(principal, dict):
            continue  # not an authorised run (e.g. AuthN failed before AuthZ)
        ts = entry.get("time") or entry.get("ts") or doc.get("time")
        if not _since_ok(ts if isinstance(ts, str) else None, since):
            continue
        inp = {
            "principal": {"subject_id": principal.get("subject_id"),
                          "kind": principal.get("kind"),
                          "session_id": principal.get("session_id")},
            "action": entry.get("action"),
            "resource": {"id": str(entry.get("resource_hash") or "unknown"),
                         "kind": entry.get("resource_kind") or "unknown"},
            "env": entry.get("env"),
            "context": {"correlation_id": entry.get("correlation_id")},
        }
        out.append(Recorded(
            f"{path.name}:{lineno}", ts if isinstance(ts, str) else None,
            str(decision.get("decision_id") or entry.get("correlation_id") or lineno),
            inp, str(decision.get("result")), tuple(decision.get("reasons") or ()), exact=False,
        ))
    return out


def load_expectations(path: Path) -> list[Expectation]:
    """``expect:`` a list of ``{transition, subject?, action?, env?, count?}``."""
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ReplayError(f"{path}: cannot read: {exc.__class__.__name__}") from None
    items = doc.get("expect") if isinstance(doc, dict) else None
    if not isinstance(items, list):
        raise ReplayError(f"{path}: needs `expect:` with a list of changes")
    out = []
    for k, item in enumerate(items):
        if not isinstance(item, dict) or not isinstance(item.get("transition"), str):
            raise ReplayError(f"{path}: expect[{k}] needs a `transition` (e.g. allow->deny)")
        unknown = set(item) - {"transition", "subject", "action", "env", "count"}
        if unknown:
            raise ReplayError(f"{path}: expect[{k}]: unknown field(s) {sorted(unknown)}")
        count = item.get("count")
        if count is not None and (not isinstance(count, int) or count < 0):
            raise ReplayError(f"{path}: expect[{k}].count must be a non-negative integer")
        out.append(Expectation(item["transition"], str(item.get("subject", "*")),
                               str(item.get("action", "*")), str(item.get("env", "*")), count))
    return out


def replay(
    records: Iterable[Recorded],
    decide: Callable[[Mapping[str, Any]], Decision],
    expectations: list[Expectation] | None = None,
) -> ReplayReport:
    """Decide every record with ``decide`` (the candidate engine) and compare."""
    report = ReplayReport()
    for rec in records:
        report.total += 1
        got = decide(rec.input)
        if got.decision == rec.decision:
            if tuple(got.reasons) == rec.reasons:
                report.same += 1
            else:
                report.same += 1
                report.reasons_only += 1
            continue
        report.changes.append(Change(rec, got.decision, tuple(got.reasons)))
    if expectations is not None:
        counts = [0] * len(expectations)
        for change in report.changes:
            hits = [k for k, e in enumerate(expectations) if e.matches(change)]
            if not hits:
                report.unexpected.append(change)
            for k in hits[:1]:
                counts[k] += 1
        for e, n in zip(expectations, counts, strict=True):
            if e.count is not None and e.count != n:
                report.count_mismatches.append(f"{e.describe()}: expected {e.count}, got {n}")
    return report
