"""``cpctl policy``: evaluate, test, check, lint, cover and replay policies offline, as the
service decides.

Every subcommand (and ``publish``) finds its policies directory with ``policydir.resolve``: an
explicit ``--policies DIR`` (or the positional DIR of ``test``/``lint``), else ``./policies`` of
the working directory, else ``policies.dir`` of the configuration (``--config``,
``CONTROLPLANE_CONFIG``, ``CONTROLPLANE_POLICIES__DIR``), else an error naming both; and it says
which directory it used.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO
from xml.sax.saxutils import escape, quoteattr

import yaml

from service import config as config_mod
from service import limits, rego, schemas
from service.approvals.binding import resource_hash
from service.authz import actions
from service.authz.engine import PolicyEngine
from service.authz.input import validate_input
from service.authz.regotest import (
    DECISION_ENTRYPOINT,
    EXPLAIN_ENTRYPOINT,
    Capture,
    TestReport,
    TestResult,
    discover,
    run_tests_isolated,
)
from service.authz.source import Snapshot, SourceError, read_snapshot
from service.cli import policydir
from service.policytools import coverage
from service.policytools.cases import SCHEMA_HEADER, Case, CaseError, load_cases
from service.policytools.lint import GATING, Problem, lint

__all__ = ["register", "run"]

_FORMATS = ("text", "json", "junit", "github")


def _sub(sub: Any, name: str, help_text: str, examples: str) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = sub.add_parser(
        name, help=help_text, description=help_text,
        epilog="examples:\n" + textwrap.indent(textwrap.dedent(examples).strip(), "  "),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return parser


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``policy`` and its subcommands to a ``cpctl`` subparsers object."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "policy", help="offline policy tooling",
        description="Offline policy tooling: decide, test, check, lint, cover, replay.",
    )
    sub = parser.add_subparsers(dest="policy_command", required=True, metavar="SUBCOMMAND")
    # ``cpctl`` calls ``args.func(args)``; every subcommand writes to ``handler``'s stream.
    parser.set_defaults(func=_to_stdout)

    p = _sub(sub, "eval", "decide one input document exactly as the service would", """
        cpctl policy eval --input examples/decisions/installer/operator-prod.yaml
        cat input.json | cpctl policy eval --input - --format flat
        cpctl policy eval --input case.yaml --explain --fail-on deny
    """)
    p.add_argument("--input", required=True,
                   help="input JSON or YAML file, a decision case file, or - for stdin")
    _dirs(p)
    p.add_argument("--explain", action="store_true",
                   help="show the projected input and the rules that were satisfied")
    p.add_argument("--fail-on", choices=("deny", "require_approval"), default=None,
                   help="exit 1 on this decision (require_approval also fails on deny)")
    p.add_argument("--format", choices=("json", "flat"), default="json")
    p.set_defaults(handler=_eval)

    p = _sub(sub, "test", "run the test_ rules of the *_test.rego modules", """
        cpctl policy test
        cpctl policy test ./policies --run 'review' -v
        cpctl policy test --format junit > policy-tests.xml
        cpctl policy test --coverage --fail-under 90 --coverage-out lcov.info
    """)
    p.add_argument("dir", nargs="?", type=Path, default=None,
                   help="policies directory (same as --policies)")
    _dirs(p)
    _report_flags(p)
    p.add_argument("--run", metavar="REGEX", default=None,
                   help="only the tests whose file:name matches REGEX")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="list passing tests too, with their print output")
    _coverage_flags(p, cases_help="decision cases to include in coverage "
                    "(default ./examples/decisions when it exists)")
    p.set_defaults(handler=_test)

    p = _sub(sub, "check", "run the unit tests and the decision cases (expected vs actual)", """
        cpctl policy check
        cpctl policy check examples/decisions/approvals --policies ./candidate
        cpctl policy check --format junit > policy-cases.xml
        cpctl policy check --coverage
    """)
    p.add_argument("cases", nargs="?", type=Path, default=None,
                   help="a case file or directory (default ./examples/decisions)")
    _dirs(p)
    _report_flags(p)
    p.add_argument("--skip-tests", action="store_true", help="run the decision cases only")
    _coverage_flags(p, cases_help=None)
    p.set_defaults(handler=_check)

    p = _sub(sub, "lint", "compile every module and run the static checks", """
        cpctl policy lint
        cpctl policy lint ./policies --format github
    """)
    p.add_argument("dir", nargs="?", type=Path, default=None,
                   help="policies directory (same as --policies)")
    _dirs(p)
    _report_flags(p)
    p.set_defaults(handler=_lint)

    p = _sub(sub, "case", "scaffold decision cases", """
        cpctl policy case new --subject alice --action installer.run.execute --env prod
        cpctl policy case new --subject bob --action approvals.review --env prod \\
            --owner alice --out examples/decisions/approvals/bob-reviews.yaml
    """)
    case_sub = p.add_subparsers(dest="case_command", required=True, metavar="SUBCOMMAND")
    q = _sub(case_sub, "new", "write a decision case with the boilerplate filled in", """
        cpctl policy case new --subject alice --action installer.run.execute --env prod
        cpctl policy case new --subject alice --action installer.run.execute --env staging \\
            --resource '{"app": "payments", "version": "2.4.0-rc.1"}'
    """)
    q.add_argument("--subject", required=True, help="subject_id (kind from the identities file)")
    q.add_argument("--action", required=True, help="a catalogue action, e.g. storage.list")
    q.add_argument("--env", required=True, help="an environment of the policy data")
    q.add_argument("--kind", choices=("human", "service", "agent"), default=None,
                   help="principal kind when the subject is not in the identities file")
    q.add_argument("--owner", default=None, help="resource owner (ticket actions)")
    q.add_argument("--resource-id", default="r-1")
    q.add_argument("--resource", default=None, metavar="JSON",
                   help="the request's resource as sent (input.resource.value; its hash is "
                   "input.resource.hash), e.g. '{\"app\": \"web\", \"version\": \"1.2.3\"}'")
    q.add_argument("--note", default=None, help="what the case shows (default: generated)")
    q.add_argument("--out", type=Path, default=None, help="write here (default: stdout)")
    _dirs(q)
    q.set_defaults(handler=_case_new)

    p = _sub(sub, "replay", "re-decide recorded decisions with a candidate revision", """
        cpctl policy replay --log .state/decisions.jsonl --policies ./candidate
        cpctl policy replay --log decisions.jsonl --since 2026-01-01T00:00:00Z \\
            --policies ./candidate --expect rollout-expect.yaml --format junit
        cpctl policy replay --cases examples/decisions --audit audit.jsonl --policies ./candidate
    """)
    p.add_argument("--log", type=Path, action="append", default=[], metavar="FILE",
                   help="decision log file (JSON lines; its rotated files are read too)")
    p.add_argument("--cases", type=Path, action="append", default=[], metavar="PATH",
                   help="decision case file or directory")
    p.add_argument("--audit", type=Path, action="append", default=[], metavar="FILE",
                   help="audit records as JSON lines (approximate inputs)")
    p.add_argument("--since", default=None, metavar="TIME",
                   help="only records at or after this time (ISO 8601, e.g. 2026-01-01T00:00:00Z)")
    p.add_argument("--expect", type=Path, default=None, metavar="FILE",
                   help="YAML file listing the intended changes; any other change fails")
    p.add_argument("--examples", type=int, default=3, help="examples shown per group")
    p.add_argument("--format", choices=("text", "json", "junit"), default="text")
    _dirs(p)
    p.set_defaults(handler=_replay)
    return parser


def _dirs(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policies", type=Path, default=None, metavar="DIR",
                   help="policies directory (default: policies.dir of the configuration, "
                   "./policies unless configured)")
    p.add_argument("--data", type=Path, default=None, metavar="DIR",
                   help="data directory (default: POLICIES/data)")
    p.add_argument("--config", default=None, metavar="FILE",
                   help="configuration file to read policies.dir from")


def _report_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--format", choices=_FORMATS, default="text",
                   help="text, json, junit (XML) or github (workflow annotations)")


def _coverage_flags(p: argparse.ArgumentParser, *, cases_help: str | None) -> None:
    p.add_argument("--coverage", action="store_true",
                   help="measure which rule clauses and lines were exercised")
    if cases_help:
        p.add_argument("--cases", type=Path, default=None, metavar="DIR", help=cases_help)
    p.add_argument("--coverage-out", type=Path, default=None, metavar="FILE",
                   help="write the coverage report to this file")
    p.add_argument("--coverage-format", choices=("json", "lcov", "cobertura"), default=None,
                   help="format of --coverage-out (default from its suffix, else json)")
    p.add_argument("--fail-under", type=float, default=None, metavar="PCT",
                   help="exit 1 when rule clause coverage is below PCT")


def run(argv: Sequence[str], out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Parse ``argv`` (without the leading ``policy``) and run it; returns the exit code."""
    parser = argparse.ArgumentParser(prog="cpctl")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["policy", *argv])
    args.err = err or sys.stderr
    return int(args.handler(args, out or sys.stdout))


