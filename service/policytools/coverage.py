"""Policy coverage: which rule clauses and body lines the unit tests and decision cases exercise.

regopy has no tracer, so the policy modules are instrumented: each clause of each rule gets a
``print`` marker as its last expression (the clause was *satisfied*: its head was defined by it),
and each body expression a marker before it (the expression was *reached*). Evaluation prints the
markers; the runner captures them per test or per decision.

What is measured (policies/README.md says the same):
- a **clause** is one ``if`` body of a rule (an ``else`` branch with a body counts as its own
  clause), or a rule head without a body (``decision := decide(input)``); it is *covered* when it
  was satisfied at least once. ``default`` rules and body-less ``else`` values are not counted.
- a **line** is the first line of a body expression or of a body-less head; it is *covered* when
  evaluation reached it.
Only policy modules are measured, never ``*_test.rego``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from xml.sax.saxutils import quoteattr

from service import rego
from service.authz import regosrc
from service.authz.source import Snapshot

__all__ = [
    "MARK",
    "CoverageReport",
    "Point",
    "instrument",
    "marks_in",
]

MARK = "@@cov@@"
_MARK_LINE = re.compile(re.escape(MARK) + r" (\d+)")


@dataclass(frozen=True)
class Point:
    """One measured point: ``kind`` is ``clause`` (satisfied) or ``line`` (reached)."""

    file: str
    line: int
    rule: str
    kind: str


@dataclass
class Instrumented:
    snapshot: Snapshot  # modules replaced by their instrumented copies (tests unchanged)
    points: list[Point]


def instrument(snapshot: Snapshot) -> Instrumented:
    """A copy of ``snapshot`` whose policy modules print a marker per clause and per line."""
    points: list[Point] = []
    modules: list[rego.Module] = []

    def mark(file: str, line: int, rule: str, kind: str) -> str:
        points.append(Point(file, line, rule, kind))
        return f'print("{MARK} {len(points) - 1}")'

    for module in snapshot.modules:
        info = regosrc.parse_module(module.name, module.source)
        edits: list[tuple[int, int, str]] = []  # (start, end, replacement)
        for rule in info.rules:
            if rule.is_default:
                continue
            if rule.bodyless:
                head = mark(module.name, rule.line, rule.name, "line")
                fired = mark(module.name, rule.line, rule.name, "clause")
                edits.append((rule.end, rule.end, f" if {{ {head}; {fired} }}"))
                continue
            for body in rule.bodies:
                if not body.exprs:
                    continue
                parts: list[str] = []
                for expr in body.exprs:
                    parts.append(mark(module.name, expr.line, rule.name, "line"))
                    parts.append(expr.text)
                parts.append(mark(module.name, body.line, rule.name, "clause"))
                first, last = body.exprs[0], body.exprs[-1]
                text = "\n".join(parts)
                if not body.braced:
                    text = "{\n" + text + "\n}"
                edits.append((first.start, last.end, text))
        source = module.source
        for start, end, text in sorted(edits, key=lambda e: e[0], reverse=True):
            source = source[:start] + text + source[end:]
        modules.append(rego.Module(module.name, source))
    return Instrumented(
        Snapshot(tuple(modules), snapshot.test_modules, snapshot.data, snapshot.data_files,
                 snapshot.revision),
        points,
    )


def marks_in(text: str) -> tuple[set[int], str]:
    """The marker ids printed in ``text``, and the text without marker lines."""
    ids: set[int] = set()
    kept: list[str] = []
    for line in text.splitlines():
        m = _MARK_LINE.fullmatch(line.strip())
        if m:
            ids.add(int(m.group(1)))
        else:
            kept.append(line)
    return ids, "\n".join(kept) + ("\n" if kept else "")


@dataclass
class CoverageReport:
    points: list[Point]
    hit: set[int] = field(default_factory=set)
    sources: dict[str, str] = field(default_factory=dict)  # measured by: what was run

    def add(self, ids: Iterable[int]) -> None:
        self.hit.update(ids)

    def _kind(self, kind: str) -> list[tuple[int, Point]]:
        return [(i, p) for i, p in enumerate(self.points) if p.kind == kind]

    @staticmethod
    def _pct(covered: int, total: int) -> float:
        return round(100.0 * covered / total, 1) if total else 100.0

    def clause_pct(self) -> float:
        clauses = self._kind("clause")
        return self._pct(sum(1 for i, _ in clauses if i in self.hit), len(clauses))

    def per_file(self) -> dict[str, dict[str, Any]]:
        files: dict[str, dict[str, Any]] = {}
        for kind in ("clause", "line"):
            for i, p in self._kind(kind):
                f = files.setdefault(p.file, {"clauses": [0, 0], "lines": {}, "uncovered": []})
                if kind == "clause":
                    f["clauses"][1] += 1
                    if i in self.hit:
                        f["clauses"][0] += 1
                    else:
                        f["uncovered"].append({"rule": p.rule, "line": p.line})
                else:
                    f["lines"][p.line] = f["lines"].get(p.line, False) or i in self.hit
        return files

    def to_json(self) -> dict[str, Any]:
        files = {}
        total_lines = covered_lines = 0
        for name, f in sorted(self.per_file().items()):
            lines = f["lines"]
            total_lines += len(lines)
            covered_lines += sum(1 for v in lines.values() if v)
            files[name] = {
                "clauses": {"covered": f["clauses"][0], "total": f["clauses"][1],
                            "percent": self._pct(*f["clauses"])},
                "lines": {"covered": sorted(n for n, v in lines.items() if v),
                          "not_covered": sorted(n for n, v in lines.items() if not v),
                          "percent": self._pct(sum(1 for v in lines.values() if v), len(lines))},
                "uncovered_clauses": f["uncovered"],
            }
        clauses = self._kind("clause")
        return {
            "measured": "rule clauses satisfied and body lines reached by the unit tests and "
                        "decision cases (policy modules only)",
            "clauses": {"covered": sum(1 for i, _ in clauses if i in self.hit),
                        "total": len(clauses), "percent": self.clause_pct()},
            "lines": {"covered": covered_lines, "total": total_lines,
                      "percent": self._pct(covered_lines, total_lines)},
            "files": files,
        }

    def text(self) -> str:
        doc = self.to_json()
        out = ["coverage (rule clauses satisfied / body lines reached):"]
        for name, f in doc["files"].items():
            c = f["clauses"]
            out.append(f"  {name}: clauses {c['covered']}/{c['total']} ({c['percent']}%), "
                       f"lines {f['lines']['percent']}%")
            for u in f["uncovered_clauses"]:
                out.append(f"    not covered: {name}:{u['line']} {u['rule']}")
        c, ln = doc["clauses"], doc["lines"]
        out.append(f"  total: clauses {c['covered']}/{c['total']} ({c['percent']}%), "
                   f"lines {ln['covered']}/{ln['total']} ({ln['percent']}%)")
        return "\n".join(out)

    def lcov(self) -> str:
        out: list[str] = []
        for name, f in sorted(self.per_file().items()):
            out += ["TN:policy", f"SF:{name}"]
            for i, p in self._kind("clause"):
                if p.file == name:
                    out.append(f"FN:{p.line},{p.rule}@{p.line}")
                    out.append(f"FNDA:{1 if i in self.hit else 0},{p.rule}@{p.line}")
            out.append(f"FNF:{f['clauses'][1]}")
            out.append(f"FNH:{f['clauses'][0]}")
            lines = f["lines"]
            for n in sorted(lines):
                out.append(f"DA:{n},{1 if lines[n] else 0}")
            out.append(f"LF:{len(lines)}")
            out.append(f"LH:{sum(1 for v in lines.values() if v)}")
            out.append("end_of_record")
        return "\n".join(out) + "\n"

    def cobertura(self) -> str:
        doc = self.to_json()
        rate = doc["lines"]["percent"] / 100
        out = [
            '<?xml version="1.0" ?>',
            f'<coverage line-rate="{rate:.4f}" branch-rate="0" version="1" timestamp="0">',
            "  <packages>",
            f'    <package name="policies" line-rate="{rate:.4f}" branch-rate="0">',
            "      <classes>",
        ]
        for name, f in sorted(self.per_file().items()):
            lines = f["lines"]
            frate = (sum(1 for v in lines.values() if v) / len(lines)) if lines else 1.0
            out.append(f"        <class name={quoteattr(name)} filename={quoteattr(name)} "
                       f'line-rate="{frate:.4f}" branch-rate="0">')
            out.append("          <lines>")
            for n in sorted(lines):
                out.append(f'            <line number="{n}" hits="{1 if lines[n] else 0}"/>')
            out.append("          </lines>")
            out.append("        </class>")
        out += ["      </classes>", "    </package>", "  </packages>", "</coverage>"]
        return "\n".join(out) + "\n"


def hits_of_decisions(
    instrumented: Instrumented, rego_data: Mapping[str, Any], projected: Iterable[Any],
    entrypoint: str, capture: Any,
) -> tuple[set[int], list[Any]]:
    """Evaluate each projected input on the instrumented policy; the markers printed and the
    raw results. ``capture()`` returns an object whose ``read()`` gives what was printed."""
    bundle = rego.compile_bundle(instrumented.snapshot.modules, rego_data, [entrypoint])
    hit: set[int] = set()
    results: list[Any] = []
    for doc in projected:
        cap = capture()
        try:
            results.append(bundle.query(entrypoint, doc))
        except rego.RegoEvalError as exc:
            results.append({"error": str(exc)})
        ids, _ = marks_in(cap.read())
        hit |= ids
    return hit, results


def dumps(report: CoverageReport) -> str:
    return json.dumps(report.to_json(), indent=2, sort_keys=True)
