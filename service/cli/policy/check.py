"""``cpctl policy test`` and ``check``: the unit tests, the decision cases, and their coverage."""

from __future__ import annotations

import argparse
import json
import os
import re
import textwrap
from pathlib import Path
from typing import Any, TextIO

from service.authz import actions
from service.authz.regotest import (
    DECISION_ENTRYPOINT,
    Capture,
    TestReport,
    TestResult,
    discover,
    run_tests_isolated,
)
from service.authz.source import Snapshot
from service.policytools import coverage
from service.policytools.cases import Case, CaseError, load_cases
from service.policytools.lint import GATING, lint

from .common import (
    Fatal,
    coverage_flags,
    dir_flags,
    guard,
    header,
    junit,
    offline_engine,
    read_policies,
    report_flags,
    subcommand,
)


def add(sub: Any) -> None:
    """Add the ``test`` and ``check`` subcommand(s) under ``policy``."""
    p = subcommand(sub, "test", "run the test_ rules of the *_test.rego modules", """
        cpctl policy test
        cpctl policy test ./policies --run 'review' -v
        cpctl policy test --format junit > policy-tests.xml
        cpctl policy test --coverage --fail-under 90 --coverage-out lcov.info
    """)
    p.add_argument("dir", nargs="?", type=Path, default=None,
                   help="policies directory (same as --policies)")
    dir_flags(p)
    report_flags(p)
    p.add_argument("--run", metavar="REGEX", default=None,
                   help="only the tests whose file:name matches REGEX")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="list passing tests too, with their print output")
    coverage_flags(p, cases_help="decision cases to include in coverage "
                    "(default ./examples/decisions when it exists)")
    p.set_defaults(handler=_test)

    p = subcommand(sub, "check", "run the unit tests and the decision cases (expected vs actual)", """
        cpctl policy check
        cpctl policy check examples/decisions/approvals --policies ./candidate
        cpctl policy check --format junit > policy-cases.xml
        cpctl policy check --coverage
    """)
    p.add_argument("cases", nargs="?", type=Path, default=None,
                   help="a case file or directory (default ./examples/decisions)")
    dir_flags(p)
    report_flags(p)
    p.add_argument("--skip-tests", action="store_true", help="run the decision cases only")
    coverage_flags(p, cases_help=None)
    p.set_defaults(handler=_check)


@guard
def _test(args: argparse.Namespace, out: TextIO) -> int:
    policies, data = header(args, out, args.format == "text")
    snapshot = read_policies(policies, data)
    # A rule with an unbound variable or a call to no function is silently undefined: the
    # tests' results would be about something else ("33 passed, 1 failed"). Refuse instead.
    gating = [p for p in lint(snapshot) if p.code in GATING]
    if gating:
        if args.format == "json":
            print(json.dumps({"policies": str(policies), "error": "lint", "passed": 0,
                              "failed": 0, "problems": [p.to_json() for p in gating]},
                             indent=2), file=out)
        else:
            for p in gating:
                print(f"error: {p}", file=out)
            print(f"{len(gating)} problem(s) that make rules silently undefined: fix them "
                  "first (cpctl policy lint); no test was run", file=out)
        return 2
    cases = discover(snapshot)
    if args.run:
        try:
            pattern = re.compile(args.run)
        except re.error as exc:
            raise Fatal(f"--run: not a regular expression: {exc}") from None
        cases = [c for c in cases if pattern.search(f"{c.file}:{c.name}")]
    if not cases:
        what = "matching --run" if args.run else f"in {policies} (test_ rules of *_test.rego)"
        print(f"error: no tests found {what}", file=out)
        return 1
    cov = _Coverage(snapshot) if args.coverage else None
    report = run_tests_isolated(
        cov.instrumented.snapshot if cov else snapshot, only=[c.entrypoint for c in cases]
    )
    results = list(report.results)
    if cov:
        results = cov.take(results)
        case_dir = args.cases if args.cases is not None else Path("examples/decisions")
        if args.cases is not None or case_dir.is_dir():
            cov.add_cases(policies, data, _load(case_dir))
    code = _print_tests(args, out, policies, results, report.error)
    if cov:
        code = max(code, cov.finish(args, out))
    return code