def _to_stdout(args: argparse.Namespace) -> int:
    args.err = sys.stderr
    return int(args.handler(args, sys.stdout))


# ---- the policies directory ----------------------------------------------------------------


class _Fatal(Exception):
    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


def _resolve(args: argparse.Namespace) -> tuple[Path, Path | None, str]:
    """(policies dir, data dir, where it came from), as ``cpctl serve`` resolves it."""
    explicit = getattr(args, "dir", None) or args.policies
    if getattr(args, "dir", None) is not None and args.policies is not None:
        if Path(args.dir).resolve() != Path(args.policies).resolve():
            raise _Fatal("give the policies directory once (DIR or --policies)")
    try:
        policies, how = policydir.resolve(explicit, args.config)
    except policydir.PolicyDirError as exc:
        raise _Fatal(str(exc)) from None
    return policies, args.data, how


def _header(args: argparse.Namespace, out: TextIO, text_mode: bool) -> tuple[Path, Path | None]:
    policies, data, how = _resolve(args)
    line = f"policies: {policies} ({how})"
    print(line, file=out if text_mode else args.err)
    return policies, data


def _snapshot(policies: Path, data: Path | None) -> Snapshot:
    try:
        return read_snapshot(policies, data)
    except SourceError as exc:
        raise _Fatal(f"error: {exc}", 1) from None


