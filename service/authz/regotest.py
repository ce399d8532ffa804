"""Runs ``test_*`` rules of ``*_test.rego`` modules, in-process or in a child process.

The child process exists because regopy is native code that can crash the interpreter on some
inputs (``with input as`` over dependent rules segfaults in regopy 1.5): a new revision is vetted
in a child so that a bad policy cannot take a serving worker down. Run as
``python -m service.authz.regotest`` it reads a ``Snapshot`` as JSON on stdin and prints results.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from dataclasses import asdict, dataclass
from typing import Any

from service import rego
from service.authz.projection import build_projection
from service.authz.source import Snapshot, SourceError, locate_errors

__all__ = [
    "DECISION_ENTRYPOINT",
    "EXPLAIN_ENTRYPOINT",
    "TestCase",
    "TestReport",
    "TestResult",
    "discover",
    "run_tests",
    "run_tests_isolated",
    "vet",
]

DECISION_ENTRYPOINT = "controlplane/authz/decision"
EXPLAIN_ENTRYPOINT = "controlplane/authz/explain"

_MARKER = "@@regotest@@ "
_PACKAGE = re.compile(r"^package\s+([A-Za-z_][\w.]*)", re.M)
_TEST_RULE = re.compile(r"^(test_\w+)\s*(?:if\b|:=|=|\{|contains\b)", re.M)

# A probe the vetting child evaluates once, so a revision that crashes at evaluation is rejected
# before a worker loads it (its value is not checked: the policy may decide anything).
_PROBE = {
    "principal": {
        "subject_id": "probe",
        "kind": "human",
        "roles": [],
        "groups": [],
        "grants": [],
        "step_up": {"verified": False, "at": None, "age_s": None},
    },
    "action": "databases.list",
    "resource": {"id": "probe", "kind": "probe"},
    "env": "dev",
    "context": {},
}


@dataclass(frozen=True)
class TestCase:
    """One test rule: its file, package and name (``entrypoint`` is the bundle path)."""

    __test__ = False  # not a pytest class
    file: str
    package: str
    name: str

    @property
    def entrypoint(self) -> str:
        return "/".join([*self.package.split("."), self.name])


@dataclass(frozen=True)
class TestResult:
    __test__ = False
    file: str
    name: str
    passed: bool
    error: str = ""


@dataclass(frozen=True)
class TestReport:
    """All results, or ``error`` when the revision did not compile / the child crashed."""

    __test__ = False
    results: tuple[TestResult, ...]
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error and all(r.passed for r in self.results)

    @property
    def failed(self) -> tuple[TestResult, ...]:
        return tuple(r for r in self.results if not r.passed)

    def summary(self) -> str:
        if self.error:
            return self.error
        bad = self.failed
        if not bad:
            return f"{len(self.results)} passed"
        names = ", ".join(f"{r.file}:{r.name}" for r in bad[:5])
        return f"{len(bad)} of {len(self.results)} policy tests failed: {names}"


def discover(snapshot: Snapshot) -> list[TestCase]:
    """Every ``test_*`` rule (not function) in the snapshot's ``*_test.rego`` modules."""
    cases: list[TestCase] = []
    for module in snapshot.test_modules:
        pkg = _PACKAGE.search(module.source)
        if pkg is None:
            continue
        seen: set[str] = set()
        for m in _TEST_RULE.finditer(module.source):
            if m.group(1) not in seen:  # a rule may have several bodies (incremental definition)
                seen.add(m.group(1))
                cases.append(TestCase(module.name, pkg.group(1), m.group(1)))
    return cases


def run_tests(snapshot: Snapshot, only: str | None = None) -> TestReport:
    """Compile all modules with the revision's Rego data and evaluate each test rule."""
    try:
        data = build_projection(snapshot.data).rego_data
    except SourceError as exc:
        return TestReport((), f"data: {exc}")
    cases = [c for c in discover(snapshot) if only is None or c.entrypoint == only]
    if not cases:
        return TestReport(())
    try:
        bundle = rego.compile_bundle(snapshot.all_modules, data, [c.entrypoint for c in cases])
    except rego.RegoCompileError as exc:
        return TestReport((), "compile: " + _located(str(exc), snapshot))
    results = []
    for case in cases:
        try:
            value = bundle.query(case.entrypoint, {})
            results.append(
                TestResult(
                    case.file,
                    case.name,
                    value is True,
                    "" if value is True else f"result: {_show(value)}",
                )
            )
        except rego.RegoEvalError as exc:
            results.append(TestResult(case.file, case.name, False, f"error: {exc}"))
    return TestReport(tuple(results))


def vet(snapshot: Snapshot) -> TestReport:
    """What a new revision must pass before it serves: compile, one probe decision, all tests."""
    try:
        data = build_projection(snapshot.data).rego_data
    except SourceError as exc:
        return TestReport((), f"data: {exc}")
    try:
        bundle = rego.compile_bundle(snapshot.modules, data, [DECISION_ENTRYPOINT])
        bundle.query(DECISION_ENTRYPOINT, _PROBE)
    except rego.RegoCompileError as exc:
        return TestReport((), "compile: " + _located(str(exc), snapshot))
    except rego.RegoEvalError:
        pass  # evaluation errors fail closed at decision time; only compile errors reject here
    return run_tests(snapshot)


def run_tests_isolated(
    snapshot: Snapshot, *, mode: str = "test", only: str | None = None, timeout: float = 60.0
) -> TestReport:
    """``run_tests`` (mode ``test``) or ``vet`` (mode ``vet``) in a child interpreter."""
    argv = [sys.executable, "-m", "service.authz.regotest", mode] + ([only] if only else [])
    try:
        proc = subprocess.run(  # noqa: S603 (our own interpreter and module)
            argv,
            input=snapshot.to_json(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return TestReport((), f"policy tests timed out after {timeout:.0f}s")
    # The native library prints compile diagnostics to stdout itself: the result is the last
    # line, behind a marker.
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(_MARKER)]
    if proc.returncode != 0 or not lines:
        return TestReport(
            (), f"policy engine crashed ({_exit(proc.returncode)}) while {mode}ing the revision"
        )
    doc = json.loads(lines[-1][len(_MARKER) :])
    return TestReport(tuple(TestResult(**r) for r in doc["results"]), doc["error"])


def _exit(code: int) -> str:
    if code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    return f"exit {code}"


def _located(message: str, snapshot: Snapshot) -> str:
    locs = locate_errors(message, {m.name: m.source for m in snapshot.all_modules})
    return "; ".join(str(loc) for loc in locs) if locs else message[:500]


def _show(value: Any) -> str:
    return "undefined" if value is rego.Undefined else json.dumps(value)[:200]


def _main() -> int:
    mode = sys.argv[1] if len(sys.argv) > 1 else "test"
    snapshot = Snapshot.from_json(sys.stdin.read())
    report = (
        vet(snapshot)
        if mode == "vet"
        else run_tests(snapshot, sys.argv[2] if len(sys.argv) > 2 else None)
    )
    print(
        _MARKER
        + json.dumps({"results": [asdict(r) for r in report.results], "error": report.error})
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