def _print_tests(
    args: argparse.Namespace, out: TextIO, policies: Path, results: list[TestResult], error: str
) -> int:
    failed = [r for r in results if not r.passed]
    if args.format == "json":
        print(json.dumps({
            "policies": str(policies), "error": error or None,
            "passed": len(results) - len(failed), "failed": len(failed),
            "tests": [r.to_json() for r in results],
        }, indent=2), file=out)
    elif args.format == "junit":
        print(junit("policy-tests", [
            (f"{r.file}:{r.name}", r.passed, _failure_text(r), r.duration_ms / 1000, r.output)
            for r in results
        ], error), file=out)
    elif args.format == "github":
        for r in failed:
            line, col = _line_col(r)
            message = _failure_text(r).replace("\n", "%0A")
            print(f"::error file={policies / r.file},line={line},col={col},"
                  f"title=policy test {r.name} failed::{message}", file=out)
        if error:
            print(f"::error title=policy tests::{error}", file=out)
        print(f"{len(results) - len(failed)} passed, {len(failed)} failed", file=out)
    else:
        if error:
            print(f"error: {error}", file=out)
        for r in results:
            if not r.passed:
                print(f"FAIL {r.file}:{r.line} {r.name}", file=out)
                print(textwrap.indent(_failure_text(r), "  "), file=out)
            elif args.verbose:
                print(f"PASS {r.file}:{r.line} {r.name} ({r.duration_ms:.1f} ms)", file=out)
                if r.output.strip():
                    text = "print output:\n" + textwrap.indent(r.output.rstrip(), "  ")
                    print(textwrap.indent(text, "  "), file=out)
        print(f"{len(results) - len(failed)} passed, {len(failed)} failed", file=out)
    return 1 if failed or error or not results else 0


def _failure_text(r: TestResult) -> str:
    lines = [r.error or "failed"]
    for name, value in r.values:
        lines.append(f"  {name} = {value}")
    if r.output.strip():
        lines.append("print output:")
        lines.extend("  " + ln for ln in r.output.rstrip().splitlines()[:50])
    return "\n".join(lines)


def _line_col(r: TestResult) -> tuple[int, int]:
    parts = r.location.split(":")
    if len(parts) >= 3 and parts[-2].isdigit():
        return int(parts[-2]), int(parts[-1])
    if len(parts) == 2 and parts[-1].isdigit():
        return int(parts[-1]), 1
    return r.line, 1


class _Coverage:
    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        self.instrumented = coverage.instrument(snapshot)
        self.report = coverage.CoverageReport(self.instrumented.points)

    def take(self, results: list[TestResult]) -> list[TestResult]:
        """Collect the markers of each test's output; return the results without them."""
        clean = []
        for r in results:
            ids, text = coverage.marks_in(r.output)
            self.report.add(ids)
            clean.append(TestResult(r.file, r.name, r.passed, r.error, r.line, r.location,
                                    r.expression, r.values, text if text.strip() else "",
                                    r.duration_ms))
        self.report.sources["unit tests"] = str(len(results))
        return clean

    def add_cases(self, policies: Path, data: Path | None, cases: list[Case]) -> None:
        engine = offline_engine(policies, data, vet_tests=False)
        projected = [
            engine.project(c.input) for c in cases
            if actions.ACTIONS.get(c.input.get("action")) is not None  # type: ignore[arg-type]
        ]
        from service.authz.projection import build_projection

        rego_data = build_projection(self.snapshot.data, engine.environments).rego_data
        saved = os.dup(1)
        try:
            hit, _ = coverage.hits_of_decisions(
                self.instrumented, rego_data, projected, DECISION_ENTRYPOINT,
                lambda: Capture(saved),
            )
        finally:
            os.close(saved)
        self.report.add(hit)
        self.report.sources["decision cases"] = str(len(cases))

    def finish(self, args: argparse.Namespace, out: TextIO) -> int:
        text_mode = args.format == "text"
        sink = out if text_mode else args.err
        print(self.report.text(), file=sink)
        measured = ", ".join(f"{v} {k}" for k, v in self.report.sources.items())
        print(f"  measured over: {measured}", file=sink)
        if args.coverage_out is not None:
            fmt = args.coverage_format or {".info": "lcov", ".lcov": "lcov",
                                           ".xml": "cobertura"}.get(
                args.coverage_out.suffix, "json")
            body = {"json": coverage.dumps, "lcov": coverage.CoverageReport.lcov,
                    "cobertura": coverage.CoverageReport.cobertura}[fmt](self.report)
            args.coverage_out.write_text(body, encoding="utf-8")
            print(f"  coverage written to {args.coverage_out} ({fmt})", file=sink)
        pct = self.report.clause_pct()
        if args.fail_under is not None and pct < args.fail_under:
            print(f"error: rule clause coverage {pct}% is under {args.fail_under}%", file=out)
            return 1
        return 0