def _guard(handler: Callable[[argparse.Namespace, TextIO], int]) -> Callable[..., int]:
    def run_handler(args: argparse.Namespace, out: TextIO) -> int:
        try:
            return handler(args, out)
        except _Fatal as exc:
            message = str(exc)
            print(message if message.startswith("error") else f"error: {message}", file=out)
            return exc.code

    return run_handler


def _offline_engine(policies: Path, data: Path | None, *, vet_tests: bool) -> PolicyEngine:
    """The engine as the service builds it. ``vet_tests``: vet the revision fully (its tests
    too, in a child process, as a live revision is); else compile and probe it in this process,
    which evaluates in-process anyway (``test``/``check`` run and report the tests)."""
    engine = PolicyEngine(policies, data_dir=data, vet_tests=vet_tests,
                          vet_in_subprocess=vet_tests)
    result = engine.load()
    if not result.ok:
        raise _Fatal(f"error: policy revision rejected: {result.error}", 1)
    return engine


# ---- eval --------------------------------------------------------------------------------


@_guard
def _eval(args: argparse.Namespace, out: TextIO) -> int:
    doc = _read_input(args.input, args.err if args.format != "json" else out)
    if doc is None:
        return 2
    if isinstance(doc, dict) and "input" in doc and "expect" in doc:
        doc = doc["input"]  # a decision case file: evaluate its input
    try:
        validate_input(doc)
    except schemas.ValidationFailed as exc:
        for v in exc.violations:
            print(f"error: input{v.pointer}: {v.message}", file=out)
        return 2
    policies, data = _header(args, out, text_mode=False)
    engine = _offline_engine(policies, data, vet_tests=False)
    decision = engine.decide(doc)
    result: dict[str, Any] = decision.to_dict()
    if args.explain:
        result["explain"] = explain(engine, doc, result)
    if args.format == "flat":
        for key in ("decision", "reasons", "revision", "decision_id"):
            value = result.get(key)
            shown = ",".join(value) if isinstance(value, list) else value
            print(f"{key}={shown}", file=out)
        for key, value in sorted((result.get("approval") or {}).items()):
            print(f"approval.{key}={json.dumps(value)}", file=out)
        if args.explain:
            for line in result["explain"]["satisfied"]:
                print(f"satisfied={line}", file=out)
            for reason, where in result["explain"]["reasons"].items():
                print(f"reason.{reason}={','.join(where)}", file=out)
    else:
        print(json.dumps(result, indent=2, sort_keys=True), file=out)
    if args.fail_on == "deny" and decision.decision == "deny":
        return 1
    if args.fail_on == "require_approval" and decision.decision != "allow":
        return 1
    return 0


