"""``cpctl policy``: evaluate, test, check and lint policies offline, as the service decides."""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

import yaml

from service import rego, schemas
from service.authz.cases import CaseError, load_cases
from service.authz.engine import DEFAULT_ENVIRONMENTS, PolicyEngine, default_policies_dir
from service.authz.input import validate_input
from service.authz.projection import build_projection
from service.authz.regotest import DECISION_ENTRYPOINT, discover, run_tests_isolated
from service.authz.source import SourceError, locate_errors, read_snapshot

__all__ = ["register", "run"]

_REPO = Path(__file__).resolve().parents[2]
_WITH_INPUT = re.compile(r"\bwith\s+input\b")


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``policy`` (eval, test, check, lint) to a ``cpctl`` subparsers object."""
    parser: argparse.ArgumentParser = subparsers.add_parser("policy", help="offline policy tooling")
    sub = parser.add_subparsers(dest="policy_command", required=True)
    # ``cpctl`` calls ``args.func(args)``; every subcommand writes to ``handler``'s stream.
    parser.set_defaults(func=_to_stdout)

    p = sub.add_parser("eval", help="decide one input document as the service would")
    p.add_argument(
        "--input", required=True, type=Path, help="input JSON/YAML (or a decision case file)"
    )
    _dirs(p)
    p.add_argument(
        "--explain", action="store_true", help="show the projected input and contributing rules"
    )
    p.set_defaults(handler=_eval)

    p = sub.add_parser("test", help="run test_* rules of *_test.rego")
    p.add_argument("dir", nargs="?", type=Path, default=None, help="policies directory")
    p.add_argument("--data", type=Path, default=None, help="data directory (default DIR/data)")
    p.add_argument("-v", "--verbose", action="store_true", help="list passing tests too")
    p.set_defaults(handler=_test)

    p = sub.add_parser("check", help="run decision cases (examples/decisions/)")
    p.add_argument("cases", nargs="?", type=Path, default=_REPO / "examples" / "decisions")
    _dirs(p)
    p.set_defaults(handler=_check)

    p = sub.add_parser("lint", help="compile every module; report file:line:column of errors")
    p.add_argument("dir", nargs="?", type=Path, default=None, help="policies directory")
    p.add_argument("--data", type=Path, default=None)
    p.set_defaults(handler=_lint)
    return parser


def run(argv: Sequence[str], out: TextIO | None = None) -> int:
    """Parse ``argv`` (without the leading ``policy``) and run it; returns the exit code."""
    parser = argparse.ArgumentParser(prog="cpctl")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["policy", *argv])
    return int(args.handler(args, out or sys.stdout))


def _to_stdout(args: argparse.Namespace) -> int:
    return int(args.handler(args, sys.stdout))


def _dirs(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--policies", type=Path, default=None, help="policies directory (default: repo policies/)"
    )
    p.add_argument(
        "--data", type=Path, default=None, help="data directory (default: POLICIES/data)"
    )


def _engine(args: argparse.Namespace, out: TextIO) -> PolicyEngine | None:
    engine = PolicyEngine(
        args.policies or default_policies_dir(), DEFAULT_ENVIRONMENTS, data_dir=args.data
    )
    result = engine.load()
    if not result.ok:
        print(f"error: policy revision rejected: {result.error}", file=out)
        return None
    return engine


def _eval(args: argparse.Namespace, out: TextIO) -> int:
    try:
        doc = yaml.safe_load(args.input.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        print(f"error: cannot read {args.input}: {exc.__class__.__name__}", file=out)
        return 2
    if isinstance(doc, dict) and "input" in doc and "expect" in doc:
        doc = doc["input"]  # a decision case file: evaluate its input
    try:
        validate_input(doc)
    except schemas.ValidationFailed as exc:
        for v in exc.violations:
            print(f"error: input{v.pointer}: {v.message}", file=out)
        return 2
    engine = _engine(args, out)
    if engine is None:
        return 1
    result: dict[str, Any] = engine.decide(doc).to_dict()
    if args.explain:
        result["explain"] = engine.explain(doc)
    print(json.dumps(result, indent=2, sort_keys=True), file=out)
    return 0


def _test(args: argparse.Namespace, out: TextIO) -> int:
    policies = args.dir or default_policies_dir()
    try:
        snapshot = read_snapshot(policies, args.data)
    except SourceError as exc:
        print(f"error: {exc}", file=out)
        return 1
    report = run_tests_isolated(snapshot)
    results = list(report.results)
    if report.error.startswith("policy engine crashed"):
        # Attribute the crash: run each test alone in its own child.
        print(f"warning: {report.error}; re-running tests one by one", file=out)
        results = []
        for case in discover(snapshot):
            one = run_tests_isolated(snapshot, only=case.entrypoint)
            if one.error:
                from service.authz.regotest import TestResult

                results.append(TestResult(case.file, case.name, False, one.error))
            else:
                results.extend(one.results)
    elif report.error:
        print(f"error: {report.error}", file=out)
        return 1
    for r in results:
        if not r.passed:
            print(f"FAIL {r.file}:{r.name}: {r.error}", file=out)
        elif args.verbose:
            print(f"PASS {r.file}:{r.name}", file=out)
    failed = sum(1 for r in results if not r.passed)
    print(f"{len(results) - failed} passed, {failed} failed", file=out)
    return 1 if failed or not results else 0


def _check(args: argparse.Namespace, out: TextIO) -> int:
    try:
        cases = load_cases(args.cases)
    except CaseError as exc:
        print(f"error: {exc}", file=out)
        return 2
    engine = _engine(args, out)
    if engine is None:
        return 1
    rows = []
    for case in cases:
        actual = engine.decide(case.input)
        problem = case.mismatch(actual)
        want = case.decision + (f" {list(case.reasons)}" if case.reasons is not None else "")
        got = f"{actual.decision} {list(actual.reasons)}"
        rows.append((case.id, want, got, "ok" if problem is None else "MISMATCH"))
    widths = [
        max(len(r[i]) for r in [("case", "expected", "actual", "result"), *rows]) for i in range(4)
    ]
    for row in [("case", "expected", "actual", "result"), *rows]:
        print(
            "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip(), file=out
        )
    failed = sum(1 for r in rows if r[3] != "ok")
    print(f"{len(rows) - failed} passed, {failed} failed", file=out)
    return 1 if failed or not rows else 0


def _lint(args: argparse.Namespace, out: TextIO) -> int:
    policies = args.dir or default_policies_dir()
    try:
        snapshot = read_snapshot(policies, args.data)
        data = build_projection(snapshot.data).rego_data
    except SourceError as exc:
        print(f"error: {exc}", file=out)
        return 1
    problems = 0
    sources = {m.name: m.source for m in snapshot.all_modules}
    for module in snapshot.all_modules:
        for lineno, line in enumerate(module.source.splitlines(), 1):
            m = _WITH_INPUT.search(line.split("#", 1)[0])
            if m:
                problems += 1
                print(
                    f"{module.name}:{lineno}:{m.start() + 1}: `with input` crashes regopy 1.5 over "
                    "dependent rules; pass the input to a function instead",
                    file=out,
                )
    try:
        rego.compile_bundle(snapshot.all_modules, data, [DECISION_ENTRYPOINT])
    except rego.RegoCompileError as exc:
        located = locate_errors(str(exc), sources) or []
        for loc in located:
            print(str(loc), file=out)
        if not located:
            print(f"error: {str(exc)[:500]}", file=out)
        problems += max(1, len(located))
    print(f"{len(snapshot.all_modules)} modules, {problems} problem(s)", file=out)
    return 1 if problems else 0