def _load(path: Path) -> list[Case]:
    if not path.exists():
        raise Fatal(f"decision cases not found: {path}")
    try:
        return load_cases(path)
    except CaseError as exc:
        raise Fatal(str(exc)) from None


@guard
def _check(args: argparse.Namespace, out: TextIO) -> int:
    policies, data = header(args, out, args.format == "text")
    cases_path = args.cases if args.cases is not None else Path("examples/decisions")
    cases = _load(cases_path)
    snapshot = read_policies(policies, data)
    cov = _Coverage(snapshot) if args.coverage else None
    tests: TestReport | None = None
    test_results: list[TestResult] = []
    if not args.skip_tests and discover(snapshot):
        tests = run_tests_isolated(cov.instrumented.snapshot if cov else snapshot)
        test_results = list(tests.results)
        if cov:
            test_results = cov.take(test_results)
    # The cases run even when a unit test fails: the revision is compiled and probed, not tested.
    engine = offline_engine(policies, data, vet_tests=False)
    rows = []
    for case in cases:
        actual = engine.decide(case.input)
        problem = case.mismatch(actual)
        want = case.decision + (f" {list(case.reasons)}" if case.reasons is not None else "")
        got = f"{actual.decision} {list(actual.reasons)}"
        rows.append((case.id, want, got, "ok" if problem is None else "MISMATCH", problem or ""))
    if cov:
        cov.add_cases(policies, data, cases)
    failed_cases = sum(1 for r in rows if r[3] != "ok")
    failed_tests = [r for r in test_results if not r.passed]
    test_error = tests.error if tests else ""
    if args.format == "json":
        print(json.dumps({
            "policies": str(policies), "cases_dir": str(cases_path),
            "tests": None if tests is None else {
                "passed": len(test_results) - len(failed_tests), "failed": len(failed_tests),
                "error": test_error or None, "results": [r.to_json() for r in test_results]},
            "cases": [{"case": r[0], "expected": r[1], "actual": r[2], "ok": r[3] == "ok",
                       "problem": r[4] or None} for r in rows],
            "passed": len(rows) - failed_cases, "failed": failed_cases,
        }, indent=2), file=out)
    elif args.format == "junit":
        junit_rows = [(f"{r.file}:{r.name}", r.passed, _failure_text(r), r.duration_ms / 1000,
                       r.output) for r in test_results]
        junit_rows += [(r[0], r[3] == "ok", r[4], 0.0, "") for r in rows]
        print(junit("policy-check", junit_rows, test_error), file=out)
    elif args.format == "github":
        for r in rows:
            if r[3] != "ok":
                print(f"::error file={cases_path / r[0] if cases_path.is_dir() else cases_path},"
                      f"title=decision case {r[0]}::{r[4]}", file=out)
        for t in failed_tests:
            line, col = _line_col(t)
            print(f"::error file={policies / t.file},line={line},col={col},"
                  f"title=policy test {t.name} failed::"
                  f"{_failure_text(t).replace(chr(10), '%0A')}", file=out)
        print(f"{len(rows) - failed_cases} passed, {failed_cases} failed", file=out)
    else:
        if tests is not None:
            if test_error:
                print(f"unit tests: error: {test_error}", file=out)
            for t in failed_tests:
                print(f"FAIL {t.file}:{t.line} {t.name}", file=out)
                print(textwrap.indent(_failure_text(t), "  "), file=out)
            print(f"unit tests: {len(test_results) - len(failed_tests)} passed, "
                  f"{len(failed_tests)} failed", file=out)
        table = [r[:4] for r in rows]
        head = ("case", "expected", "actual", "result")
        widths = [max(len(r[i]) for r in [head, *table]) for i in range(4)]
        for row in [head, *table]:
            print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip(),
                  file=out)
        print(f"{len(rows) - failed_cases} passed, {failed_cases} failed", file=out)
    code = 1 if failed_cases or not rows or failed_tests or test_error else 0
    if cov:
        code = max(code, cov.finish(args, out))
    return code