def _read_input(source: str, out: TextIO) -> Any:
    name = "stdin" if source == "-" else source
    try:
        text = sys.stdin.read() if source == "-" else Path(source).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        print(f"error: cannot read {name}: {exc.__class__.__name__}", file=out)
        return None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or "not valid JSON or YAML"
        where = f":{mark.line + 1}:{mark.column + 1}" if mark else ""
        print(f"error: {name}{where}: {problem}", file=out)
        return None


def explain(engine: PolicyEngine, doc: Any, result: dict[str, Any]) -> dict[str, Any]:
    """Derived by the engine, not by an ``explain`` rule: the policy is evaluated once more,
    instrumented (coverage.py), to list the rule clauses this decision satisfied, and each
    reason is traced to the satisfied rules whose source names it."""
    projected = engine.project(doc)
    snapshot = _current_snapshot(engine)
    inst = coverage.instrument(snapshot)
    from service.authz.projection import build_projection

    data = build_projection(snapshot.data, engine.environments).rego_data
    saved = os.dup(1)
    try:
        hit, _ = coverage.hits_of_decisions(
            inst, data, [projected], DECISION_ENTRYPOINT, lambda: Capture(saved)
        )
    finally:
        os.close(saved)
    clauses = sorted(
        {(p.file, p.line, p.rule) for i, p in enumerate(inst.points)
         if i in hit and p.kind == "clause"}
    )
    sources = {m.name: m.source for m in snapshot.modules}
    reasons: dict[str, list[str]] = {}
    for reason in result.get("reasons", []):
        needles = [f'"{reason}"']
        if ":" in reason:
            needles.append(f'"{reason.split(":", 1)[0]}"')
        where = []
        for file, line, rule in clauses:
            text = _rule_text(sources.get(file, ""), rule, line)
            if any(n in text for n in needles):
                where.append(f"{file}:{line} {rule}")
        reasons[reason] = where or ["(enforced by the service, not the policy)"]
    out: dict[str, Any] = {
        "input": projected,
        "satisfied": [f"{f}:{ln} {r}" for f, ln, r in clauses],
        "reasons": reasons,
    }
    own = _policy_explain(snapshot, data, projected)
    if own is not None:
        out["explain"] = own
    return out


def _current_snapshot(engine: PolicyEngine) -> Snapshot:
    return read_snapshot(engine.policies_dir, engine.data_dir)


def _rule_text(source: str, rule: str, line: int) -> str:
    """The text of the rule statement ``rule`` that holds the clause at ``line``."""
    from service.authz import regosrc

    info = regosrc.parse_module("m", source)
    candidates = [r for r in info.rules if r.name == rule and r.line <= line]
    return max(candidates, key=lambda r: r.line).text if candidates else ""


def _policy_explain(snapshot: Snapshot, data: Any, projected: Any) -> Any:
    """The policy's own ``explain`` value when it defines one (shown as well, never needed)."""
    try:
        bundle = rego.compile_bundle(snapshot.modules, data, [EXPLAIN_ENTRYPOINT])
        value = bundle.query(EXPLAIN_ENTRYPOINT, projected)
    except (rego.RegoCompileError, rego.RegoEvalError):
        return None
    return None if value is rego.Undefined else value


# ---- test --------------------------------------------------------------------------------


@_guard
def _test(args: argparse.Namespace, out: TextIO) -> int:
    policies, data = _header(args, out, args.format == "text")
    snapshot = _snapshot(policies, data)
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
            raise _Fatal(f"--run: not a regular expression: {exc}") from None
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
        print(_junit("policy-tests", [
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


def _junit(suite: str, rows: list[tuple[str, bool, str, float, str]], error: str = "") -> str:
    failures = sum(1 for r in rows if not r[1])
    out = ['<?xml version="1.0" encoding="UTF-8"?>',
           f'<testsuites name="{suite}" tests="{len(rows)}" failures="{failures}" '
           f'errors="{1 if error else 0}">',
           f'  <testsuite name="{suite}" tests="{len(rows)}" failures="{failures}" '
           f'errors="{1 if error else 0}">']
    if error:
        out.append(f'    <testcase name="revision" classname="{suite}">'
                   f"<error message={quoteattr(error[:200])}>{escape(error)}</error></testcase>")
    for name, passed, text, seconds, output in rows:
        body = "" if passed else (
            f"<failure message={quoteattr(text.splitlines()[0][:200] if text else 'failed')}>"
            f"{escape(text)}</failure>"
        )
        if output.strip():
            body += f"<system-out>{escape(output)}</system-out>"
        out.append(f'    <testcase name={quoteattr(name)} classname="{suite}" '
                   f'time="{seconds:.4f}">{body}</testcase>')
    out += ["  </testsuite>", "</testsuites>"]
    return "\n".join(out)


# ---- coverage ----------------------------------------------------------------------------


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
        engine = _offline_engine(policies, data, vet_tests=False)
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


# ---- check -------------------------------------------------------------------------------


def _load(path: Path) -> list[Case]:
    if not path.exists():
        raise _Fatal(f"decision cases not found: {path}")
    try:
        return load_cases(path)
    except CaseError as exc:
        raise _Fatal(str(exc)) from None


@_guard
def _check(args: argparse.Namespace, out: TextIO) -> int:
    policies, data = _header(args, out, args.format == "text")
    cases_path = args.cases if args.cases is not None else Path("examples/decisions")
    cases = _load(cases_path)
    snapshot = _snapshot(policies, data)
    cov = _Coverage(snapshot) if args.coverage else None
    tests: TestReport | None = None
    test_results: list[TestResult] = []
    if not args.skip_tests and discover(snapshot):
        tests = run_tests_isolated(cov.instrumented.snapshot if cov else snapshot)
        test_results = list(tests.results)
        if cov:
            test_results = cov.take(test_results)
    # The cases run even when a unit test fails: the revision is compiled and probed, not tested.
    engine = _offline_engine(policies, data, vet_tests=False)
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
        print(_junit("policy-check", junit_rows, test_error), file=out)
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


# ---- lint --------------------------------------------------------------------------------


@_guard
def _lint(args: argparse.Namespace, out: TextIO) -> int:
    policies, data = _header(args, out, args.format == "text")
    snapshot = _snapshot(policies, data)
    problems = lint(snapshot)
    count = len(snapshot.all_modules)
    if args.format == "json":
        print(json.dumps({"policies": str(policies), "modules": count,
                          "problems": [p.to_json() for p in problems]}, indent=2), file=out)
    elif args.format == "junit":
        by_file: dict[str, list[Problem]] = {}
        for p in problems:
            by_file.setdefault(p.file, []).append(p)
        rows = [(m.name, m.name not in by_file, "\n".join(str(p) for p in by_file.get(m.name, [])),
                 0.0, "") for m in snapshot.all_modules]
        rows += [(f, False, "\n".join(str(p) for p in ps), 0.0, "")
                 for f, ps in by_file.items() if f not in {m.name for m in snapshot.all_modules}]
        print(_junit("policy-lint", rows), file=out)
    elif args.format == "github":
        for p in problems:
            print(f"::error file={policies / p.file},line={p.line},col={p.col},"
                  f"title={p.code}::{p.message}", file=out)
        print(f"{count} modules, {len(problems)} problem(s)", file=out)
    else:
        for p in problems:
            print(str(p), file=out)
        print(f"{count} modules, {len(problems)} problem(s)", file=out)
    return 1 if problems else 0


# ---- replay ------------------------------------------------------------------------------


@_guard
def _replay(args: argparse.Namespace, out: TextIO) -> int:
    from datetime import UTC, datetime

    from service.policytools import replay as rp

    if not (args.log or args.cases or args.audit):
        raise _Fatal("give at least one of --log, --cases, --audit")
    since = None
    if args.since:
        try:
            since = datetime.fromisoformat(args.since.replace("Z", "+00:00"))
        except ValueError:
            raise _Fatal(f"--since: not an ISO 8601 time: {args.since!r}") from None
        if since.tzinfo is None:
            since = since.replace(tzinfo=UTC)
    policies, data = _header(args, out, args.format == "text")
    try:
        records: list[rp.Recorded] = []
        for path in args.log:
            records += rp.from_log(path, since)
        for path in args.cases:
            records += rp.from_cases(path)
        for path in args.audit:
            records += rp.from_audit(path, since)
        expectations = rp.load_expectations(args.expect) if args.expect else []
    except rp.ReplayError as exc:
        raise _Fatal(str(exc)) from None
    # The candidate is vetted like a live revision (compiled, probed, its own tests run).
    engine = _offline_engine(policies, data, vet_tests=True)
    report = rp.replay(records, engine.decide, expectations)
    if args.format == "json":
        print(json.dumps({"candidate": str(policies), "revision": engine.revision,
                          **report.to_json(args.examples)}, indent=2), file=out)
    elif args.format == "junit":
        rows = [(f"{c.transition} {c.recorded.source} {c.recorded.ref}", c not in
                 report.unexpected, json.dumps(c.to_json()), 0.0, "") for c in report.changes]
        rows += [(f"count {m}", False, m, 0.0, "") for m in report.count_mismatches]
        if not rows:
            rows = [("no decision changes", True, "", 0.0, "")]
        print(_junit("policy-replay", rows), file=out)
    else:
        print(f"candidate revision {engine.revision}: {report.total} decisions replayed, "
              f"{len(report.changes)} would change, {report.reasons_only} change reasons only",
              file=out)

        def line(c: rp.Change, unexpected: bool) -> str:
            r = c.recorded
            return (f"{r.source} {r.ref} {r.subject} {r.input.get('action')} "
                    f"{r.input.get('env')}: {c.transition} {list(r.reasons)} -> "
                    f"{list(c.reasons)}{'' if r.exact else ' (approximate input)'}"
                    f"{'  UNEXPECTED' if unexpected else ''}")

        if report.unexpected:
            # What fails the run comes first, every one of them (not --examples per group).
            print(f"{len(report.unexpected)} change(s) not listed in "
                  f"{args.expect or 'an --expect file'}:", file=out)
            for c in report.unexpected:
                print(f"  {line(c, True)}", file=out)
        for transition, changes in report.groups().items():
            print(f"  {transition}: {len(changes)}", file=out)
            for c in changes[: args.examples]:
                print(f"    {line(c, c in report.unexpected)}", file=out)
        for m in report.count_mismatches:
            print(f"  expected count differs: {m}", file=out)
        if report.unexpected:
            print(f"{len(report.unexpected)} change(s) not listed in "
                  f"{args.expect or 'an --expect file'}", file=out)
    return 0 if report.ok else 1


# ---- case new ----------------------------------------------------------------------------


@_guard
def _case_new(args: argparse.Namespace, out: TextIO) -> int:
    action = actions.ACTIONS.get(args.action)
    if action is None:
        close = [a for a in sorted(actions.ACTIONS) if a.split(".")[0] == args.action.split(".")[0]]
        raise _Fatal(f"unknown action {args.action!r}"
                     + (f"; actions of that area: {', '.join(close)}" if close else ""))
    policies, data = _header(args, out, text_mode=False)
    engine = _offline_engine(policies, data, vet_tests=False)
    snapshot = _snapshot(policies, data)
    envs = snapshot.data.get("environments") or {}
    if isinstance(envs, dict) and envs and args.env not in envs:
        raise _Fatal(f"env {args.env!r} is not in the policy data (environments: "
                     f"{', '.join(sorted(envs))})")
    kind = args.kind or _identity_kind(args, args.subject)
    if kind is None:
        raise _Fatal(f"subject {args.subject!r} is not in the identities file; give --kind")
    method = {"human": "password+totp", "service": "client_credentials", "agent": "delegated"}
    resource: dict[str, Any] = {"id": args.resource_id, "kind": action.resource_kind}
    if args.owner:
        resource["owner"] = args.owner
    if action.mutating:
        resource["hash"] = "sha256:" + "ab" * 32
    if args.resource is not None:
        resource["value"] = _resource_value(args.resource)
        resource["hash"] = resource_hash(resource["value"])
    doc = {
        "principal": {
            "subject_id": args.subject, "kind": kind, "session_id": f"sess-{args.subject}",
            "auth_time": 1767225600, "authn_method": method[kind],
            "step_up": {"verified": True, "at": 1767225900.0, "age_s": 40},
        },
        "action": action.name,
        "resource": resource,
        "env": args.env,
        "context": {
            "correlation_id": f"case-{args.subject}-{args.env}",
            "method": "POST" if action.mutating else "GET", "path": "/api/v1/example",
            "command_hash": None, "time": "2026-01-01T00:05:00Z",
        },
    }
    try:
        validate_input(doc)
    except schemas.ValidationFailed as exc:
        raise _Fatal("; ".join(f"input{v.pointer}: {v.message}" for v in exc.violations)) from None
    decision = engine.decide(doc)
    facts = engine.facts(args.subject, action.name)
    note = args.note or (
        f"{args.subject} ({kind}; roles {', '.join(facts['roles']) or 'none'}) "
        f"{action.name} in {args.env}: {decision.decision} under revision {engine.revision}"
    )
    case = {"note": note, "input": doc,
            "expect": {"decision": decision.decision, "reasons": list(decision.reasons)}}
    text = SCHEMA_HEADER + "\n" + "# expect: the current policy's decision; edit it to what the " \
        "policy should decide\n" + yaml.safe_dump(case, sort_keys=False)
    schemas.validate("policy-case.schema.json", case)
    if args.out is None:
        out.write(text)
        return 0
    if args.out.exists():
        raise _Fatal(f"{args.out} exists; not overwriting it")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out} (expect {decision.decision} {list(decision.reasons)})", file=out)
    return 0


def _resource_value(text: str) -> Any:
    """``--resource``: one JSON value, within the bounds the service reads request bodies by."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise _Fatal(f"--resource: not JSON: {exc}") from None
    try:
        limits.check_json(value)
        limits.check_size(len(json.dumps(value, separators=(",", ":")).encode()))
    except limits.JSONValueRefused as exc:
        raise _Fatal(f"--resource{exc.pointer}: {exc.message}") from None
    return value


def _identity_kind(args: argparse.Namespace, subject: str) -> str | None:
    try:
        cfg = config_mod.load_from_process(args.config)
        doc = yaml.safe_load(cfg.authn.identities.read_text(encoding="utf-8"))
    except (config_mod.ConfigError, OSError, yaml.YAMLError):
        return None
    for entry in (doc or {}).get("identities", []) if isinstance(doc, dict) else []:
        if isinstance(entry, dict) and entry.get("subject_id") == subject:
            kind = entry.get("kind")
            return kind if isinstance(kind, str) else None
    return None
